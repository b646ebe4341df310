#include "optim/lr_schedule.hpp"

#include <algorithm>
#include <cmath>

namespace keel {

LrSchedule::LrSchedule(double lr, int64_t warmup_steps, int64_t total_steps, std::string decay, double min_lr_ratio)
    : lr_(lr), warmup_(warmup_steps), total_(total_steps), decay_(std::move(decay)), min_ratio_(min_lr_ratio) {}

double LrSchedule::at(int64_t step) const {
  if (step <= warmup_) return lr_ * static_cast<double>(step) / static_cast<double>(warmup_);
  if (decay_ == "constant" || total_ <= warmup_) return lr_;
  double progress = static_cast<double>(step - warmup_) / static_cast<double>(total_ - warmup_);
  progress = std::clamp(progress, 0.0, 1.0);
  double factor = decay_ == "linear" ? 1.0 - progress : 0.5 * (1.0 + std::cos(M_PI * progress));
  return lr_ * (min_ratio_ + (1.0 - min_ratio_) * factor);
}

}  // namespace keel
