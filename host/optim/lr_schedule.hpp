// Learning-rate schedule: linear warmup, then cosine, linear or constant decay to
// min_lr_ratio x lr at the last step.
#pragma once

#include <cstdint>
#include <string>

namespace keel {

/// The schedule of one run.
class LrSchedule {
 public:
  LrSchedule(double lr, int64_t warmup_steps, int64_t total_steps, std::string decay, double min_lr_ratio);
  /// The learning rate of step `step` (1-based).
  double at(int64_t step) const;

 private:
  double lr_;
  int64_t warmup_, total_;
  std::string decay_;
  double min_ratio_;
};

}  // namespace keel
