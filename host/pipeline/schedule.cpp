#include "pipeline/schedule.hpp"

#include <algorithm>
#include <stdexcept>

#include "common/text.hpp"

namespace keel {

std::vector<PipelineAction> stage_actions(const std::string& schedule, int stage, int stages, int microbatches) {
  if (stages < 1 || microbatches < 1 || stage < 0 || stage >= stages)
    throw std::invalid_argument(
        cat("pipeline: stage ", stage, " of ", stages, " with ", microbatches, " microbatches is impossible"));
  std::vector<PipelineAction> out;
  auto forward = [&](int mb) { out.push_back({PipelineAction::forward, mb}); };
  auto backward = [&](int mb) { out.push_back({PipelineAction::backward, mb}); };
  if (schedule == "gpipe") {
    for (int mb = 0; mb < microbatches; ++mb) forward(mb);
    for (int mb = 0; mb < microbatches; ++mb) backward(mb);
    return out;
  }
  if (schedule != "1f1b") throw std::invalid_argument(cat("pipeline: unknown schedule '", schedule, "'"));
  const int warmup = std::min(stages - stage - 1, microbatches);
  for (int mb = 0; mb < warmup; ++mb) forward(mb);
  for (int i = 0; i < microbatches - warmup; ++i) {
    forward(warmup + i);
    backward(i);
  }
  for (int mb = microbatches - warmup; mb < microbatches; ++mb) backward(mb);
  return out;
}

int peak_in_flight(const std::vector<PipelineAction>& actions) {
  int alive = 0, peak = 0;
  for (const PipelineAction& a : actions) {
    alive += a.kind == PipelineAction::forward ? 1 : -1;
    peak = std::max(peak, alive);
  }
  return peak;
}

double ideal_bubble_fraction(int stages, int microbatches) {
  return static_cast<double>(stages - 1) / static_cast<double>(microbatches + stages - 1);
}

}  // namespace keel
