#include "train/trainer.hpp"

#include <c10/core/GradMode.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <limits>

#include "checkpoint/consolidate.hpp"
#include "checkpoint/safetensors.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/text.hpp"
#include "data/synthetic_source.hpp"
#include "data/token_file.hpp"
#include "device/device.hpp"
#include "train/replica_guard.hpp"
#include "train/stop_signal.hpp"

namespace keel {

namespace fs = std::filesystem;

namespace {

std::unique_ptr<TokenSource> open_source(Job& job) {
  const DataSection& data = job.config().data;
  int64_t vocab = job.model().info().vocab_size;
  ConfigSection section(job.tree(), "data");
  if (data.source == "tokens") {
    auto source = std::make_unique<TokenFileSource>(data.path, data.seed);
    if (source->vocab_size() > vocab)
      section.invalid(
          "path", cat("the token file's vocabulary (", source->vocab_size(), ") exceeds the model's (", vocab, ")"));
    return source;
  }
  if (data.branching > vocab)
    section.invalid("branching", cat("must not exceed the model's vocabulary (", vocab, "), got ", data.branching));
  return std::make_unique<SyntheticSource>(vocab, data.branching, data.seed);
}

bool decays(const std::string& fqn, const std::vector<std::string>& no_decay) {
  for (const std::string& pattern : no_decay)
    if (glob_match(pattern, fqn)) return false;
  return true;
}

}  // namespace

Trainer::Trainer(Job& job) : job_(job) {
  const JobConfig& c = job.config();
  for (ModelPart* part : job.parts()) {
    part->init_weights(c.training.seed);
    for (const ParamRef& p : part->parameters()) {
      params_.push_back(p);
      param_infos_.push_back(p.info());
    }
  }
  if (c.debug.perturb_replicas == "before_post_init")
    log_warn(cat("debug.perturb_replicas: perturbed ", perturb_replicas(params_), " replica(s) before post_init"));
  open_checkpoint_dir();
  const auto load_start = std::chrono::steady_clock::now();
  if (loaded_) {
    // The ranks share the verification: together they check every shard's bytes once, and
    // all refuse a damaged checkpoint, whichever rank found the damage.
    const MeshLayout& mesh = job.mesh().layout();
    for (const std::string& problem :
         all_gather_bytes(job.mesh().group(KEEL_GROUP_WORLD), loaded_->verify_share(mesh.rank, mesh.world())))
      if (!problem.empty()) throw InputError(problem);
    load_model_state(*loaded_);
  }
  job.model().post_init();
  if (c.debug.perturb_replicas == "after_post_init")
    log_warn(cat("debug.perturb_replicas: perturbed ", perturb_replicas(params_), " replica(s) after post_init"));
  for (ParamRef& p : params_)
    if (!p.tensor->requires_grad()) throw std::runtime_error(cat("parameter ", p.fqn, " does not require grad"));
  for (ModelPart* part : job.parts())
    for (const ParamRef& b : part->buffers())
      if (b.persistent()) persistent_buffers_.push_back(b);
  grads_ = std::make_unique<GradientBuckets>(params_, job.mesh(), c.parallelism.grad_bucket_mb << 20);
  if (grads_->collectives_per_step() > 0 && job.mesh().layout().dp_index == 0)
    log_info(cat("gradient reduction: ", grads_->collectives_per_step(), " all-reduce(s) per step over dp/edp (",
                 c.parallelism.grad_bucket_mb, " MiB buckets)"));
  std::vector<OptimParam> optim_params;
  for (ParamRef& p : params_) optim_params.push_back({p.fqn, *p.tensor, decays(p.fqn, c.optimizer.no_decay)});
  job.clipper().bind_model_parts(param_infos_);
  optimizer_ = std::make_unique<AdamW>(
      std::move(optim_params),
      AdamWOptions{c.optimizer.beta1, c.optimizer.beta2, c.optimizer.eps, c.optimizer.weight_decay});
  schedule_ = std::make_unique<LrSchedule>(c.optimizer.lr, c.lr_scheduler.warmup_steps, c.training.steps,
                                           c.lr_scheduler.decay, c.lr_scheduler.min_lr_ratio);
  lr_ = at::full({}, schedule_->at(1), at::TensorOptions().dtype(at::kFloat).device(job.device()));
  CaptureDecision capture =
      decide_capture(c.optimizer.graph_capture, job.device().is_cuda(), step_hooks(job.model(), job.clipper()));
  if (job.mesh().layout().rank == 0 && (job.device().is_cuda() || c.optimizer.graph_capture != "auto"))
    log_info(cat("step program: ", capture.capture ? "CUDA graph" : "eager", " (", capture.reason, ")"));
  program_ = std::make_unique<StepProgram>(job.model(), job.clipper(), *optimizer_, param_infos_, lr_,
                                           job.mesh().group(KEEL_GROUP_WORLD), capture, c.optimizer.graph_warmup,
                                           c.optimizer.graph_validate);
  source_ = open_source(job);
  const MeshLayout& mesh = job.mesh().layout();
  stream_ =
      std::make_unique<BatchStream>(*source_, c.training.seq_len, c.training.global_batch, mesh.dp, mesh.dp_index);
  runner_ = std::make_unique<PipelineRunner>(
      *job.parts().front(), job.mesh().group(KEEL_GROUP_PP), c.parallelism.schedule, c.parallelism.microbatches,
      job.model().info().hidden_size, c.training.dtype == "bf16" ? at::kBFloat16 : at::kFloat, job.device());
  if (loaded_) {
    if (!c.checkpoint.load_model_only) load_training_state(*loaded_);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
    if (job.mesh().layout().rank == 0)
      log_info(format("loaded %s in %.3f s: %.1f MB read and %.1f MB verified by this rank (%.0f MB/s)",
                      loaded_->dir().c_str(), seconds, static_cast<double>(loaded_->bytes_read()) / 1e6,
                      static_cast<double>(loaded_->bytes_verified()) / 1e6,
                      static_cast<double>(loaded_->bytes_read()) / 1e6 / std::max(seconds, 1e-9)));
    loaded_.reset();  // unmaps the files
  }
  if (c.checkpoint.interval > 0) {
    // Checkpoint I/O gets a group of its own (every rank): a background save's collectives
    // never interleave with the training's.
    std::vector<int> everyone;
    for (int r = 0; r < job.mesh().layout().world(); ++r) everyone.push_back(r);
    Group* io_group = job.mesh().new_group(everyone);
    checkpoints_ = std::make_unique<CheckpointWriter>(
        CheckpointWriterOptions{c.checkpoint.dir, c.checkpoint.keep_latest, c.checkpoint.async, run_id_, loaded_dir_},
        *io_group);
    // Fault injection: a rank's own file is the last rank's business, the commit rank 0's.
    const MeshLayout& layout = job.mesh().layout();
    const SavePhase phase = save_phase(c.debug.crash_in_checkpoint_phase);
    if (c.debug.crash_in_checkpoint > 0 && layout.rank == (phase == SavePhase::written ? layout.world() - 1 : 0))
      checkpoints_->crash_at(c.debug.crash_in_checkpoint, phase);
    const int64_t failing =
        c.debug.fail_checkpoint_write_rank < 0 ? layout.world() - 1 : c.debug.fail_checkpoint_write_rank;
    if (c.debug.fail_checkpoint_write > 0 && layout.rank == failing)
      checkpoints_->fail_write_at(c.debug.fail_checkpoint_write);
    if (c.debug.fail_checkpoint_commit > 0 && layout.rank == 0)
      checkpoints_->fail_commit_at(c.debug.fail_checkpoint_commit);
  }
}

Trainer::~Trainer() = default;

double Trainer::step(int64_t step, bool read_loss) {
  const JobConfig& c = job_.config();
  Group& world = job_.mesh().group(KEEL_GROUP_WORLD);
  job_.step_metrics().clear();
  Batch batch = stream_->next();

  // The loss is token-summed per microbatch and divided by the step's global token count.
  at::Tensor count = at::full({}, static_cast<double>(batch.labelled_tokens), at::kDouble);
  job_.mesh().group(KEEL_GROUP_DP).all_reduce(count, KEEL_REDUCE_SUM);
  const double global_tokens = count.item<double>();

  // A skipped step must leave every checkpointed tensor as it was: AdamW and the clipper's
  // state are guarded inside the step program; the model's persistent buffers (DeepSeek-V3's
  // expert bias, moved by post_step) are kept here and put back on the device.
  std::vector<at::Tensor> buffers_before;
  for (const ParamRef& b : persistent_buffers_) buffers_before.push_back(b.tensor->detach().clone());

  grads_->zero();
  const int m = c.parallelism.microbatches;
  at::Tensor loss_total = runner_->run(batch.tokens.chunk(m, 0), batch.labels.chunk(m, 0), global_tokens);
  if (job_.mesh().layout().pp > 1 && read_loss) report_pipeline_bubble();
  if (step == c.debug.nan_grad_step && job_.mesh().layout().rank == c.debug.nan_grad_rank) poison_gradient(step);

  grads_->reduce();
  if (time_program_) synchronize(job_.device());
  const auto program_start = std::chrono::steady_clock::now();
  program_->run();  // pre_clip -> clip -> non-finite guard -> AdamW, eager or replayed
  if (time_program_) {
    synchronize(job_.device());
    program_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - program_start).count();
  }
  const at::Tensor& norm = program_->total_norm();
  const at::Tensor& found_inf = program_->found_inf();
  job_.model().post_step();
  if (!persistent_buffers_.empty()) {
    c10::NoGradGuard no_grad;
    const at::Tensor skipped = found_inf.to(at::kBool);
    for (size_t i = 0; i < persistent_buffers_.size(); ++i) {
      at::Tensor now = persistent_buffers_[i].tensor->detach();
      now.copy_(at::where(skipped.to(now.device()), buffers_before[i], now));
    }
  }
  lr_.fill_(schedule_->at(step + 1));
  if (c.debug.replica_check_interval > 0 && step % c.debug.replica_check_interval == 0) {
    check_replicas(params_, world, step);
    ++replica_checks_;
  }

  // Only last stages hold a loss (zero elsewhere): the world's sum is the global token-summed loss.
  world.all_reduce(loss_total, KEEL_REDUCE_SUM);
  last_norm_ = norm;
  last_found_inf_ = found_inf;
  last_loss_ = loss_total / global_tokens;
  return read_loss ? last_loss_.item<double>() : 0.0;
}

void Trainer::poison_gradient(int64_t step) {
  // Fault injection: one NaN in the first matching gradient of this rank, as a bad backward
  // would leave it, before the data-parallel reduction.
  const std::string& pattern = job_.config().debug.nan_grad_param;
  for (const ParamRef& p : params_) {
    at::Tensor grad = p.tensor->mutable_grad();
    if (!grad.defined() || grad.numel() == 0 || !glob_match(pattern, p.fqn)) continue;
    c10::NoGradGuard no_grad;
    grad.view({-1}).narrow(0, 0, 1).fill_(std::numeric_limits<double>::quiet_NaN());
    log_warn(cat("debug.nan_grad_step: step ", step, ": a NaN put into the gradient of ", p.fqn));
    return;
  }
  log_warn(cat("debug.nan_grad_step: step ", step, ": no gradient of this rank matches '", pattern, "'"));
}

void Trainer::report_pipeline_bubble() {
  // The textbook bubble: the idle share of all stages' time over the step's makespan. Every
  // stage starts its schedule right after the previous step's world collectives, so the
  // longest schedule of the pipeline is the makespan.
  Group& pp = job_.mesh().group(KEEL_GROUP_PP);
  const ScheduleTiming& t = runner_->timing();
  at::Tensor mine = at::tensor({t.busy_seconds, t.total_seconds}, at::kDouble);
  at::Tensor all = at::empty({pp.size(), 2}, at::kDouble);
  pp.all_gather(all, mine.view({1, 2}));
  const double makespan = all.select(1, 1).max().item<double>();
  const double busy = all.select(1, 0).sum().item<double>();
  const double bubble = makespan > 0 ? 1.0 - busy / (makespan * pp.size()) : 0.0;
  job_.step_metrics().report("pipeline_bubble", at::full({}, bubble, at::kDouble), KEEL_METRIC_MEAN);
}

Trainer::Stop Trainer::agreed_stop() {
  // A signal reaches one rank (or all, at different steps), a background save's failure is
  // known first to whichever rank's thread finishes first: all stop after the same step.
  Group& world = job_.mesh().group(KEEL_GROUP_WORLD);
  const bool failed = checkpoints_ && checkpoints_->background_failed();
  if (world.size() == 1) return {stop_requested(), failed};
  at::Tensor flags = at::tensor({static_cast<double>(stop_requested()), failed ? 1.0 : 0.0}, at::kDouble);
  world.all_reduce(flags, KEEL_REDUCE_MAX);
  return {static_cast<int>(flags[0].item<double>()), flags[1].item<double>() != 0.0};
}

bool Trainer::writes(const ParamRef& p) const {
  // One copy of each logical tensor is written: the owner's (not a REPLICA), from the first
  // data-parallel replica of dense tensors and the first edp replica of an expert shard.
  const MeshLayout& m = job_.mesh().layout();
  return !p.replica() && (p.expert() ? m.edp_index == 0 : m.dp_index == 0);
}

void Trainer::save_weights(const std::string& path, int64_t step, bool with_optimizer) const {
  // The checkpoint's pieces under the file's names: "model.<fqn>" as the bare FQN, AdamW's
  // state kept when asked for; clipper and random state are a checkpoint's business only.
  std::vector<TensorPiece> pieces;
  for (TensorPiece& piece : checkpoint_pieces()) {
    if (piece.key.rfind("model.", 0) == 0)
      piece.key.erase(0, 6);
    else if (!with_optimizer || piece.key.rfind("optim.", 0) != 0)
      continue;
    pieces.push_back(std::move(piece));
  }
  std::vector<std::pair<std::string, at::Tensor>> whole = consolidate(pieces, job_.mesh().group(KEEL_GROUP_WORLD));
  if (job_.mesh().layout().rank != 0) return;
  fs::create_directories(fs::path(path).parent_path());
  write_safetensors(
      path, whole, {{"format", "keel-weights"}, {"step", std::to_string(step)}, {"model", job_.config().model.plugin}});
}

RunSummary Trainer::run() {
  const JobConfig& c = job_.config();
  RunSummary summary;
  summary.loss_floor = source_->loss_floor();
  log_info(source_->describe());
  fs::path run_dir = c.job.run_dir;
  // One rank writes what every rank knows: the loss and metrics are gathered from every rank.
  const bool writer = job_.mesh().layout().rank == 0;
  MetricsLog log(c.metrics.jsonl && writer ? (run_dir / "metrics.jsonl").string() : std::string(), start_step_);
  install_stop_handlers();

  using clock = std::chrono::steady_clock;
  auto interval_start = clock::now();
  int64_t interval_steps = 0;
  double tokens_per_step = static_cast<double>(c.training.global_batch * c.training.seq_len);
  int64_t saved_at = -1;  // the step this run last saved
  summary.steps_done = start_step_;
  auto checkpoint = [&](int64_t s) {
    if (checkpoints_ && saved_at != s) {
      save_checkpoint(s);
      saved_at = s;
    }
  };
  for (int64_t s = start_step_ + 1; s <= c.training.steps; ++s) {
    bool log_now = s % c.metrics.log_interval == 0 || s == start_step_ + 1 || s == c.training.steps;
    double lr = schedule_->at(s);
    double loss = step(s, log_now);
    ++interval_steps;
    summary.steps_done = s;
    if (log_now) {
      synchronize(job_.device());
      double seconds = std::chrono::duration<double>(clock::now() - interval_start).count();
      StepRecord r;
      r.step = s;
      r.total_steps = c.training.steps;
      r.loss = loss;
      r.grad_norm = last_norm_.item<double>();
      r.lr = lr;
      r.tokens_per_second = seconds > 0 ? tokens_per_step * static_cast<double>(interval_steps) / seconds : 0;
      r.eta_seconds = seconds / static_cast<double>(interval_steps) * static_cast<double>(c.training.steps - s);
      r.peak_memory_bytes = peak_memory_bytes(job_.device());
      r.skipped = last_found_inf_.item<float>() != 0.0f;
      r.plugin_metrics = job_.step_metrics().resolve_across(job_.mesh().group(KEEL_GROUP_WORLD));
      if (writer) log.write(r);
      if (s == start_step_ + 1) {
        summary.first_loss = loss;
        summary.first_metrics = r.plugin_metrics;
      }
      summary.final_loss = loss;
      summary.final_metrics = r.plugin_metrics;
      interval_start = clock::now();
      interval_steps = 0;
    }
    if (c.checkpoint.interval > 0 && s % c.checkpoint.interval == 0) checkpoint(s);
    const Stop stop = agreed_stop();
    if (stop.save_failed) settle(checkpoints_->take_outcome(), s);
    if (!save_failure_.empty()) {
      if (!log_now) summary.final_loss = last_loss_.item<double>();
      break;
    }
    if (int signal = stop.signal) {
      summary.stop_signal = signal;
      if (!log_now) summary.final_loss = last_loss_.item<double>();
      log_info(cat("stopping after step ", s, " (", signal == SIGINT ? "SIGINT" : "SIGTERM", ")"));
      break;
    }
  }
  // The end, a stop signal included: the last state is saved (a run of no steps after a load
  // saves the loaded state in this run's layout: a resharded copy).
  if (save_failure_.empty()) checkpoint(summary.steps_done);
  if (checkpoints_) {
    settle(checkpoints_->take_outcome(), summary.steps_done);
    summary.checkpoint_path = saved_path_;
    summary.run_id = run_id_;
  }
  summary.replica_checks = replica_checks_;
  if (replica_checks_ > 0 && writer)
    log_info(cat("replica guard: ", replica_checks_, " check(s), every copy of every parameter bitwise equal"));
  if (c.checkpoint.save_final) {
    summary.weights_path = (run_dir / "final" / "model.safetensors").string();
    save_weights(summary.weights_path, summary.steps_done);
    if (writer) log_info(cat("final weights: ", summary.weights_path));
  }
  if (c.debug.dump_state) {
    std::string path = (run_dir / "final" / "state.safetensors").string();
    save_weights(path, summary.steps_done, /*with_optimizer=*/true);
    if (writer) log_info(cat("final state (parameters, buffers, optimizer): ", path));
  }
  if (!save_failure_.empty()) {
    // The weights are safe in run_dir; the job still fails, so nobody mistakes it for a
    // run whose checkpoints are all there.
    summary.save_failure = save_failure_;
    throw std::runtime_error(cat("stopped after step ", summary.steps_done, ": ", save_failure_));
  }
  return summary;
}

}  // namespace keel
