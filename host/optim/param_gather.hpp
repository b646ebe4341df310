// The end of a sharded optimizer step: every member of a reduction group stepped only its
// range of each gradient bucket (optim/optimizer_shards.hpp), so the updated rows travel to
// the other members — one all-gather per bucket, each member's range padded to the longest.
// The bytes are copied as they are, so every member ends with bitwise the same parameters.
// The staging buffers (a rank's range and every member's) are allocated once.
#pragma once

#include <ATen/ATen.h>

#include <utility>
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
  /// Bytes of the staging buffers.
  int64_t bytes() const;
  /// The bytes a ParameterGather over `layout` allocates in groups of `dense_members` (dp) and
  /// `expert_members` (edp) members (what a memory plan reads).
  static int64_t staging_bytes(const BucketLayout& layout, const std::vector<ParamRef>& params, int dense_members,
                               int expert_members);

 private:
  struct Bucket {
    Group* group = nullptr;
    int64_t longest = 0;                             ///< elements of the longest member range
    std::vector<std::vector<at::Tensor>> by_member;  ///< each member's pieces, flat views
    at::Tensor send, received;                       ///< views of the staging buffers
  };
  std::vector<std::pair<at::Tensor, at::Tensor>> staging_;  ///< per gradient buffer: send, receive
  std::vector<Bucket> buckets_;
};

}  // namespace keel
