#include "train/step_log.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "common/text.hpp"
#include "device/device.hpp"

namespace keel {

namespace {

std::string jsonl_path(const Job& job) {
  const bool writer = job.mesh().layout().rank == 0;
  return job.config().metrics.jsonl && writer
             ? (std::filesystem::path(job.config().job.run_dir) / "metrics.jsonl").string()
             : std::string();
}

// What TensorBoard shows of a record: metrics.jsonl's figures under its names (the ETA, a
// forecast, left out).
std::vector<std::pair<std::string, double>> scalars(const StepRecord& r) {
  std::vector<std::pair<std::string, double>> out = {{"loss", r.loss},
                                                     {"grad_norm", r.grad_norm},
                                                     {"lr", r.lr},
                                                     {"tokens_per_second", r.tokens_per_second},
                                                     {"peak_memory_bytes", r.peak_memory_bytes}};
  out.insert(out.end(), r.plugin_metrics.begin(), r.plugin_metrics.end());
  out.insert(out.end(), r.validation.begin(), r.validation.end());
  return out;
}

// Every rank's peak memory so far, by world rank. [collective: world]
std::vector<double> peaks_by_rank(Job& job) {
  std::vector<double> peaks;
  for (const std::string& text :
       all_gather_bytes(job.mesh().group(KEEL_GROUP_WORLD), format("%.17g", peak_memory_bytes(job.device())))) {
    char* end = nullptr;
    peaks.push_back(std::strtod(text.c_str(), &end));
    if (end == text.c_str() || *end != '\0') throw std::runtime_error(cat("a rank's peak memory is malformed: ", text));
  }
  return peaks;
}

}  // namespace

StepLog::StepLog(Job& job, int64_t start_step)
    : job_(job),
      start_step_(start_step),
      writer_(job.mesh().layout().rank == 0),
      log_(jsonl_path(job), start_step),
      interval_start_(clock::now()) {
  if (writer_ && job.config().metrics.tensorboard)
    tensorboard_.emplace((std::filesystem::path(job.config().job.run_dir) / "tensorboard").string(), start_step + 1);
}

bool StepLog::logs(int64_t step) const {
  const JobConfig& c = job_.config();
  return step % c.metrics.log_interval == 0 || step == start_step_ + 1 || step == c.training.steps;
}

StepRecord StepLog::write(int64_t step, double loss, double lr, const at::Tensor& grad_norm,
                          const at::Tensor& found_inf, const StepExtras& extras) {
  const Evaluation* validation = extras.validation;
  const JobConfig& c = job_.config();
  synchronize(job_.device());
  if (validation != nullptr) excluded_seconds_ += validation->seconds;
  const double seconds =
      std::max(std::chrono::duration<double>(clock::now() - interval_start_).count() - excluded_seconds_, 0.0);
  const double tokens_per_step = static_cast<double>(c.training.global_batch * c.training.seq_len);
  StepRecord r;
  r.step = step;
  r.total_steps = c.training.steps;
  r.loss = loss;
  r.grad_norm = grad_norm.item<double>();
  r.lr = lr;
  r.tokens_per_second = seconds > 0 ? tokens_per_step * static_cast<double>(interval_steps_) / seconds : 0;
  r.eta_seconds = seconds / static_cast<double>(interval_steps_) * static_cast<double>(c.training.steps - step);
  r.peak_memory_by_rank = peaks_by_rank(job_);
  r.peak_memory_bytes = *std::max_element(r.peak_memory_by_rank.begin(), r.peak_memory_by_rank.end());
  r.skipped = found_inf.item<float>() != 0.0f;
  r.plugin_metrics = job_.step_metrics().resolve_across(job_.mesh().group(KEEL_GROUP_WORLD));
  if (validation != nullptr) {
    r.validation = validation->figures();
    r.validation["val_tokens"] = static_cast<double>(validation->tokens);
    r.validation["val_seconds"] = validation->seconds;
  }
  r.profile_traces = extras.profile_traces;
  r.source_tokens = extras.source_tokens;
  if (writer_) log_.write(r);
  if (tensorboard_) tensorboard_->write_step(step, scalars(r));
  interval_start_ = clock::now();
  interval_steps_ = 0;
  excluded_seconds_ = 0;
  return r;
}

}  // namespace keel
