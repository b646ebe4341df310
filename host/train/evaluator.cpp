#include "train/evaluator.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <vector>

#include "common/text.hpp"
#include "device/device.hpp"
#include "train/data_fault.hpp"
#include "train/data_sources.hpp"

namespace keel {

namespace {

/// Puts back, when it goes out of scope, what a forward pass may change outside the autograd
/// graph: every buffer of this rank's parts (DeepSeek-V3 counts its routed tokens in one) and
/// the default CPU generator (what an unseeded draw in a plugin uses; checkpoints save it).
class TrainingStateKeeper {
 public:
  explicit TrainingStateKeeper(const std::vector<ModelPart*>& parts) {
    c10::NoGradGuard no_grad;
    for (ModelPart* part : parts)
      for (const ParamRef& b : part->buffers()) kept_.emplace_back(b.tensor(), b.tensor().detach().clone());
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator_state_ = generator.get_state();
  }
  ~TrainingStateKeeper() {
    c10::NoGradGuard no_grad;
    for (auto& [now, before] : kept_) now.detach().copy_(before);
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(generator_state_);
  }
  TrainingStateKeeper(const TrainingStateKeeper&) = delete;
  TrainingStateKeeper& operator=(const TrainingStateKeeper&) = delete;

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> kept_;
  at::Tensor generator_state_;
};

/// Sets the step's metric reports aside while the evaluation's are collected; puts them back.
class ReportsSetAside {
 public:
  explicit ReportsSetAside(StepMetrics& metrics) : metrics_(metrics) { metrics_.swap(step_reports_); }
  ~ReportsSetAside() { metrics_.swap(step_reports_); }
  ReportsSetAside(const ReportsSetAside&) = delete;
  ReportsSetAside& operator=(const ReportsSetAside&) = delete;

 private:
  StepMetrics& metrics_;
  StepMetrics step_reports_;
};

}  // namespace

std::map<std::string, double> Evaluation::figures() const {
  std::map<std::string, double> out = metrics;
  out["val_loss"] = loss;
  return out;
}

Evaluator::Evaluator(Job& job, PipelineRunner& runner, std::unique_ptr<TokenSource> source,
                     std::optional<int64_t> document_end)
    : job_(job),
      runner_(runner),
      source_(std::move(source)),
      data_origin_(data_origin(job.config(), /*validation=*/true)) {
  const JobConfig& c = job.config();
  const MeshLayout& mesh = job.mesh().layout();
  stream_ = std::make_unique<BatchStream>(*source_, c.validation.seq_len, c.validation.global_batch, mesh.dp,
                                          mesh.dp_index, document_end);
}

bool Evaluator::due(int64_t step) const {
  const JobConfig& c = job_.config();
  const int64_t interval = c.validation.interval;
  return interval > 0 && (step % interval == 0 || step == c.training.steps);
}

std::string Evaluator::describe() const {
  const ValidationSection& v = job_.config().validation;
  return cat("validation every ", v.interval, " step(s) and after the last: ", v.steps, " batch(es) of ",
             v.global_batch, " x ", v.seq_len, " tokens from ", source_->describe());
}

Evaluation Evaluator::run(int64_t step) {
  const JobConfig& c = job_.config();
  const auto start = std::chrono::steady_clock::now();
  Evaluation result;
  result.step = step;
  at::Tensor loss_total = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(job_.device()));
  int64_t labelled = 0;
  {
    TrainingStateKeeper keeper(job_.parts());
    ReportsSetAside aside(job_.step_metrics());
    stream_->seek(0);  // every evaluation sees the same batches: its figures compare over a run
    const int m = c.parallelism.microbatches;
    for (int64_t b = 0; b < c.validation.steps; ++b) {
      Batch batch = agreed_batch(
          job_.mesh().group(KEEL_GROUP_WORLD), job_.mesh().layout().rank, [&] { return stream_->next(); },
          data_origin_);
      labelled += batch.labelled_tokens;
      loss_total.add_(runner_.evaluate(batch.tokens.chunk(m, 0), batch.labels.chunk(m, 0)));
    }
    for (const auto& [name, value] : job_.step_metrics().resolve_across(job_.mesh().group(KEEL_GROUP_WORLD)))
      result.metrics["val_" + name] = value;
  }
  // Only last stages hold a loss (zero elsewhere), and each dp rank's last stage its own
  // batches': the world's sum over the dp ranks' token count is the token-weighted mean.
  at::Tensor count = at::full({}, static_cast<double>(labelled), at::kDouble);
  job_.mesh().group(KEEL_GROUP_DP).all_reduce(count, KEEL_REDUCE_SUM);
  at::Tensor total = loss_total.to(at::kDouble);
  job_.mesh().group(KEEL_GROUP_WORLD).all_reduce(total, KEEL_REDUCE_SUM);
  const double tokens = count.item<double>();
  result.tokens = static_cast<int64_t>(tokens);
  result.loss = total.item<double>() / std::max(tokens, 1.0);
  synchronize(job_.device());
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace keel
