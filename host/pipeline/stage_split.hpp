// How a model's layers are cut into pipeline stages.
#pragma once

#include <cstdint>
#include <vector>

namespace keel {

/// The layers [first, first + count) of one stage.
struct StageLayers {
  int first = 0;
  int count = 0;
};

/// Splits `num_layers` over `stages` by layer count, earlier stages taking the remainder
/// (the last stage also holds the head, and MTP when present). Throws std::invalid_argument
/// when there are fewer layers than stages.
std::vector<StageLayers> split_layers(int num_layers, int stages);

/// The split given layer counts per stage (`counts.size()` stages, each count >= 0, summing
/// to `num_layers`). Throws std::invalid_argument saying which condition fails.
std::vector<StageLayers> split_layers(int num_layers, const std::vector<int64_t>& counts);

}  // namespace keel
