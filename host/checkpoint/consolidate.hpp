// Consolidation: whole logical tensors on world rank 0, assembled from the pieces the ranks
// hold (a stage's parameters, an expert shard). Used for the single-file final weights; a
// model too large for one host's memory is saved as a sharded checkpoint instead.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/tensor_piece.hpp"
#include "mesh/group.hpp"

namespace keel {

/// Every rank's pieces assembled into whole CPU tensors on world rank 0, sorted by key (empty
/// on other ranks). Each key must be covered exactly once: a key given whole by two ranks, or
/// shards that overlap or leave a gap, are errors naming the key. [collective: world]
std::vector<std::pair<std::string, at::Tensor>> consolidate(const std::vector<TensorPiece>& mine, Group& world);

}  // namespace keel
