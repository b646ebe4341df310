// Named scalars that components report during a step. Values stay device tensors until the
// step is logged, so reporting never synchronises with the device.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <mutex>
#include <string>

#include <keel/keel.h>

#include "mesh/group.hpp"

namespace keel {

/// Per-step accumulators of reported metrics. report() may arrive from any thread (a plugin's
/// code inside autograd's backward); the step's reports are read on the train thread.
class StepMetrics {
 public:
  /// Adds one report of `name` (a scalar tensor, detached here).
  void report(const std::string& name, const at::Tensor& value, keel_metric_reduce reduce);
  /// Adds one report of the ratio `name`: its value is the sum of the numerators of the step
  /// (all ranks, with resolve_across) over the sum of the denominators, NaN when that is 0.
  void report_ratio(const std::string& name, const at::Tensor& numerator, const at::Tensor& denominator);
  /// The reduced values of this step, read from the device.
  std::map<std::string, double> resolve() const;
  /// The values of this step over every rank of `world`: MEAN averages all reports of all
  /// ranks, SUM adds them, MAX takes the largest, LAST the lowest rank's, a ratio divides the
  /// sums of all ranks. [collective: world]
  std::map<std::string, double> resolve_across(Group& world) const;
  /// Exchanges the reports of this and `other` (an evaluation collects its own meanwhile).
  void swap(StepMetrics& other) {
    std::scoped_lock lock(mutex_, other.mutex_);
    entries_.swap(other.entries_);
  }
  /// Forgets this step's reports.
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    entries_.clear();
  }

 private:
  struct Entry {
    at::Tensor value;
    keel_metric_reduce reduce = KEEL_METRIC_MEAN;
    int64_t count = 0;
    at::Tensor denominator;  ///< defined for a ratio only
  };
  std::map<std::string, Entry> entries_;
  mutable std::mutex mutex_;
};

}  // namespace keel
