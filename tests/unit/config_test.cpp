// Malformed job files: every refusal names the key and its position (file:line).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.hpp"
#include "config/config_tree.hpp"
#include "config/job_config.hpp"
#include "test_support.hpp"
#include "train/job.hpp"

namespace keel {
namespace {

// The message of the InputError a host-only read of `text` raises, or "" when it is accepted.
std::string host_error(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    ConfigTree tree = ConfigTree::from_string(text, "job.toml");
    for (const std::string& o : overrides) tree.set(o);
    read_job_config(tree, 1, /*cuda_available=*/false);
    tree.check_all_read();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// The message of the InputError building the whole job raises (plugins included), or "".
std::string job_error(const std::string& text) {
  test::TempDir dir;
  test::write_file(dir / "job.toml", text);
  RunOptions options;
  options.config_path = dir / "job.toml";
  options.plugin_dirs = {test::plugin_dir()};
  try {
    Job job(options, /*meta=*/true);
  } catch (const InputError& e) {
    std::string message = e.what();
    // Name the file as the host-only cases do.
    for (size_t at; (at = message.find(options.config_path)) != std::string::npos;)
      message.replace(at, options.config_path.size(), "job.toml");
    return message;
  }
  return "";
}

const std::string kModel = "[model]\nplugin = \"llama3\"\n";  // lines 1-2

struct Case {
  const char* name;
  std::string text;
  std::string where;  // "job.toml:<line>" or the --set origin
  std::string key;    // the dotted key or section named
  std::string why;    // a phrase of the reason
  std::vector<std::string> overrides = {};
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class MalformedConfig : public ::testing::TestWithParam<Case> {};

TEST_P(MalformedConfig, NamesKeyAndLine) {
  const Case& c = GetParam();
  std::string message = host_error(c.text, c.overrides);
  ASSERT_FALSE(message.empty()) << c.name << " was accepted";
  EXPECT_NE(message.find(c.where), std::string::npos) << message;
  EXPECT_NE(message.find(c.key), std::string::npos) << message;
  EXPECT_NE(message.find(c.why), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(
    HostSections, MalformedConfig,
    ::testing::Values(
        Case{"steps_is_a_string", kModel + "[training]\nsteps = \"ten\"\n", "job.toml:4", "training.steps",
             "expected an integer, found a string"},
        Case{"steps_zero", kModel + "[training]\nsteps = 0\n", "job.toml:4", "training.steps", "at least 1"},
        Case{"unknown_key", kModel + "[training]\nsteps = 5\nstpes = 5\n", "job.toml:5", "training.stpes",
             "unknown key"},
        Case{"unknown_section", kModel + "\n[trainig]\nsteps = 5\n", "job.toml:4", "[trainig]", "unknown section"},
        Case{"pp_exceeds_world", kModel + "[parallelism]\npp = 2\n", "job.toml:4", "parallelism.pp", "WORLD_SIZE"},
        Case{"ep_does_not_divide_dp", kModel + "[parallelism]\nep = 2\n", "job.toml:4", "parallelism.ep",
             "ep must divide dp"},
        Case{"batch_not_divisible", kModel + "[parallelism]\nmicrobatches = 4\n[training]\nglobal_batch = 6\n",
             "job.toml:6", "training.global_batch", "divisible by dp x microbatches = 4"},
        Case{"negative_lr", kModel + "[optimizer]\nlr = -1.0\n", "job.toml:4", "optimizer.lr", "must be positive"},
        Case{"one_beta", kModel + "[optimizer]\nbetas = [0.9]\n", "job.toml:4", "optimizer.betas", "two numbers"},
        Case{"beta_not_a_number", kModel + "[optimizer]\nbetas = [0.9, \"x\"]\n", "job.toml:4", "optimizer.betas",
             "expected an array of numbers"},
        Case{"unknown_decay", kModel + "[lr_scheduler]\ndecay = \"exp\"\n", "job.toml:4", "lr_scheduler.decay",
             "must be one of cosine, linear, constant"},
        Case{"warmup_exceeds_steps", kModel + "[training]\nsteps = 10\n[lr_scheduler]\nwarmup_steps = 50\n",
             "job.toml:6", "lr_scheduler.warmup_steps", "exceeds training.steps"},
        Case{"token_source_without_path", kModel + "[data]\nsource = \"tokens\"\n", "job.toml:3", "data.path",
             "required key is missing"},
        Case{"documents_unknown", kModel + "[data]\ndocuments = \"lines\"\n", "job.toml:4", "data.documents",
             "must be one of eos, none"},
        Case{"documents_eos_of_synthetic_data", kModel + "[data]\ndocuments = \"eos\"\n", "job.toml:4",
             "data.documents", "the synthetic source has no documents"},
        Case{"attention_unknown", kModel + "[data]\nattention = \"sliding\"\n", "job.toml:4", "data.attention",
             "must be one of causal, block_causal"},
        Case{"attention_block_causal_of_synthetic_data", kModel + "[data]\nattention = \"block_causal\"\n",
             "job.toml:4", "data.attention", "the synthetic source has none"},
        Case{"attention_block_causal_without_documents",
             kModel +
                 "[data]\nsource = \"tokens\"\npath = \"x.tok\"\ndocuments = \"none\"\nattention = \"block_causal\"\n",
             "job.toml:7", "data.attention", "data.documents = \"none\" turns them off"},
        Case{"reset_positions_without_block_causal", kModel + "[data]\nreset_positions = true\n", "job.toml:4",
             "data.reset_positions", "needs data.attention = \"block_causal\""},
        Case{"no_model_plugin", "[training]\nsteps = 3\n[model]\nflavor = \"x\"\n", "job.toml:3", "model.plugin",
             "required key is missing"},
        Case{"bad_plugin_name", "[model]\nplugin = \"Llama-3\"\n", "job.toml:2", "model.plugin", "[a-z0-9_]+"},
        Case{"log_interval_zero", kModel + "[metrics]\nlog_interval = 0\n", "job.toml:4", "metrics.log_interval",
             "at least 1"},
        Case{"unknown_device", kModel + "[training]\ndevice = \"tpu\"\n", "job.toml:4", "training.device",
             "must be one of auto, cpu, cuda"},
        Case{"unknown_cpu_gemm", kModel + "[training]\ncpu_gemm = \"mkl\"\n", "job.toml:4", "training.cpu_gemm",
             "must be one of onednn, blas"},
        Case{"blas_gemm_with_bf16_on_cpu", kModel + "[training]\ndtype = \"bf16\"\ncpu_gemm = \"blas\"\n", "job.toml:5",
             "training.cpu_gemm", "switches LibTorch's oneDNN off"},
        Case{"cuda_without_gpu", kModel + "[training]\ndevice = \"cuda\"\n", "job.toml:4", "training.device",
             "no CUDA device"},
        Case{"graph_capture_on_cpu", kModel + "[optimizer]\ngraph_capture = \"on\"\n", "job.toml:4",
             "optimizer.graph_capture", "needs training.device = \"cuda\""},
        Case{"section_not_a_table", "training = 5\n" + kModel, "job.toml:1", "'training'", "must be a table"},
        Case{"bool_as_string", kModel + "[checkpoint]\nsave_final = \"yes\"\n", "job.toml:4", "checkpoint.save_final",
             "expected a boolean"},
        Case{"shard_optimizer_as_number", kModel + "[parallelism]\nshard_optimizer = 1\n", "job.toml:4",
             "parallelism.shard_optimizer", "expected a boolean"},
        Case{"reduce_scatter_grads_as_string", kModel + "[parallelism]\nreduce_scatter_grads = \"yes\"\n", "job.toml:4",
             "parallelism.reduce_scatter_grads", "expected a boolean"},
        Case{"min_lr_ratio_out_of_range", kModel + "[lr_scheduler]\nmin_lr_ratio = 2.0\n", "job.toml:4",
             "lr_scheduler.min_lr_ratio", "must be in [0, 1]"},
        Case{"threads_beyond_int", kModel + "[training]\nthreads = 4294967298\n", "job.toml:4", "training.threads",
             "must be in [0, 4096], got 4294967298"},
        Case{"device_memory_negative", kModel + "[training]\ndevice_memory_gb = -80\n", "job.toml:4",
             "training.device_memory_gb", "must be in [0, 65536], got -80"},
        Case{"device_memory_not_a_number", kModel + "[training]\ndevice_memory_gb = nan\n", "job.toml:4",
             "training.device_memory_gb", "must be a finite number"},
        Case{"pp_beyond_int", kModel + "[parallelism]\npp = 4294967297\n", "job.toml:4", "parallelism.pp",
             "must be in [1, 65536], got 4294967297"},
        Case{"dp_beyond_int", kModel + "[parallelism]\ndp = 4294967297\n", "job.toml:4", "parallelism.dp",
             "must be in [1, 65536]"},
        Case{"ep_beyond_int", kModel + "[parallelism]\nep = -4294967295\n", "job.toml:4", "parallelism.ep",
             "must be at least 1"},
        Case{"seed_beyond_int64", kModel + "[training]\nseed = 99999999999999999999\n", "job.toml:4", "training.seed",
             "beyond the range of a 64-bit integer"},
        Case{"pipeline_transfers_beyond_their_tags", kModel + "[parallelism]\npp = 2048\nmicrobatches = 1048576\n",
             "job.toml:5", "parallelism.microbatches",
             "pp x stages_per_rank x microbatches = 2048 x 1048576 exceeds 1073741824"},
        Case{"microbatches_beyond_int", kModel + "[parallelism]\nmicrobatches = 4294967298\n", "job.toml:4",
             "parallelism.microbatches", "must be in [1, 1048576]"},
        Case{"timeout_beyond_int", kModel + "[parallelism]\ntimeout_s = 4294967596\n", "job.toml:4",
             "parallelism.timeout_s", "must be in [1, 604800]"},
        Case{"bucket_size_overflows_bytes", kModel + "[parallelism]\ngrad_bucket_mb = 9007199254740992\n", "job.toml:4",
             "parallelism.grad_bucket_mb", "must be in [0, 1048576]"},
        Case{"tokens_per_step_overflow", kModel + "[training]\nseq_len = 4611686018427387904\n", "job.toml:4",
             "training.seq_len", "must be in [1, 16777216]"},
        Case{"global_batch_overflow", kModel + "[training]\nglobal_batch = 4611686018427387904\n", "job.toml:4",
             "training.global_batch", "must be in [1, 16777216]"},
        Case{"steps_overflow", kModel + "[training]\nsteps = 2199023255552\n", "job.toml:4", "training.steps",
             "must be in [1, 1099511627776]"},
        Case{"stage_counts_overflow", kModel + "[parallelism]\nlayers_per_stage = [4611686018427387904]\n",
             "job.toml:4", "parallelism.layers_per_stage", "each count must be in [0, 1048576]"},
        Case{"lr_beyond_double", kModel + "[optimizer]\nlr = 1e309\n", "job.toml:4", "optimizer.lr",
             "must be a finite number"},
        Case{"lr_nan", kModel + "[optimizer]\nlr = nan\n", "job.toml:4", "optimizer.lr", "must be a finite number"},
        Case{"eps_inf", kModel + "[optimizer]\neps = inf\n", "job.toml:4", "optimizer.eps", "must be a finite number"},
        Case{"validation_batch_not_divisible",
             kModel + "[parallelism]\nmicrobatches = 4\n[validation]\nglobal_batch = 6\n", "job.toml:6",
             "validation.global_batch", "divisible by dp x microbatches = 4"},
        Case{"validation_steps_zero", kModel + "[validation]\nsteps = 0\n", "job.toml:4", "validation.steps",
             "at least 1"},
        Case{"validation_split_of_one", kModel + "[validation]\nsplit = 1.0\n", "job.toml:4", "validation.split",
             "[0, 1)"},
        Case{"validation_split_subnormal", kModel + "[validation]\nsplit = 5e-324\n", "job.toml:4", "validation.split",
             "a subnormal number reads as 0"},
        Case{"lr_subnormal", kModel + "[optimizer]\nlr = -4e-320\n", "job.toml:4", "optimizer.lr",
             "must be 0 or at least"},
        Case{"validation_split_of_synthetic_data", kModel + "[validation]\nsplit = 0.1\n", "job.toml:4",
             "validation.split", "applies to data.source = \"tokens\""},
        Case{"validation_data_and_split",
             kModel + "[data]\nsource = \"tokens\"\npath = \"t.tok\"\n[validation]\ndata = \"v.tok\"\nsplit = 0.1\n",
             "job.toml:8", "validation.split", "choose one"},
        Case{"validation_of_tokens_without_held_out_data",
             kModel + "[data]\nsource = \"tokens\"\npath = \"t.tok\"\n[validation]\ninterval = 5\n", "job.toml:7",
             "validation.interval", "needs held-out data"},
        Case{"keep_best_without_validation", kModel + "[checkpoint]\nkeep_best = 2\n", "job.toml:4",
             "checkpoint.keep_best", "needs validation.interval > 0"},
        Case{"keep_best_off_the_evaluations",
             kModel + "[checkpoint]\ninterval = 10\nkeep_best = 2\n[validation]\ninterval = 4\n", "job.toml:5",
             "checkpoint.keep_best", "must be a multiple of validation.interval (4)"},
        Case{"steps_times_batch_beyond_2_62", kModel + "[training]\nsteps = 1099511627776\nglobal_batch = 16777216\n",
             "job.toml:4", "training.steps", "must stay below 2^62"},
        Case{"override_lr_beyond_double",
             kModel,
             "--set optimizer.lr=1e309",
             "optimizer.lr",
             "must be a finite number",
             {"optimizer.lr=1e309"}},
        Case{"override_threads_beyond_int",
             kModel,
             "--set training.threads=4294967298",
             "training.threads",
             "must be in [0, 4096]",
             {"training.threads=4294967298"}},
        Case{"override_wrong_type",
             kModel,
             "--set training.steps=abc",
             "training.steps",
             "expected an integer",
             {"training.steps=abc"}},
        Case{"override_unknown_key",
             kModel,
             "--set training.stepz=3",
             "training.stepz",
             "unknown key",
             {"training.stepz=3"}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(ConfigSyntax, SyntaxErrorNamesFileAndLine) {
  std::string message = host_error(kModel + "[training]\nsteps = = 3\n");
  EXPECT_NE(message.find("job.toml"), std::string::npos) << message;
  EXPECT_NE(message.find(" 4 | steps = = 3"), std::string::npos) << message;
}

std::string repeat(const std::string& part, int times) {
  std::string out;
  for (int i = 0; i < times; ++i) out += part;
  return out;
}

TEST(ConfigNesting, DeepNestingIsRefusedBeforeTheParserRecursesNamingFileAndLine) {
  // toml11 recurses once per level: 100 000 levels overflowed the stack (SIGSEGV).
  const std::string deep(100000, '[');
  for (const std::string& text :
       {kModel + "x = " + deep + "\n", kModel + "x = " + repeat("{a=", 100000) + "\n",
        kModel + "[a" + std::string(50000, '.') + "]\n", kModel + "a" + std::string(50000, '.') + " = 1\n"}) {
    std::string message = host_error(text);
    EXPECT_NE(message.find("job.toml:3: nesting deeper than 64 levels"), std::string::npos) << message.substr(0, 300);
  }
  std::string message = host_error(kModel, {"training.steps=" + deep});
  EXPECT_NE(message.find("--set training.steps=[[["), std::string::npos) << message.substr(0, 300);
  EXPECT_NE(message.find("nesting deeper than 64 levels"), std::string::npos) << message.substr(0, 300);
  EXPECT_LT(message.size(), 1000u);  // the value is not repeated whole
}

TEST(ConfigNesting, StringsCommentsAndModestNestingAreNotCounted) {
  const std::string brackets(200, '[');
  const std::string text = kModel + "# " + brackets + "\n[training]\nsteps = 3 # " + brackets + "\n[job]\nname = \"" +
                           std::string(200, '{') + "\"\nrun_dir = '''\n" + brackets +
                           "\n'''\n[optimizer]\nno_decay = [\"[[[\", \"]\"]\n";
  ConfigTree tree = ConfigTree::from_string(text, "job.toml");
  EXPECT_EQ(tree.section("training").integer("steps", 0), 3);
  // 60 nested arrays and a 60-part dotted key are within the bound.
  ConfigTree::from_string("x = " + std::string(60, '[') + std::string(60, ']') + "\n", "job.toml");
  std::string dotted = "a";
  for (int i = 0; i < 60; ++i) dotted += ".a";
  ConfigTree::from_string(dotted + " = 1\n", "job.toml");
  // A multi-line string closed by four quotes keeps one as content: what follows is scanned.
  EXPECT_THROW(ConfigTree::from_string("x = [\"\"\"a\"\"\"\", " + brackets + "]\n", "job.toml"), InputError);
}

TEST(ConfigEncoding, InvalidUtf8IsRefusedBeforeTheParserSeesItNamingTheLine) {
  // toml11 over-reads its buffer on some invalid sequences inside strings (found by fuzzing):
  // an unterminated literal string holding 0xff bytes, a multi-line one holding 0xfa; also an
  // overlong '/' and a surrogate.
  for (const std::string& bad : {std::string("'nt\"\xff\xff\xff"), std::string("'''a\xfa'''b"),
                                 std::string("\"\xc0\xaf\""), std::string("\"\xed\xa0\x80\"")}) {
    std::string message = host_error(kModel + "[job]\nname = " + bad + "\n");
    EXPECT_NE(message.find("job.toml:4: not valid UTF-8"), std::string::npos) << message;
  }
  std::string message = host_error(kModel, {"job.name='\xff"});
  EXPECT_NE(message.find("not valid UTF-8"), std::string::npos) << message;
  // Well-formed multi-byte text passes.
  const std::string name = "d\xc3\xa9j\xc3\xa0 \xe2\x82\xac \xf0\x9f\x99\x82";
  ConfigTree tree = ConfigTree::from_string("[job]\nname = \"" + name + "\"\n", "job.toml");
  EXPECT_EQ(tree.section("job").string("name", ""), name);
}

TEST(ConfigFile, AFolderOrAMissingFileIsRefusedNamingIt) {
  test::TempDir dir;
  try {
    ConfigTree::from_file(dir.path());
    ADD_FAILURE() << "a folder was read as an empty config";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("is a folder, expected a regular file"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--config"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ConfigTree::from_file(dir / "none.toml"), InputError);
}

TEST(ConfigCpuGemm, BlasSwitchesOneDnnOffForTheJobAndBackWhenItEnds) {
  test::TempDir dir;
  for (const char* gemm : {"blas", "onednn"}) {
    test::write_file(dir / "job.toml", kModel + "[training]\ncpu_gemm = \"" + gemm + "\"\n");
    RunOptions options;
    options.config_path = dir / "job.toml";
    options.plugin_dirs = {test::plugin_dir()};
    for (const bool before : {true, false}) {
      at::globalContext().setUserEnabledMkldnn(before);
      {
        Job job(options, /*meta=*/true);
        EXPECT_EQ(at::globalContext().userEnabledMkldnn(), std::string(gemm) == "onednn") << gemm;
      }
      EXPECT_EQ(at::globalContext().userEnabledMkldnn(), before) << gemm;
    }
  }
  at::globalContext().setUserEnabledMkldnn(true);
}

TEST(ConfigOverride, MalformedAssignmentIsRefused) {
  EXPECT_NE(host_error(kModel, {"steps=3"}).find("the key must be section.key"), std::string::npos);
  EXPECT_NE(host_error(kModel, {"training.steps"}).find("expected section.key=value"), std::string::npos);
}

TEST(ConfigOverride, OverrideReplacesFileValueAndIsResolved) {
  ConfigTree tree = ConfigTree::from_string(kModel + "[training]\nsteps = 5\n", "job.toml");
  tree.set("training.steps=7");
  tree.set("model.flavor=tiny");  // a bare word is a string
  JobConfig c = read_job_config(tree, 1, false);
  EXPECT_EQ(c.training.steps, 7);
  EXPECT_EQ(tree.section("model").string("flavor", ""), "tiny");
  EXPECT_NE(tree.resolved_toml().find("steps = 7"), std::string::npos) << tree.resolved_toml();
}

TEST(ConfigResolved, DefaultsAppearInResolvedConfig) {
  ConfigTree tree = ConfigTree::from_string(kModel, "job.toml");
  read_job_config(tree, 1, false);
  std::string resolved = tree.resolved_toml();
  EXPECT_NE(resolved.find("[optimizer]"), std::string::npos) << resolved;
  EXPECT_NE(resolved.find("lr = 0.0003\n"), std::string::npos) << resolved;
  EXPECT_NE(resolved.find("plugin = \"norm_clipper\""), std::string::npos) << resolved;
}

// Keys of the [model] and [clipper] tables are read by the plugins; the same rules hold.
struct PluginCase {
  const char* name;
  std::string text;
  std::string where, key, why;
};

void PrintTo(const PluginCase& c, std::ostream* os) { *os << c.name; }

class MalformedPluginConfig : public ::testing::TestWithParam<PluginCase> {};

TEST_P(MalformedPluginConfig, NamesKeyAndLine) {
  const PluginCase& c = GetParam();
  std::string message = job_error(c.text);
  ASSERT_FALSE(message.empty()) << c.name << " was accepted";
  EXPECT_NE(message.find(c.where), std::string::npos) << message;
  EXPECT_NE(message.find(c.key), std::string::npos) << message;
  EXPECT_NE(message.find(c.why), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(
    PluginTables, MalformedPluginConfig,
    ::testing::Values(PluginCase{"model_dim_is_a_string", kModel + "flavor = \"tiny\"\ndim = \"big\"\n", "job.toml:4",
                                 "model.dim", "expected an integer"},
                      PluginCase{"model_unknown_key", kModel + "flavor = \"tiny\"\nflavr = \"tiny\"\n", "job.toml:4",
                                 "model.flavr", "unknown key"},
                      PluginCase{"model_heads_do_not_divide_dim", kModel + "flavor = \"tiny\"\nn_heads = 3\n",
                                 "job.toml:4", "model.n_heads", "must divide dim"},
                      PluginCase{"model_unknown_flavor", kModel + "flavor = \"huge\"\n", "job.toml:3", "model.flavor",
                                 "unknown flavor 'huge'"},
                      PluginCase{"clipper_negative_max_norm",
                                 kModel + "flavor = \"tiny\"\n[clipper]\nmax_norm = -1.0\n", "job.toml:5",
                                 "clipper.max_norm", "must be a positive number"},
                      PluginCase{"clipper_unknown_key", kModel + "flavor = \"tiny\"\n[clipper]\nmax_nrom = 1.0\n",
                                 "job.toml:5", "clipper.max_nrom", "unknown key"}),
    [](const ::testing::TestParamInfo<PluginCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace keel
