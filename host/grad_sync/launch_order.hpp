// The order in which gradient buckets start reducing while the last backward pass of a step
// runs. A process group's collectives must be issued in one order on every member, but which
// gradients become final first can differ between ranks (an expert that got no token, a debug
// fault); so each group's buckets start strictly from its last bucket to its first — backward
// finishes the last parameters first — and a bucket starts once every gradient in it is final
// and every later bucket of its group has started.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace keel {

class LaunchOrder {
 public:
  /// Bucket b belongs to group `group_of[b]` (ids 0..n-1) and holds `gradients[b]` gradients.
  LaunchOrder(const std::vector<int>& group_of, std::vector<int64_t> gradients);
  /// A new backward pass: no gradient final, no bucket started.
  void reset();
  /// One more gradient of bucket `b` is final; returns the buckets that start now, in order.
  std::vector<size_t> gradient_final(size_t b);
  /// Every bucket not started yet, in the order they must start (group by group).
  std::vector<size_t> rest();
  /// Buckets started by gradient_final() since the last reset().
  size_t started_early() const { return started_early_; }

 private:
  std::vector<size_t> advance(int group);

  std::vector<int> group_of_;
  std::vector<int64_t> gradients_, remaining_;
  std::vector<std::vector<size_t>> order_;  ///< each group's buckets, last first
  std::vector<size_t> cursor_;              ///< each group's next bucket to start
  size_t started_early_ = 0;
};

}  // namespace keel
