#include "progress.hpp"

#include <unistd.h>

#include <cstdio>

namespace keel::data {

Progress::Progress(uint64_t total_bytes) : total_(total_bytes), terminal_(::isatty(STDERR_FILENO) != 0) {}

double Progress::elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

void Progress::update(uint64_t done_bytes) {
  const Clock::time_point now = Clock::now();
  if (now - last_ < std::chrono::seconds(1)) return;
  last_ = now;
  const double seconds = elapsed();
  const double percent = total_ > 0 ? 100.0 * static_cast<double>(done_bytes) / static_cast<double>(total_) : 100.0;
  // On a terminal the line rewrites itself; in a log, one line a second.
  std::fprintf(stderr, "%skeel-data: %.1f of %.1f MB (%.0f%%), %.1f MB/s%s", terminal_ ? "\r" : "", done_bytes / 1e6,
               total_ / 1e6, percent, seconds > 0 ? done_bytes / 1e6 / seconds : 0.0, terminal_ ? "" : "\n");
  std::fflush(stderr);
  printed_ = true;
}

void Progress::finish() {
  if (printed_ && terminal_) std::fputc('\n', stderr);
  printed_ = false;
}

}  // namespace keel::data
