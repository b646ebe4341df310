// The end of a sharded optimizer step: every member of a reduction group stepped only its
// range of each gradient bucket (optim/optimizer_shards.hpp), so the updated rows travel to
// the other members — each member broadcasts its range in turn (the bytes of one all-gather)
// through a staging buffer of the longest range, allocated once. The bytes are copied as
// they are, so every member ends with bitwise the same parameters.
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
  /// Number of buckets whose rows one run() brings to the other members (one broadcast per
  /// member each).
  size_t buckets() const { return buckets_.size(); }
  /// Bytes of the staging buffers.
  int64_t bytes() const;
  /// The bytes a ParameterGather over `layout` allocates in groups of `dense_members` (dp) and
  /// `expert_members` (edp) members (what a memory plan reads).
  static int64_t staging_bytes(const BucketLayout& layout, const std::vector<ParamRef>& params, int dense_members,
                               int expert_members);

 private:
  struct Bucket {
    Group* group = nullptr;
    std::vector<std::vector<at::Tensor>> by_member;  ///< each member's pieces, flat views
    std::vector<int64_t> elements;                   ///< each member's range
    at::Tensor staging;                              ///< its buffer's staging buffer
  };
  std::vector<at::Tensor> staging_;  ///< per gradient buffer
  std::vector<Bucket> buckets_;
};

}  // namespace keel
