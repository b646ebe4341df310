// The run's step log: which steps are logged, and the record of each (throughput and ETA over
// the steps since the previous logged one, the plugins' metrics agreed across ranks), written
// by rank 0 to the log, to metrics.jsonl and, with metrics.tensorboard, to TensorBoard event files.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>

#include "metrics/metrics_log.hpp"
#include "metrics/tensorboard_writer.hpp"
#include "train/evaluator.hpp"
#include "train/job.hpp"

namespace keel {

/// What joins a step's record beside the step's own figures.
struct StepExtras {
  const Evaluation* validation = nullptr;       ///< the evaluation after the step, if any
  std::string profile_traces;                   ///< the folder of the profiler window it closes, or ""
  std::map<std::string, double> source_tokens;  ///< [[data.sources]]: tokens drawn per source so far
};

/// Logs the steps of one run.
class StepLog {
 public:
  /// Opens the log of a run that starts after `start_step` (a resumed run's metrics.jsonl is
  /// continued after it, its TensorBoard events go to a new file that supersedes the steps after
  /// it); the first interval starts now.
  StepLog(Job& job, int64_t start_step);
  /// Whether step `step` is logged: every metrics.log_interval steps, and the run's first and
  /// last steps.
  bool logs(int64_t step) const;
  /// Counts a finished step into the interval of the next logged one.
  void count_step() { ++interval_steps_; }
  /// Logs step `step` (waits for the device) and starts the next interval; returns the record.
  /// `extras` join the record; an evaluation's time is left out of the throughput.
  /// [collective: world]
  StepRecord write(int64_t step, double loss, double lr, const at::Tensor& grad_norm, const at::Tensor& found_inf,
                   const StepExtras& extras = {});

 private:
  using clock = std::chrono::steady_clock;

  Job& job_;
  int64_t start_step_;
  bool writer_;  ///< rank 0 writes what every rank knows
  MetricsLog log_;
  std::optional<TensorBoardWriter> tensorboard_;  ///< on the writer, with metrics.tensorboard
  clock::time_point interval_start_;
  int64_t interval_steps_ = 0;
  double excluded_seconds_ = 0;  ///< evaluations since interval_start_
};

}  // namespace keel
