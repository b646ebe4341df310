// Pipeline schedules: the order in which one stage runs the forward and backward passes of a
// step's microbatches. Both schedules run the backward passes in microbatch order, so every
// gradient accumulates in the same order and GPipe and 1F1B give bitwise identical steps.
#pragma once

#include <string>
#include <vector>

namespace keel {

/// One pass of one microbatch on one stage.
struct PipelineAction {
  enum Kind { forward, backward };
  Kind kind = forward;
  int microbatch = 0;

  bool operator==(const PipelineAction&) const = default;
};

/// The actions of `stage` (0-based, of `stages`) for `microbatches` microbatches.
///   "gpipe": every forward, then every backward.
///   "1f1b":  min(stages - stage - 1, microbatches) warm-up forwards, then one forward and one
///            backward alternately, then the remaining backwards (PipeDream-Flush; at most
///            stages - stage activations alive).
/// Throws std::invalid_argument on an unknown schedule or impossible sizes.
std::vector<PipelineAction> stage_actions(const std::string& schedule, int stage, int stages, int microbatches);

/// The most microbatches whose forward has run and whose backward has not, at any point of
/// `actions`: how many microbatches' activations the stage holds at its peak.
int peak_in_flight(const std::vector<PipelineAction>& actions);

/// The idle fraction of an ideal pipeline with equal stage times: (p - 1) / (m + p - 1).
double ideal_bubble_fraction(int stages, int microbatches);

}  // namespace keel
