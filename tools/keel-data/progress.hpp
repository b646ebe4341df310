// keel-data's progress line on standard error: input bytes done of the total, at most once a
// second, so a long build shows it is moving and a short one prints nothing.
#pragma once

#include <chrono>
#include <cstdint>

namespace keel::data {

/// Reports how much of the input has been read.
class Progress {
 public:
  /// `total_bytes`: the size of every input together.
  explicit Progress(uint64_t total_bytes);
  /// Notes that `done_bytes` of the input have been consumed; prints when a second has passed.
  void update(uint64_t done_bytes);
  /// Ends the line if one was printed.
  void finish();
  /// Seconds since construction.
  double elapsed() const;

 private:
  using Clock = std::chrono::steady_clock;
  uint64_t total_;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_ = start_;
  bool printed_ = false;
  bool terminal_;
};

}  // namespace keel::data
