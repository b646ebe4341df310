#include "profiling/trace_window.hpp"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <set>
#include <system_error>

#include "common/log.hpp"
#include "common/text.hpp"

namespace keel {

namespace {

namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;

std::set<ActivityType> activities(bool cuda) {
  std::set<ActivityType> out{ActivityType::CPU};
  if (cuda) out.insert(ActivityType::CUDA);
  return out;
}

}  // namespace

TraceWindow::TraceWindow(const ProfilingSection& settings, int rank, bool cuda)
    : settings_(settings), rank_(rank), cuda_(cuda) {}

TraceWindow::~TraceWindow() {
  // A run that failed inside a window: the profiler is stopped, its trace dropped.
  if (open_since_ >= 0) {
    try {
      profiler::disableProfiler();
    } catch (...) {
    }
  }
}

int64_t TraceWindow::window_start(int64_t step) const {
  if (!settings_.enable || step < settings_.first) return -1;
  const int64_t since = step - settings_.first;
  const int64_t offset = settings_.interval > 0 ? since % settings_.interval : since;
  return offset <= settings_.last - settings_.first ? step - offset : -1;
}

void TraceWindow::before_step(int64_t step) {
  if (open_since_ >= 0 || window_start(step) < 0) return;
  // A run resumed inside a window profiles the rest of it. Kineto's own log lines (its start
  // and stop, a CUDA device count it cannot read on a CPU machine) stay out of the run's log
  // unless the user asks for them with KINETO_LOG_LEVEL; a trace it cannot write is reported
  // below.
  setenv("KINETO_LOG_LEVEL", "6", /*overwrite=*/0);
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  profiler::prepareProfiler(config, activities(cuda_));
  profiler::enableProfiler(config, activities(cuda_));
  open_since_ = step;
}

bool TraceWindow::closes_at(int64_t step) const {
  const int64_t start = window_start(step);
  return start >= 0 && step == start + (settings_.last - settings_.first);
}

std::string TraceWindow::folder_of(int64_t step) const {
  const int64_t start = window_start(step);
  return cat(settings_.folder, "/steps-", start, "-", start + (settings_.last - settings_.first));
}

std::string TraceWindow::after_step(int64_t step, bool stopping) {
  if (open_since_ < 0 || (!closes_at(step) && !stopping)) return "";
  const std::string folder = folder_of(step);
  open_since_ = -1;
  const std::string path = cat(folder, "/rank-", rank_, ".json");
  try {
    std::unique_ptr<profiler::ProfilerResult> result = profiler::disableProfiler();
    std::filesystem::create_directories(folder);
    // Written whole, then renamed: a reader never opens half a trace.
    const std::string partial = path + ".partial";
    result->save(partial);
    std::filesystem::rename(partial, path);
  } catch (const c10::Error& e) {
    log_warn(cat("profiling: the trace of steps ", window_start(step), "-", step, " could not be written to ", path,
                 ": ", e.what_without_backtrace(), " (training goes on)"));
    return "";
  } catch (const std::exception& e) {
    log_warn(cat("profiling: the trace of steps ", window_start(step), "-", step, " could not be written to ", path,
                 ": ", e.what(), " (training goes on)"));
    return "";
  }
  return path;
}

}  // namespace keel
