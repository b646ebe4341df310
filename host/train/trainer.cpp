// Trainer setup (the constructor, in the order of DESIGN's call sequence) and one step.
#include "train/trainer.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <keel/init.hpp>

#include <algorithm>
#include <chrono>
#include <limits>
#include <mutex>
#include <optional>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/text.hpp"
#include "common/trace_scope.hpp"
#include "device/device.hpp"
#include "memory/state_memory.hpp"
#include "train/data_fault.hpp"
#include "train/data_sources.hpp"
#include "train/gradient_scatter.hpp"
#include "train/replica_guard.hpp"

namespace keel {

namespace {

bool decays(const std::string& fqn, const std::vector<std::string>& no_decay) {
  for (const std::string& pattern : no_decay)
    if (glob_match(pattern, fqn)) return false;
  return true;
}

}  // namespace

Trainer::Trainer(Job& job) : job_(job) {
  init_parameters();
  state_ = std::make_unique<TrainState>(job, params_);  // checkpoint.dir opened, the checkpoint to load chosen
  state_->load_model();
  post_init();
  build_optimizer();
  build_step_program();
  open_data();
  start_step_ = state_->start(*optimizer_, *stream_, *schedule_);
  lr_.fill_(schedule_->at(start_step_ + 1));  // a resumed run continues its schedule
}

void Trainer::init_parameters() {
  const JobConfig& c = job_.config();
  // The default CPU generator is what an unseeded draw in a plugin (dropout, say) uses and what
  // a checkpoint saves as rng.cpu.rank<N>; left alone, its state differs between two runs of
  // one config. Seeded from the job's seed and the rank, every run draws the same numbers.
  const int rank = job_.mesh().layout().rank;
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_current_seed(init::seed_for(c.training.seed, "rng.cpu", static_cast<int64_t>(rank)));
  chunk_params_ = {0};
  for (ModelPart* part : job_.parts()) {
    part->init_weights(c.training.seed);
    for (const ParamRef& p : part->parameters()) params_.push_back(p);
    chunk_params_.push_back(params_.size());
  }
  if (c.debug.perturb_replicas == "before_post_init")
    log_warn(cat("debug.perturb_replicas: perturbed ", perturb_replicas(params_), " replica(s) before post_init"));
}

void Trainer::post_init() {
  job_.model().post_init();
  if (job_.config().debug.perturb_replicas == "after_post_init")
    log_warn(cat("debug.perturb_replicas: perturbed ", perturb_replicas(params_), " replica(s) after post_init"));
  for (ParamRef& p : params_)
    if (!p.tensor().requires_grad()) throw std::runtime_error(cat("parameter ", p.fqn(), " does not require grad"));
  for (ModelPart* part : job_.parts())
    for (const ParamRef& b : part->buffers())
      if (b.persistent()) persistent_buffers_.push_back(b);
}

void Trainer::build_optimizer() {
  const JobConfig& c = job_.config();
  grads_ = std::make_unique<GradientBuckets>(params_, job_.mesh(), c.parallelism.grad_bucket_mb << 20,
                                             c.parallelism.overlap_grad_reduce);
  if (grads_->collectives_per_step() > 0 && job_.mesh().layout().dp_index == 0)
    log_info(cat("gradient reduction: ", grads_->collectives_per_step(), " all-reduce(s) per step over dp/edp (",
                 c.parallelism.grad_bucket_mb, " MiB buckets), ",
                 c.parallelism.overlap_grad_reduce
                     ? "each started during the last backward once its gradients are final"
                     : "after the backward (parallelism.overlap_grad_reduce = false)"));
  std::vector<OptimParam> optim_params;
  for (ParamRef& p : params_) optim_params.push_back({p.fqn(), p.tensor(), decays(p.fqn(), c.optimizer.no_decay)});
  Mesh& mesh = job_.mesh();
  std::vector<OptimPiece> pieces =
      optimizer_pieces(grads_->layout(), params_, c.parallelism.shard_optimizer,
                       {mesh.group(KEEL_GROUP_DP).size(), mesh.group(KEEL_GROUP_DP).rank()},
                       {mesh.group(KEEL_GROUP_EDP).size(), mesh.group(KEEL_GROUP_EDP).rank()});
  optimizer_ = std::make_unique<AdamW>(
      std::move(optim_params),
      AdamWOptions{c.optimizer.beta1, c.optimizer.beta2, c.optimizer.eps, c.optimizer.weight_decay}, std::move(pieces));
  if (c.parallelism.shard_optimizer) {
    gather_ = std::make_unique<ParameterGather>(grads_->layout(), params_, mesh);
    if (mesh.layout().rank == 0)
      log_info(
          cat("optimizer state sharded over dp (dense) and edp (experts): each rank steps its range of every "
              "gradient bucket, then broadcasts its updated rows to the others (",
              gather_->buckets(), " bucket(s))"));
    scatter_gradients();
  }
  schedule_ = std::make_unique<LrSchedule>(c.optimizer.lr, c.lr_scheduler.warmup_steps, c.training.steps,
                                           c.lr_scheduler.decay, c.lr_scheduler.min_lr_ratio);
  lr_ = at::full({}, schedule_->at(1), at::TensorOptions().dtype(at::kFloat).device(job_.device()));
  log_state_memory();
}

void Trainer::scatter_gradients() {
  // The same decision on every rank: it reads only the config and the plugins.
  const std::string why = why_gradients_stay_whole(job_.config(), job_.model(), job_.clipper());
  Mesh& mesh = job_.mesh();
  size_t scattered = 0;
  if (why.empty()) {
    std::vector<size_t> whole;
    if (job_.model().vtable().pre_clip != nullptr) whole = replicated_parameters(params_, mesh.group(KEEL_GROUP_WORLD));
    scattered = grads_->scatter(params_, whole);
  }
  // Bound on every rank alike, even one whose buckets all stay whole: the clipper's
  // collectives must match across the world, and owned rows of a whole-reduced bucket are
  // reduced too.
  scatter_grads_ = why.empty();
  if (mesh.layout().rank != 0 || grads_->collectives_per_step() == 0) return;
  if (!why.empty())
    log_info("gradients all-reduced whole: " + why);
  else
    log_info(cat("gradients reduce-scattered in ", scattered, " of ", grads_->collectives_per_step(), " bucket(s)",
                 scattered < grads_->collectives_per_step()
                     ? " (the others hold a parameter with a REPLICA copy, which pre_clip reads whole: all-reduced)"
                     : ""));
}

void Trainer::log_state_memory() {
  // Every rank's state as allocated, in the lines of the dry run's memory plan: the plan can
  // be checked against them.
  std::vector<StateBytes> by_rank;
  const StateBytes mine = held_state_bytes(job_.parts(), *grads_, *optimizer_, gather_.get());
  for (const std::string& text : all_gather_bytes(job_.mesh().group(KEEL_GROUP_WORLD), encode_state_bytes(mine)))
    by_rank.push_back(decode_state_bytes(text));
  if (job_.mesh().layout().rank != 0) return;
  for (const std::string& line : state_lines_by_rank(by_rank)) log_info("training state, " + line);
}

void Trainer::build_step_program() {
  // The clipper is bound to the records the step program hands it every step: one list, in
  // the optimizer's order.
  const JobConfig& c = job_.config();
  for (const ParamRef& p : params_) param_infos_.push_back(p.info());
  job_.clipper().bind_model_parts(param_infos_);
  if (scatter_grads_) {
    owned_grads_ = owned_gradients(params_, optimizer_->pieces());
    job_.clipper().bind_gradient_shards(owned_grads_.owners, owned_grads_.rows);
  }
  CaptureDecision capture =
      decide_capture(c.optimizer.graph_capture, job_.device().is_cuda(), step_hooks(job_.model(), job_.clipper()));
  if (job_.mesh().layout().rank == 0 && (job_.device().is_cuda() || c.optimizer.graph_capture != "auto"))
    log_info(cat("step program: ", capture.capture ? "CUDA graph" : "eager", " (", capture.reason, ")"));
  program_ = std::make_unique<StepProgram>(job_.model(), job_.clipper(), *optimizer_, param_infos_, lr_,
                                           job_.mesh().group(KEEL_GROUP_WORLD), capture, c.optimizer.graph_warmup,
                                           c.optimizer.graph_validate, gather_.get());
}

void Trainer::open_data() {
  const JobConfig& c = job_.config();
  const MeshLayout& mesh = job_.mesh().layout();
  source_ = open_training_source(job_);
  data_origin_ = data_origin(c, /*validation=*/false);
  const std::optional<int64_t> eos = document_end(job_, *source_);
  if (mesh.rank == 0)
    log_info(eos ? cat("documents: no label crosses a document end (labels after EOS id ", *eos, " are ignored)")
                 : cat("documents: not separated (",
                       c.data.documents == "none" ? "data.documents = \"none\"" : "the source records no EOS id",
                       "); labels run across document ends"));
  if (c.data.attention == "block_causal") {
    job_.model().set_document_end(*eos);  // document_end refused a source without one
    if (mesh.rank == 0)
      log_info(cat("attention: block_causal (a position attends only to its own document), positions ",
                   c.data.reset_positions ? "restart at each document" : "run across the sample"));
  }
  stream_ =
      std::make_unique<BatchStream>(*source_, c.training.seq_len, c.training.global_batch, mesh.dp, mesh.dp_index, eos);
  std::vector<Group*> links;
  for (int link = 0; link < kMeshPipelineLinks; ++link) links.push_back(&job_.mesh().pipeline_link(link));
  runner_ = std::make_unique<PipelineRunner>(job_.parts(), job_.mesh().group(KEEL_GROUP_PP), std::move(links),
                                             c.parallelism.schedule, c.parallelism.microbatches,
                                             job_.model().info().hidden_size,
                                             c.training.dtype == "bf16" ? at::kBFloat16 : at::kFloat, job_.device());
  runner_->set_before_last_backward([this](int chunk) {
    if (!poisons_)
      grads_->arm(chunk_params_[static_cast<size_t>(chunk)], chunk_params_[static_cast<size_t>(chunk) + 1]);
  });
  if (c.validation.interval > 0)
    evaluator_ = std::make_unique<Evaluator>(job_, *runner_, open_validation_source(job_, *source_), eos);
}

Trainer::~Trainer() = default;

double Trainer::step(int64_t step, bool read_loss) {
  const JobConfig& c = job_.config();
  Group& world = job_.mesh().group(KEEL_GROUP_WORLD);
  job_.step_metrics().clear();
  Batch batch = [&] {
    KEEL_TRACE_SCOPE("keel::data");
    return agreed_batch(
        world, job_.mesh().layout().rank, [&] { return stream_->next(); }, data_origin_);
  }();

  // The loss is token-summed per microbatch and divided by the step's global token count.
  at::Tensor count = at::full({}, static_cast<double>(batch.labelled_tokens), at::kDouble);
  job_.mesh().group(KEEL_GROUP_DP).all_reduce(count, KEEL_REDUCE_SUM);
  // A step of nothing but document ends has no labelled token: its loss is 0, not 0 / 0.
  const double global_tokens = std::max(count.item<double>(), 1.0);

  const std::vector<at::Tensor> buffers_before = keep_buffers();

  grads_->zero();
  // A gradient poisoned after the backward must be poisoned before its bucket is reduced.
  poisons_ = step == c.debug.nan_grad_step && job_.mesh().layout().rank == c.debug.nan_grad_rank;
  const int m = c.parallelism.microbatches;
  at::Tensor loss_total = runner_->run(batch.tokens.chunk(m, 0), batch.labels.chunk(m, 0), global_tokens);
  if (job_.mesh().layout().pp > 1 && read_loss) report_pipeline_bubble();
  if (poisons_) poison_gradient(step);

  const auto reduce_start = std::chrono::steady_clock::now();
  grads_->reduce();
  if (read_loss && grads_->collectives_per_step() > 0 && !job_.device().is_cuda()) {
    // What of the reduction the backward pass did not hide: the host's wait for it (on CUDA
    // the wait only orders streams, so nothing is reported there).
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - reduce_start).count();
    job_.step_metrics().report("grad_reduce_wait_seconds", at::full({}, waited, at::kDouble), KEEL_METRIC_MAX);
  }
  if (step == start_step_ + 1 && grads_->collectives_per_step() > 0 && c.parallelism.overlap_grad_reduce &&
      job_.mesh().layout().rank == 0)
    log_info(cat("gradient reduction overlapped: ", grads_->started_during_backward(), " of ",
                 grads_->collectives_per_step(), " bucket(s) started before the backward pass ended (step ", step,
                 ")"));
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
  put_back_buffers_if_skipped(buffers_before, found_inf);
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

std::vector<at::Tensor> Trainer::keep_buffers() const {
  // A skipped step must leave every checkpointed tensor as it was: AdamW and the clipper's
  // state are guarded inside the step program; the model's persistent buffers (DeepSeek-V3's
  // expert bias, moved by post_step) are kept here and put back on the device.
  std::vector<at::Tensor> kept;
  for (const ParamRef& b : persistent_buffers_) kept.push_back(b.tensor().detach().clone());
  return kept;
}

void Trainer::put_back_buffers_if_skipped(const std::vector<at::Tensor>& kept, const at::Tensor& found_inf) {
  if (persistent_buffers_.empty()) return;
  c10::NoGradGuard no_grad;
  const at::Tensor skipped = found_inf.to(at::kBool);
  for (size_t i = 0; i < persistent_buffers_.size(); ++i) {
    at::Tensor now = persistent_buffers_[i].tensor().detach();
    now.copy_(at::where(skipped.to(now.device()), kept[i], now));
  }
}

void Trainer::poison_gradient(int64_t step) {
  // Fault injection: one NaN in the first matching gradient of this rank, as a bad backward
  // would leave it, before the data-parallel reduction.
  const std::string& pattern = job_.config().debug.nan_grad_param;
  for (const ParamRef& p : params_) {
    at::Tensor grad = p.tensor().mutable_grad();
    if (!grad.defined() || grad.numel() == 0 || !glob_match(pattern, p.fqn())) continue;
    c10::NoGradGuard no_grad;
    grad.view({-1}).narrow(0, 0, 1).fill_(std::numeric_limits<double>::quiet_NaN());
    log_warn(cat("debug.nan_grad_step: step ", step, ": a NaN put into the gradient of ", p.fqn()));
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
  // The part of it no schedule can remove: the idle share had every stage run its passes back
  // to back, the busiest stage setting the makespan. Unequal stages, not the schedule.
  const double busiest = all.select(1, 0).max().item<double>();
  const double imbalance = busiest > 0 ? 1.0 - busy / (busiest * pp.size()) : 0.0;
  job_.step_metrics().report("pipeline_imbalance", at::full({}, imbalance, at::kDouble), KEEL_METRIC_MEAN);
}

}  // namespace keel
