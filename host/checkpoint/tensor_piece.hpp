// A piece of a logical tensor that one rank holds: the whole tensor, or a slice along one
// dimension (an expert shard). Checkpoints and consolidation speak in pieces.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace keel {

struct TensorPiece {
  std::string key;
  at::Tensor tensor;
  int32_t shard_dim = -1;  ///< -1: the whole tensor; else a slice along this dim
  int64_t shard_offset = 0;
  int64_t global_dim_size = 0;

  /// The global tensor's shape.
  std::vector<int64_t> global_shape() const {
    std::vector<int64_t> shape = tensor.sizes().vec();
    if (shard_dim >= 0) shape[static_cast<size_t>(shard_dim)] = global_dim_size;
    return shape;
  }
  /// Where the piece starts in the global tensor, per dimension.
  std::vector<int64_t> offsets() const {
    std::vector<int64_t> out(static_cast<size_t>(tensor.dim()), 0);
    if (shard_dim >= 0) out[static_cast<size_t>(shard_dim)] = shard_offset;
    return out;
  }
};

}  // namespace keel
