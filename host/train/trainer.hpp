// The training loop of one rank, in DESIGN's step order:
//   schedule (forward/backward over microbatches) -> DP gradient reduction -> model.pre_clip
//   -> clipper.clip -> non-finite check -> AdamW -> model.post_step -> LR update -> metrics
//   -> (final) weights.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/batch_stream.hpp"
#include "data/token_source.hpp"
#include "metrics/metrics_log.hpp"
#include "optim/adamw.hpp"
#include "optim/lr_schedule.hpp"
#include "train/job.hpp"

namespace keel {

/// What a finished run reports.
struct RunSummary {
  int64_t steps_done = 0;
  double first_loss = 0, final_loss = 0;
  std::map<std::string, double> first_metrics, final_metrics;  ///< plugin metrics of the logged steps
  std::optional<double> loss_floor;
  int stop_signal = 0;  ///< the signal that stopped the run early, or 0
  std::string weights_path;
};

/// Trains a built Job.
class Trainer {
 public:
  /// Initialises weights, binds the clipper, allocates gradients and optimizer state.
  explicit Trainer(Job& job);
  /// Runs every step (or until SIGINT/SIGTERM), then saves final weights.
  RunSummary run();
  /// Runs one step; returns its loss when `read_loss` (otherwise 0, avoiding a device sync).
  double step(int64_t step, bool read_loss);
  /// The total gradient norm of the last step (reads the device).
  double last_grad_norm() const { return last_norm_.item<double>(); }
  /// The optimizer (for tests and checkpoints).
  const AdamW& optimizer() const { return *optimizer_; }
  /// Writes the logical parameters and persistent buffers to `path` as safetensors.
  void save_weights(const std::string& path, int64_t step) const;

 private:
  void reduce_gradients();
  int agreed_stop();
  void check_replicas(int64_t step) const;

  Job& job_;
  std::vector<ParamRef> params_;
  std::vector<const keel_param_info*> param_infos_;
  std::unique_ptr<TokenSource> source_;
  std::unique_ptr<BatchStream> stream_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<LrSchedule> schedule_;
  at::Tensor lr_;
  at::Tensor last_norm_, last_found_inf_, last_loss_;
};

}  // namespace keel
