// The end of a sharded optimizer step: every member of a reduction group stepped only its
// range of each gradient bucket (optim/optimizer_shards.hpp), so the updated rows travel to
// the other members — one all-gather per bucket, each member's range padded to the longest.
// The bytes are copied as they are, so every member ends with bitwise the same parameters.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "grad_sync/bucket_layout.hpp"
#include "mesh/mesh.hpp"
#include "optim/optimizer_shards.hpp"

namespace keel {

class ParameterGather {
 public:
  /// The buckets of `layout` whose group has several members, cut as optimizer_pieces() cuts
  /// them; `params` are the parameters the layout indexes.
  ParameterGather(const BucketLayout& layout, const std::vector<ParamRef>& params, Mesh& mesh);
  /// Copies every member's updated rows into every other member's parameters.
  /// [collective: dp, edp]
  void run();
  /// Number of all-gathers one run() issues on this rank.
  size_t collectives_per_step() const { return buckets_.size(); }

 private:
  struct Bucket {
    Group* group = nullptr;
    at::TensorOptions options;                       ///< the buffer's dtype and device
    int64_t longest = 0;                             ///< elements of the longest member range
    std::vector<std::vector<at::Tensor>> by_member;  ///< each member's pieces, flat views
  };
  std::vector<Bucket> buckets_;
};

}  // namespace keel
