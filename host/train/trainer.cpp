#include "train/trainer.hpp"

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>

#include "checkpoint/safetensors.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/text.hpp"
#include "data/synthetic_source.hpp"
#include "data/token_file.hpp"
#include "device/device.hpp"
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
      param_infos_.push_back(p.raw);
    }
  }
  job.model().post_init();
  // Gradients get their storage once and keep it: zeroed in place every step, never freed.
  std::vector<OptimParam> optim_params;
  for (ParamRef& p : params_) {
    if (!p.tensor->requires_grad()) throw std::runtime_error(cat("parameter ", p.fqn, " does not require grad"));
    p.tensor->mutable_grad() = at::zeros_like(*p.tensor);
    optim_params.push_back({p.fqn, *p.tensor, decays(p.fqn, c.optimizer.no_decay)});
  }
  job.clipper().bind_model_parts(param_infos_);
  optimizer_ = std::make_unique<AdamW>(
      std::move(optim_params),
      AdamWOptions{c.optimizer.beta1, c.optimizer.beta2, c.optimizer.eps, c.optimizer.weight_decay});
  schedule_ = std::make_unique<LrSchedule>(c.optimizer.lr, c.lr_scheduler.warmup_steps, c.training.steps,
                                           c.lr_scheduler.decay, c.lr_scheduler.min_lr_ratio);
  lr_ = at::full({}, schedule_->at(1), at::TensorOptions().dtype(at::kFloat).device(job.device()));
  source_ = open_source(job);
  const MeshLayout& mesh = job.mesh().layout();
  stream_ =
      std::make_unique<BatchStream>(*source_, c.training.seq_len, c.training.global_batch, mesh.dp, mesh.dp_index);
}

void Trainer::reduce_gradients() {
  Group& dp = job_.mesh().group(KEEL_GROUP_DP);
  Group& edp = job_.mesh().group(KEEL_GROUP_EDP);
  for (ParamRef& p : params_) {
    Group& g = p.expert() ? edp : dp;
    if (g.size() > 1) g.all_reduce(p.tensor->mutable_grad(), KEEL_REDUCE_SUM);
  }
}

double Trainer::step(int64_t step, bool read_loss) {
  const JobConfig& c = job_.config();
  const at::Device& device = job_.device();
  job_.step_metrics().clear();
  Batch batch = stream_->next();

  // The loss is token-summed per microbatch and divided by the step's global token count.
  at::Tensor count = at::full({}, static_cast<double>(batch.labelled_tokens), at::kDouble);
  job_.mesh().group(KEEL_GROUP_DP).all_reduce(count, KEEL_REDUCE_SUM);
  double global_tokens = count.item<double>();

  for (ParamRef& p : params_) p.tensor->mutable_grad().zero_();
  at::Tensor loss_total = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
  int m = c.parallelism.microbatches;
  std::vector<at::Tensor> tokens = batch.tokens.chunk(m, 0);
  std::vector<at::Tensor> labels = batch.labels.chunk(m, 0);
  ModelPart& part = *job_.parts().front();
  for (int mb = 0; mb < m; ++mb) {
    at::Tensor t = tokens[static_cast<size_t>(mb)].to(device);
    at::Tensor l = labels[static_cast<size_t>(mb)].to(device);
    at::Tensor loss_sum = part.forward(t, l, nullptr, mb, m);
    (loss_sum / global_tokens).backward();
    loss_total.add_(loss_sum.detach());
  }

  reduce_gradients();
  job_.model().pre_clip();
  at::Tensor norm = job_.clipper().clip(param_infos_);
  at::Tensor found_inf = norm.isfinite().logical_not().to(at::kFloat);
  optimizer_->step(lr_, found_inf);
  job_.model().post_step();
  lr_.fill_(schedule_->at(step + 1));
  if (c.debug.replica_check_interval > 0 && step % c.debug.replica_check_interval == 0) check_replicas(step);

  // Every replica's share of the token-summed loss, so each rank logs the global loss.
  job_.mesh().group(KEEL_GROUP_DP).all_reduce(loss_total, KEEL_REDUCE_SUM);
  last_norm_ = norm;
  last_found_inf_ = found_inf;
  last_loss_ = loss_total / global_tokens;
  return read_loss ? last_loss_.item<double>() : 0.0;
}

int Trainer::agreed_stop() {
  // A signal reaches one rank (or all, at different steps): all stop after the same step.
  Group& world = job_.mesh().group(KEEL_GROUP_WORLD);
  if (world.size() == 1) return stop_requested();
  at::Tensor flag = at::full({}, static_cast<double>(stop_requested()), at::kDouble);
  world.all_reduce(flag, KEEL_REDUCE_MAX);
  return static_cast<int>(flag.item<double>());
}

void Trainer::check_replicas(int64_t step) const {
  // Every copy of a logical parameter this process holds must equal its owner bitwise.
  for (const ParamRef& replica : params_) {
    if (!replica.replica()) continue;
    for (const ParamRef& owner : params_)
      if (!owner.replica() && owner.fqn == replica.fqn && !at::equal(*owner.tensor, *replica.tensor))
        throw std::runtime_error(cat("replica check at step ", step, ": the copies of '", replica.fqn,
                                     "' differ on rank ", job_.mesh().layout().rank));
  }
}

void Trainer::save_weights(const std::string& path, int64_t step) const {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (ModelPart* part : job_.parts()) {
    for (const ParamRef& p : part->parameters())
      if (!p.replica()) tensors.push_back({p.fqn, *p.tensor});
    for (const ParamRef& b : part->buffers())
      if (b.persistent() && !b.replica()) tensors.push_back({b.fqn, *b.tensor});
  }
  fs::create_directories(fs::path(path).parent_path());
  write_safetensors(
      path, tensors,
      {{"format", "keel-weights"}, {"step", std::to_string(step)}, {"model", job_.config().model.plugin}});
}

RunSummary Trainer::run() {
  const JobConfig& c = job_.config();
  RunSummary summary;
  summary.loss_floor = source_->loss_floor();
  log_info(source_->describe());
  fs::path run_dir = c.job.run_dir;
  // One rank writes what every rank knows (rank 0 holds the loss of its replica's last stage).
  const bool writer = job_.mesh().layout().rank == 0;
  MetricsLog log(c.metrics.jsonl && writer ? (run_dir / "metrics.jsonl").string() : std::string());
  install_stop_handlers();

  using clock = std::chrono::steady_clock;
  auto interval_start = clock::now();
  int64_t interval_steps = 0;
  double tokens_per_step = static_cast<double>(c.training.global_batch * c.training.seq_len);
  for (int64_t s = 1; s <= c.training.steps; ++s) {
    bool log_now = s % c.metrics.log_interval == 0 || s == 1 || s == c.training.steps;
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
      r.plugin_metrics = job_.step_metrics().resolve();
      if (writer) log.write(r);
      if (s == 1) {
        summary.first_loss = loss;
        summary.first_metrics = r.plugin_metrics;
      }
      summary.final_loss = loss;
      summary.final_metrics = r.plugin_metrics;
      interval_start = clock::now();
      interval_steps = 0;
    }
    if (int signal = agreed_stop()) {
      summary.stop_signal = signal;
      if (!log_now) summary.final_loss = last_loss_.item<double>();
      log_info(cat("stopping after step ", s, " (", signal == SIGINT ? "SIGINT" : "SIGTERM", ")"));
      break;
    }
  }
  if (c.checkpoint.save_final && writer) {
    summary.weights_path = (run_dir / "final" / "model.safetensors").string();
    save_weights(summary.weights_path, summary.steps_done);
    log_info(cat("final weights: ", summary.weights_path));
  }
  return summary;
}

}  // namespace keel
