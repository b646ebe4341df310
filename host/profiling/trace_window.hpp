// [profiling]: LibTorch's (Kineto's) profiler over a window of steps, one Chrome trace per rank
// per window, with Keel's phases as named ranges (common/trace_scope.hpp). Off, and outside the
// window, it costs nothing: no profiler runs, and a range is a check of a global flag.
#pragma once

#include <cstdint>
#include <string>

#include "config/job_config.hpp"

namespace keel {

/// The profiled windows of one rank's run.
class TraceWindow {
 public:
  /// `cuda`: CUDA kernels join the CPU operators in the trace.
  TraceWindow(const ProfilingSection& settings, int rank, bool cuda);
  ~TraceWindow();
  TraceWindow(const TraceWindow&) = delete;
  TraceWindow& operator=(const TraceWindow&) = delete;

  /// Starts the profiler when `step` opens a window.
  void before_step(int64_t step);
  /// Whether `step` closes a window (its log line names the trace folder).
  bool closes_at(int64_t step) const;
  /// The folder the traces of the window that `step` closes go to.
  std::string folder_of(int64_t step) const;
  /// Stops the profiler and writes this rank's trace when `step` closes a window, or when
  /// `stopping` (the run ends early inside one). A trace that cannot be written is a warning
  /// naming the file: training goes on. Returns the trace's path, or "".
  std::string after_step(int64_t step, bool stopping = false);

 private:
  int64_t window_start(int64_t step) const;  ///< the first step of the window holding `step`, or -1

  ProfilingSection settings_;
  int rank_;
  bool cuda_;
  int64_t open_since_ = -1;  ///< the first step of the running window, -1 when none runs
};

}  // namespace keel
