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

}  // namespace keel
