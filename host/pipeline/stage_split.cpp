#include "pipeline/stage_split.hpp"

#include <stdexcept>

#include "common/text.hpp"

namespace keel {

std::vector<StageLayers> split_layers(int num_layers, int stages) {
  if (stages < 1) throw std::invalid_argument("the number of stages must be positive");
  if (num_layers < stages)
    throw std::invalid_argument(
        cat("the model has ", num_layers, " layers, fewer than the ", stages, " pipeline stages"));
  std::vector<StageLayers> out;
  int base = num_layers / stages, extra = num_layers % stages, first = 0;
  for (int s = 0; s < stages; ++s) {
    int count = base + (s < extra ? 1 : 0);
    out.push_back({first, count});
    first += count;
  }
  return out;
}

std::vector<StageLayers> split_layers(int num_layers, const std::vector<int64_t>& counts) {
  std::vector<StageLayers> out;
  int64_t first = 0;
  for (size_t s = 0; s < counts.size(); ++s) {
    if (counts[s] < 0) throw std::invalid_argument(cat("stage ", s, " is given ", counts[s], " layers"));
    out.push_back({static_cast<int>(first), static_cast<int>(counts[s])});
    first += counts[s];
  }
  if (first != num_layers)
    throw std::invalid_argument(cat("the counts sum to ", first, " layers, but the model has ", num_layers));
  return out;
}

}  // namespace keel
