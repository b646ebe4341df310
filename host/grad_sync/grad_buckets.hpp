// Data-parallel gradient synchronisation. Every parameter's gradient is a view into a flat
// buffer of its reduction group — dense parameters (REPLICA copies included) over dp, expert
// shards over edp — so zeroing is one kernel per buffer and the reduction is one all-reduce
// per bucket of about `bucket_bytes`, all in flight at once. The views are set once and never
// freed: autograd accumulates into them in place, and clippers and the optimizer see them as
// ordinary .grad() tensors.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "mesh/mesh.hpp"
#include "plugins/components.hpp"

namespace keel {

class GradientBuckets {
 public:
  /// Gives every parameter in `params` a zeroed gradient view into its group's flat buffer.
  GradientBuckets(const std::vector<ParamRef>& params, Mesh& mesh, int64_t bucket_bytes);
  /// Zeroes every gradient in place.
  void zero();
  /// SUM-reduces every gradient over its group (dense: dp, expert: edp). [collective: dp, edp]
  void reduce();
  /// Number of all-reduces one reduce() issues on this rank (0 when dp = 1).
  size_t collectives_per_step() const;
  /// Bytes of the flat buffers (every gradient of this rank).
  int64_t bytes() const;

 private:
  struct Bucket {
    at::Tensor flat;  ///< a contiguous slice of a buffer
    Group* group = nullptr;
  };
  std::vector<at::Tensor> buffers_;
  std::vector<Bucket> buckets_;
};

}  // namespace keel
