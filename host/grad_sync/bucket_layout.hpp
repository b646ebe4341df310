// Where every gradient lives: one flat buffer per (reduction group, dtype, device) — dense
// parameters over dp, expert shards over edp — holding the parameters in their listed order,
// cut into buckets of about `bucket_bytes`. A pure function of the parameters' shapes, so the
// dry run plans on meta tensors exactly what a trainer lays out, and the sharded optimizer cuts
// the same buckets every member of a group sees.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "plugins/components.hpp"

namespace keel {

/// One parameter's gradient inside a bucket.
struct BucketMember {
  size_t param = 0;    ///< index into the parameter list
  int64_t offset = 0;  ///< first element, counted from the bucket's start
  int64_t numel = 0;
};

/// A contiguous slice of one buffer, reduced by one collective.
struct BucketSpan {
  size_t buffer = 0;
  int64_t start = 0;  ///< first element in the buffer
  int64_t numel = 0;
  bool expert = false;  ///< reduced over edp (else dp)
  std::vector<BucketMember> members;
};

/// One flat gradient buffer.
struct BufferSpan {
  bool expert = false;
  at::TensorOptions options;  ///< the parameters' dtype and device
  int64_t numel = 0;
};

struct BucketLayout {
  std::vector<BufferSpan> buffers;
  std::vector<BucketSpan> buckets;
};

/// The buffers and buckets of `params` (a bucket closes once it holds `bucket_bytes` or more;
/// 0 puts every parameter in a bucket of its own). Every member of a group lists the same
/// parameters in the same order, so the buckets line up across ranks.
BucketLayout plan_buckets(const std::vector<ParamRef>& params, int64_t bucket_bytes);

}  // namespace keel
