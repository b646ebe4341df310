#include "config/job_config.hpp"

#include <cmath>
#include <limits>
#include <regex>

#include "common/text.hpp"

namespace keel {

namespace {

int64_t at_least(const ConfigSection& s, const std::string& key, int64_t fallback, int64_t minimum) {
  return s.integer(key, fallback, minimum, std::numeric_limits<int64_t>::max());
}

// Upper bounds that keep the arithmetic built on these keys exact: world sizes, token counts
// (global_batch x seq_len) and byte sizes (grad_bucket_mb << 20) stay far inside int64, and
// timeouts inside a millisecond count of int32.
constexpr int64_t kMaxRanksPerDim = int64_t{1} << 16;
constexpr int64_t kMaxMicrobatches = int64_t{1} << 20;
constexpr int64_t kMaxStagesPerRank = 1024;
constexpr int64_t kMaxPipelineTransfers = int64_t{1} << 30;
constexpr int64_t kMaxTimeoutSeconds = 7 * 24 * 3600;
constexpr int64_t kMaxBucketMb = int64_t{1} << 20;
constexpr int64_t kMaxSteps = int64_t{1} << 40;
constexpr int64_t kMaxSeqLen = int64_t{1} << 24;
constexpr int64_t kMaxGlobalBatch = int64_t{1} << 24;
constexpr int64_t kMaxThreads = 4096;
constexpr int64_t kMaxLayersPerStage = int64_t{1} << 20;
constexpr int64_t kMaxValidationSteps = int64_t{1} << 20;
constexpr size_t kMaxDataSources = 1024;
// Training's global sample positions stay below 2^62, so sample indices from 2^63 on are
// held out for validation (the synthetic source).
constexpr int64_t kMaxTrainingSamples = int64_t{1} << 62;

double in_range(const ConfigSection& s, const std::string& key, double fallback, double lo, double hi, bool hi_open) {
  double value = s.real(key, fallback);
  bool ok = std::isfinite(value) && value >= lo && (hi_open ? value < hi : value <= hi);
  if (!ok) s.invalid(key, cat("must be in [", lo, ", ", hi, hi_open ? ")" : "]", ", got ", value));
  return value;
}

ComponentChoice read_choice(ConfigTree& tree, const std::string& role, const std::string& default_plugin) {
  ConfigSection s = tree.section(role);
  ComponentChoice choice;
  choice.plugin = default_plugin.empty() ? s.required_string("plugin") : s.string("plugin", default_plugin);
  bool is_path = choice.plugin.find('/') != std::string::npos;
  static const std::regex name_pattern("[a-z0-9_]+");
  if (!is_path && !std::regex_match(choice.plugin, name_pattern))
    s.invalid("plugin", cat("plugin names are [a-z0-9_]+ (or a path to a .so), got '", choice.plugin, "'"));
  std::string stem = choice.plugin;
  if (is_path) {
    stem = stem.substr(stem.rfind('/') + 1);
    if (stem.size() > 3 && stem.compare(stem.size() - 3, 3, ".so") == 0) stem.resize(stem.size() - 3);
  }
  // A defaulted component is not written to the resolved configuration: a run's config.toml
  // then swaps its component with `--set clipper.plugin=...` alone, as the job file does.
  choice.component = s.has("component") ? s.string("component", stem) : stem;
  return choice;
}

// [[data.sources]]: each a token file with a positive weight and a name of its own.
std::vector<DataSourceSpec> read_data_sources(const ConfigSection& data) {
  std::vector<DataSourceSpec> sources;
  const std::vector<ConfigSection> tables = data.tables("sources");
  if (tables.size() > kMaxDataSources)
    data.invalid("sources", cat("at most ", kMaxDataSources, " sources, got ", tables.size()));
  static const std::regex name_pattern("[A-Za-z0-9_.-]+");
  for (const ConfigSection& t : tables) {
    DataSourceSpec s;
    s.path = t.required_string("path");
    if (s.path.empty()) t.invalid("path", "must name a token file");
    if (!t.has("weight"))
      t.invalid("weight", "missing: each source needs its share of the samples (a positive number)");
    s.weight = t.real("weight", 1.0);
    if (!(s.weight > 0)) t.invalid("weight", cat("must be positive, got ", s.weight));
    // Unnamed: the file's name without its folder and extension.
    std::string stem = s.path.substr(s.path.rfind('/') + 1);
    if (const size_t dot = stem.rfind('.'); dot != std::string::npos && dot > 0) stem.resize(dot);
    s.name = t.string("name", stem);
    if (!std::regex_match(s.name, name_pattern))
      t.invalid("name", cat("use letters, digits, '_', '.', '-' only, got '", s.name, "'",
                            t.has("name") ? "" : " (from the path; set name = ...)"));
    for (const DataSourceSpec& other : sources)
      if (other.name == s.name)
        t.invalid("name", cat("'", s.name, "' names another source too (", other.path, "); names must differ"));
    sources.push_back(std::move(s));
  }
  return sources;
}

// [profiling]; after [job] and [training]. The folder stays inside the run folder.
ProfilingSection read_profiling(ConfigTree& tree, const JobConfig& c) {
  ConfigSection s = tree.section("profiling");
  ProfilingSection p;
  p.enable = s.boolean("enable", false);
  const std::vector<int64_t> steps = s.integers("steps", {p.first, p.last});
  if (steps.size() != 2 || steps[0] < 1 || steps[1] < steps[0] || steps[1] > kMaxSteps)
    s.invalid("steps", "must be [FIRST, LAST], two steps with 1 <= FIRST <= LAST (the window profiled, both included)");
  p.first = steps[0];
  p.last = steps[1];
  p.interval = s.integer("interval", 0, 0, kMaxSteps);
  if (p.interval > 0 && p.interval <= p.last - p.first)
    s.invalid("interval",
              cat("must exceed the window's length: the window [", p.first, ", ", p.last,
                  "] repeats every `interval` steps, so it must be 0 (once) or more than ", p.last - p.first));
  if (p.enable && p.first > c.training.steps)
    s.invalid("steps", cat("the window starts at step ", p.first,
                           ", after the run's last (training.steps = ", c.training.steps, ")"));
  const std::string folder = s.string("folder", "profiles");
  static const std::regex inside("[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*");
  bool ok = std::regex_match(folder, inside);
  for (size_t at = 0, end = 0; ok && at <= folder.size(); at = end + 1) {
    end = std::min(folder.find('/', at), folder.size());
    const std::string part = folder.substr(at, end - at);
    ok = part != "." && part != "..";
  }
  if (!ok)
    s.invalid("folder", cat("must be a relative path inside the run folder (letters, digits, '_', '-', '.'; no '..'), "
                            "got '",
                            folder, "'"));
  p.folder = c.job.run_dir + "/" + folder;
  return p;
}

// [validation]; after [training], [parallelism] and [data], whose values it defaults to and checks against.
ValidationSection read_validation(ConfigTree& tree, const JobConfig& c) {
  ConfigSection s = tree.section("validation");
  ValidationSection v;
  v.interval = s.integer("interval", 0, 0, kMaxSteps);
  v.steps = s.integer("steps", 1, 1, kMaxValidationSteps);
  v.data = s.string("data", "");
  v.source = s.string("source", "");
  v.split = in_range(s, "split", 0.0, 0.0, 1.0, /*hi_open=*/true);
  v.split_block = s.integer("split_block", 8192, 1, kMaxSeqLen);
  v.global_batch = s.integer("global_batch", c.training.global_batch, 1, kMaxGlobalBatch);
  v.seq_len = s.integer("seq_len", c.training.seq_len, 1, kMaxSeqLen);
  const int64_t ranks_per_batch = int64_t{c.parallelism.dp} * c.parallelism.microbatches;
  if (v.global_batch % ranks_per_batch != 0)
    s.invalid("global_batch",
              cat("must be divisible by dp x microbatches = ", ranks_per_batch, ", got ", v.global_batch));
  if (!v.data.empty() && v.split > 0)
    s.invalid("split", "choose one: validation.data names a file to evaluate on, split holds out part of data.path");
  if (v.split > 0 && c.data.source != "tokens")
    s.invalid("split",
              "applies to data.source = \"tokens\"; the synthetic source evaluates on samples training never draws");
  if (!v.source.empty()) {
    std::string names;
    bool known = false;
    for (const DataSourceSpec& d : c.data.sources) {
      names += (names.empty() ? "" : ", ") + d.name;
      known = known || d.name == v.source;
    }
    if (c.data.sources.empty())
      s.invalid("source", "names one of [[data.sources]], and this job has none (data.path is one file)");
    if (!known) s.invalid("source", cat("'", v.source, "' is not one of [[data.sources]] (", names, ")"));
    if (!v.data.empty())
      s.invalid("source", "choose one: validation.data names a file, source one of [[data.sources]]");
    if (v.split == 0) s.invalid("source", "evaluates on that source's held-out share: it needs validation.split > 0");
  }
  if (v.interval > 0 && c.data.source == "tokens" && v.data.empty() && v.split == 0)
    s.invalid("interval", cat("evaluating needs held-out data: set validation.split (a share of ",
                              c.data.sources.empty() ? c.data.path : std::string("each of [[data.sources]]"),
                              " training never sees) or validation.data (a token file)"));
  return v;
}

}  // namespace

JobConfig read_job_config(ConfigTree& tree, int world_size, bool cuda_available) {
  JobConfig c;

  ConfigSection job = tree.section("job");
  c.job.name = job.string("name", "keel");
  static const std::regex job_name("[A-Za-z0-9_.-]+");
  if (!std::regex_match(c.job.name, job_name)) job.invalid("name", "use letters, digits, '_', '.', '-' only");
  c.job.run_dir = job.string("run_dir", "runs/" + c.job.name);

  c.model = read_choice(tree, "model", "");
  c.clipper = read_choice(tree, "clipper", "norm_clipper");

  ConfigSection par = tree.section("parallelism");
  c.parallelism.pp = par.integer_as<int>("pp", 1, 1, kMaxRanksPerDim);
  c.parallelism.dp = par.integer_as<int>("dp", 1, 1, kMaxRanksPerDim);
  c.parallelism.ep = par.integer_as<int>("ep", 1, 1, kMaxRanksPerDim);
  c.parallelism.schedule = par.choice("schedule", "1f1b", {"1f1b", "gpipe", "interleaved_1f1b", "zb_h1", "zbv"});
  c.parallelism.microbatches = par.integer_as<int>("microbatches", 1, 1, kMaxMicrobatches);
  c.parallelism.stages_per_rank = par.integer_as<int>("stages_per_rank", 1, 1, kMaxStagesPerRank);
  if (c.parallelism.schedule == "interleaved_1f1b") {
    if (c.parallelism.stages_per_rank < 2)
      par.invalid("stages_per_rank",
                  cat("interleaved_1f1b holds 2 or more stages per rank, got ", c.parallelism.stages_per_rank));
    if (c.parallelism.pp < 2) par.invalid("pp", cat("interleaved_1f1b needs pp >= 2, got ", c.parallelism.pp));
    if (c.parallelism.microbatches % c.parallelism.pp != 0)
      par.invalid("microbatches", cat("interleaved_1f1b needs a multiple of pp = ", c.parallelism.pp, ", got ",
                                      c.parallelism.microbatches));
  } else if (c.parallelism.schedule == "zbv") {
    if (c.parallelism.stages_per_rank != 2)
      par.invalid("stages_per_rank", cat("zbv holds 2 stages per rank in a V (set stages_per_rank = 2), got ",
                                         c.parallelism.stages_per_rank));
    if (c.parallelism.pp < 2) par.invalid("pp", cat("zbv needs pp >= 2, got ", c.parallelism.pp));
  } else if (c.parallelism.stages_per_rank != 1) {
    par.invalid("stages_per_rank",
                cat("only schedule = \"interleaved_1f1b\" or \"zbv\" holds several stages per rank; \"",
                    c.parallelism.schedule, "\" holds 1, got ", c.parallelism.stages_per_rank));
  }
  c.parallelism.timeout_s = par.integer_as<int>("timeout_s", 300, 1, kMaxTimeoutSeconds);
  c.parallelism.grad_bucket_mb = par.integer("grad_bucket_mb", 25, 0, kMaxBucketMb);
  c.parallelism.overlap_grad_reduce = par.boolean("overlap_grad_reduce", true);
  c.parallelism.shard_optimizer = par.boolean("shard_optimizer", false);
  c.parallelism.reduce_scatter_grads = par.boolean("reduce_scatter_grads", true);
  c.parallelism.layers_per_stage = par.integers("layers_per_stage", {});
  for (int64_t layers : c.parallelism.layers_per_stage)
    if (layers < 0 || layers > kMaxLayersPerStage)
      par.invalid("layers_per_stage", cat("each count must be in [0, ", kMaxLayersPerStage, "], got ", layers));
  const int64_t virtual_stages = int64_t{c.parallelism.pp} * c.parallelism.stages_per_rank;
  if (!c.parallelism.layers_per_stage.empty() &&
      c.parallelism.layers_per_stage.size() != static_cast<size_t>(virtual_stages))
    par.invalid("layers_per_stage",
                c.parallelism.stages_per_rank == 1
                    ? cat("lists ", c.parallelism.layers_per_stage.size(), " stage(s), but pp = ", c.parallelism.pp)
                    : cat("lists ", c.parallelism.layers_per_stage.size(),
                          " stage(s), but pp x stages_per_rank = ", virtual_stages));
  // Pipeline transfers are tagged 2 (stage x microbatches + microbatch) + 1 at most, in an int.
  if (virtual_stages * c.parallelism.microbatches > kMaxPipelineTransfers)
    par.invalid("microbatches",
                cat("pp x stages_per_rank x microbatches = ", virtual_stages, " x ", c.parallelism.microbatches,
                    " exceeds ", kMaxPipelineTransfers, ", the pipeline transfers one step can tell apart"));
  const int64_t layout_ranks = int64_t{c.parallelism.pp} * c.parallelism.dp;
  if (world_size > 0 && layout_ranks != world_size)
    par.invalid(c.parallelism.dp != 1 || !par.has("pp") ? "dp" : "pp",
                cat("pp x dp = ", c.parallelism.pp, " x ", c.parallelism.dp, " = ", layout_ranks, ", but the job runs ",
                    world_size, " rank(s) (WORLD_SIZE)"));
  if (c.parallelism.dp % c.parallelism.ep != 0)
    par.invalid("ep", cat("ep must divide dp; ep = ", c.parallelism.ep, ", dp = ", c.parallelism.dp));

  ConfigSection tr = tree.section("training");
  c.training.steps = tr.integer("steps", 100, 1, kMaxSteps);
  c.training.seq_len = tr.integer("seq_len", 128, 1, kMaxSeqLen);
  c.training.global_batch = tr.integer("global_batch", 8, 1, kMaxGlobalBatch);
  int64_t seed = at_least(tr, "seed", 0, 0);
  c.training.seed = static_cast<uint64_t>(seed);
  c.training.dtype = tr.choice("dtype", "fp32", {"fp32", "bf16"});
  c.training.recompute = tr.choice("recompute", "none", {"none", "selective", "lean", "full"});
  // A fully or leanly recomputed region holds weights: it reruns its forward and its whole
  // backward pass inside one autograd node, which has no separate weight pass to defer.
  if ((c.training.recompute == "full" || c.training.recompute == "lean") &&
      (c.parallelism.schedule == "zb_h1" || c.parallelism.schedule == "zbv"))
    tr.invalid("recompute",
               cat("\"", c.training.recompute, "\" cannot run under parallelism.schedule = \"", c.parallelism.schedule,
                   "\", which splits each backward pass into input and weight passes; use "
                   "\"selective\" or another schedule"));
  c.training.device = tr.choice("device", "cpu", {"auto", "cpu", "cuda"});
  if (c.training.device == "auto") c.training.device = cuda_available ? "cuda" : "cpu";
  if (c.training.device == "cuda" && !cuda_available)
    tr.invalid("device", "'cuda' was asked for, but this LibTorch sees no CUDA device (use \"auto\" or \"cpu\")");
  c.training.threads = tr.integer_as<int>("threads", 0, 0, kMaxThreads);
  c.training.flush_denormal = tr.boolean("flush_denormal", true);
  c.training.cpu_gemm = tr.choice("cpu_gemm", "onednn", {"onednn", "blas"});
  // LibTorch has one switch for all of oneDNN, and CPU autocast's bf16 products run on it.
  if (c.training.cpu_gemm == "blas" && c.training.dtype == "bf16" && c.training.device == "cpu")
    tr.invalid("cpu_gemm",
               "\"blas\" switches LibTorch's oneDNN off, and with it the bf16 CPU products of "
               "training.dtype = \"bf16\" (ten times slower without it); use \"onednn\"");
  c.training.device_memory_gb = in_range(tr, "device_memory_gb", 0, 0, 65536, false);
  int64_t ranks_per_step = int64_t{c.parallelism.dp} * c.parallelism.microbatches;
  if (c.training.global_batch % ranks_per_step != 0)
    tr.invalid("global_batch",
               cat("must be divisible by dp x microbatches = ", ranks_per_step, ", got ", c.training.global_batch));

  if (c.training.steps > kMaxTrainingSamples / c.training.global_batch)
    tr.invalid("steps", cat("steps x global_batch must stay below 2^62, got ", c.training.steps, " x ",
                            c.training.global_batch));

  ConfigSection opt = tree.section("optimizer");
  opt.choice("name", "adamw", {"adamw"});
  c.optimizer.lr = opt.real("lr", 3e-4);
  if (!(c.optimizer.lr > 0) || !std::isfinite(c.optimizer.lr))
    opt.invalid("lr", cat("must be positive, got ", c.optimizer.lr));
  std::vector<double> betas = opt.reals("betas", {0.9, 0.95});
  if (betas.size() != 2 || !(betas[0] >= 0 && betas[0] < 1) || !(betas[1] >= 0 && betas[1] < 1))
    opt.invalid("betas", "must be two numbers in [0, 1), e.g. [0.9, 0.95]");
  c.optimizer.beta1 = betas[0];
  c.optimizer.beta2 = betas[1];
  c.optimizer.eps = opt.real("eps", 1e-8);
  if (!(c.optimizer.eps > 0)) opt.invalid("eps", cat("must be positive, got ", c.optimizer.eps));
  c.optimizer.weight_decay = in_range(opt, "weight_decay", 0.1, 0.0, 1.0, false);
  c.optimizer.no_decay = opt.strings("no_decay", {"*norm*", "*bias"});
  c.optimizer.graph_capture = opt.choice("graph_capture", "auto", {"auto", "on", "off"});
  if (c.optimizer.graph_capture == "on" && c.training.device != "cuda")
    opt.invalid("graph_capture",
                "\"on\" needs training.device = \"cuda\"; CPU runs the step program eagerly (use \"auto\")");
  c.optimizer.graph_warmup = at_least(opt, "graph_warmup", 3, 1);
  c.optimizer.graph_validate = at_least(opt, "graph_validate", 0, 0);

  ConfigSection lr = tree.section("lr_scheduler");
  c.lr_scheduler.warmup_steps = at_least(lr, "warmup_steps", 0, 0);
  if (c.lr_scheduler.warmup_steps > c.training.steps)
    lr.invalid("warmup_steps", cat("exceeds training.steps (", c.training.steps, ")"));
  c.lr_scheduler.decay = lr.choice("decay", "cosine", {"cosine", "linear", "constant"});
  c.lr_scheduler.min_lr_ratio = in_range(lr, "min_lr_ratio", 0.1, 0.0, 1.0, false);

  ConfigSection data = tree.section("data");
  c.data.sources = read_data_sources(data);
  c.data.source = data.choice("source", c.data.sources.empty() ? "synthetic" : "tokens", {"synthetic", "tokens"});
  if (c.data.source == "tokens") {
    if (c.data.sources.empty())
      c.data.path = data.required_string("path");
    else if (data.has("path"))
      data.invalid("path", "choose one: data.path names one token file, [[data.sources]] a mixture");
    if (data.has("branching")) data.invalid("branching", "applies to source = \"synthetic\" only");
  } else {
    if (!c.data.sources.empty())
      data.invalid("sources",
                   "[[data.sources]] are token files: they need source = \"tokens\" (its default with them)");
    if (data.has("path")) data.invalid("path", "applies to source = \"tokens\" only");
    c.data.branching = at_least(data, "branching", 4, 1);
  }
  c.data.seed = static_cast<uint64_t>(at_least(data, "seed", seed, 0));
  // Unset, the default follows the source (the trainer reads whether it records an EOS id).
  if (data.has("documents")) c.data.documents = data.choice("documents", "eos", {"eos", "none"});
  if (c.data.documents == "eos" && c.data.source == "synthetic")
    data.invalid("documents", "\"eos\" needs a source with an EOS id; the synthetic source has no documents");
  c.data.attention = data.choice("attention", "causal", {"causal", "block_causal"});
  if (c.data.attention == "block_causal" && c.data.source == "synthetic")
    data.invalid("attention",
                 "\"block_causal\" needs documents, and the synthetic source has none (use a token file "
                 "with an EOS id, or \"causal\")");
  if (c.data.attention == "block_causal" && c.data.documents == "none")
    data.invalid("attention", "\"block_causal\" needs documents, and data.documents = \"none\" turns them off");
  c.data.reset_positions = data.boolean("reset_positions", false);
  if (c.data.reset_positions && c.data.attention != "block_causal")
    data.invalid("reset_positions",
                 "true needs data.attention = \"block_causal\" (allowed: \"causal\", "
                 "\"block_causal\"; positions restart only where documents are masked apart)");

  ConfigSection ck = tree.section("checkpoint");
  c.checkpoint.save_final = ck.boolean("save_final", true);
  c.checkpoint.dir = ck.string("dir", c.job.run_dir + "/checkpoints");
  c.checkpoint.interval = at_least(ck, "interval", 0, 0);
  c.checkpoint.keep_latest = at_least(ck, "keep_latest", 0, 0);
  c.checkpoint.keep_best = at_least(ck, "keep_best", 0, 0);
  c.checkpoint.async = ck.boolean("async", false);
  c.checkpoint.load = ck.string_or_integer("load", "");
  static const std::regex load_spec("|latest|\\d+|.*/.*|step-\\d+");
  if (!std::regex_match(c.checkpoint.load, load_spec))
    ck.invalid("load", cat("must be \"latest\", a step number or a path to a checkpoint folder, got '",
                           c.checkpoint.load, "'"));
  c.checkpoint.load_model_only = ck.boolean("load_model_only", false);
  if (c.checkpoint.load_model_only && c.checkpoint.load.empty()) ck.invalid("load_model_only", "needs checkpoint.load");
  c.checkpoint.on_save_failure = ck.choice("on_save_failure", "stop", {"stop", "continue"});

  c.validation = read_validation(tree, c);
  if (c.checkpoint.keep_best > 0 && c.validation.interval == 0)
    ck.invalid("keep_best", "ranks checkpoints by val_loss and needs validation.interval > 0");
  // A checkpoint ranks only by an evaluation of its own weights, which runs at multiples of
  // validation.interval (and after the last step).
  if (c.checkpoint.keep_best > 0 && c.checkpoint.interval > 0 && c.checkpoint.interval % c.validation.interval != 0)
    ck.invalid("keep_best",
               cat("ranks checkpoints by the val_loss of their own step: checkpoint.interval (", c.checkpoint.interval,
                   ") must be a multiple of validation.interval (", c.validation.interval, ")"));

  ConfigSection met = tree.section("metrics");
  c.metrics.log_interval = at_least(met, "log_interval", 10, 1);
  c.metrics.jsonl = met.boolean("jsonl", true);
  c.metrics.tensorboard = met.boolean("tensorboard", false);

  c.profiling = read_profiling(tree, c);

  ConfigSection dbg = tree.section("debug");
  c.debug.replica_check_interval = at_least(dbg, "replica_check_interval", 0, 0);
  c.debug.perturb_replicas = dbg.choice("perturb_replicas", "none", {"none", "before_post_init", "after_post_init"});
  c.debug.dump_state = dbg.boolean("dump_state", false);
  c.debug.crash_in_checkpoint = at_least(dbg, "crash_in_checkpoint", 0, 0);
  c.debug.nan_grad_step = at_least(dbg, "nan_grad_step", 0, 0);
  c.debug.nan_grad_rank = dbg.integer("nan_grad_rank", 0, 0, kMaxRanksPerDim * kMaxRanksPerDim - 1);
  c.debug.nan_grad_param = dbg.string("nan_grad_param", "*");
  c.debug.crash_in_checkpoint_phase =
      dbg.choice("crash_in_checkpoint_phase", "written",
                 {"written", "gathered", "manifest", "displaced", "renamed", "latest", "pruned"});
  c.debug.fail_checkpoint_write = at_least(dbg, "fail_checkpoint_write", 0, 0);
  c.debug.fail_checkpoint_write_rank = at_least(dbg, "fail_checkpoint_write_rank", -1, -1);
  c.debug.fail_checkpoint_commit = at_least(dbg, "fail_checkpoint_commit", 0, 0);
  return c;
}

}  // namespace keel
