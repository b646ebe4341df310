// Pipeline schedules: the order in which one pipeline rank runs the forward and backward passes
// of a step's microbatches on the model chunks it holds. Every schedule runs each chunk's
// backward passes (and, when split, its weight passes) in microbatch order, so every gradient
// accumulates in the same order and the schedules give bitwise identical steps.
#pragma once

#include <string>
#include <vector>

namespace keel {

/// One pass of one microbatch through one of the rank's model chunks (chunk_stage() says which
/// virtual stage a chunk is). Where a schedule has
/// weight passes, a backward pass computes only the gradient of the chunk's input and the
/// weight pass of the same microbatch later the parameters' gradients (split_backward.hpp).
struct PipelineAction {
  enum Kind { forward, backward, weight };
  Kind kind = forward;
  int microbatch = 0;
  int chunk = 0;

  bool operator==(const PipelineAction&) const = default;
};

/// The virtual stage of chunk `chunk` of pipeline rank `rank` (of `ranks`) under `schedule`:
/// rank + chunk * ranks (a loop: interleaving), except under "zbv", whose V places chunk 0 at
/// stage rank and chunk 1 at stage 2 ranks - 1 - rank (rank 0 holds the first and the last).
int chunk_stage(const std::string& schedule, int rank, int ranks, int chunk);

/// The pipeline rank holding virtual stage `stage` of `ranks` * chunks under `schedule`.
int stage_rank(const std::string& schedule, int stage, int ranks);

/// The actions of pipeline rank `stage` (0-based, of `stages`) holding `chunks` model chunks,
/// for `microbatches` microbatches.
///   "gpipe": every forward, then every backward (one chunk).
///   "1f1b":  min(stages - stage - 1, microbatches) warm-up forwards, then one forward and one
///            backward alternately, then the remaining backwards (PipeDream-Flush; at most
///            stages - stage activations alive; one chunk).
///   "interleaved_1f1b": Megatron-LM's interleaved order over chunks >= 2 chunks, microbatches
///            a multiple of stages: forwards take groups of `stages` microbatches through chunk
///            0, then chunk 1, ...; backwards the same groups through the chunks in reverse;
///            (stages - stage - 1) * 2 + (chunks - 1) * stages warm-up forwards (all of them
///            when microbatches == stages), then alternately, then the remaining backwards.
///   "zb_h1": ZB-H1 of Qi et al., "Zero Bubble Pipeline Parallelism" (2024), one chunk: the
///            warm-up of 1f1b, then a forward, a backward (input gradient only) and a weight
///            pass per microbatch, rank r deferring its first r weight passes to its cool-down
///            (the later the rank, the sooner its input gradients must leave). Every rank holds
///            up to `stages` microbatches until their weight passes, as 1f1b's first rank holds.
///   "zbv":   the V-shaped zero-bubble schedule of the same paper, two chunks in V placement
///            (chunk_stage), backward passes split: 2 (stages - r) - 1 forwards through chunk
///            0, r pairs of forwards through chunk 1 and 0, stages - r rounds of chunk 1's
///            forward, backward and weight pass; then per microbatch chunk 0's forward,
///            backward and weight pass and chunk 1's; a cool-down of r pairs of backward
///            passes, stages - r backward and weight passes of chunk 0, then the deferred
///            weight passes. Ideal bubble (p - 1) / (6 m + p - 1) for m >= 2 p with equal
///            passes; at most 2 stages chunk passes (stages microbatches' worth) held.
/// Throws std::invalid_argument on an unknown schedule or impossible sizes.
std::vector<PipelineAction> stage_actions(const std::string& schedule, int stage, int stages, int microbatches,
                                          int chunks = 1);

/// The forward passes of an evaluation on a rank holding `chunks` chunks: each microbatch in
/// order through the chunks in order (no backward passes, so nothing to interleave).
std::vector<PipelineAction> evaluation_actions(int microbatches, int chunks);

/// The most (microbatch, chunk) passes whose forward has run and whose backward has not (its
/// weight pass, where the schedule has them), at any point of `actions`: how many chunk
/// activations the rank holds at its peak.
int peak_in_flight(const std::vector<PipelineAction>& actions);

/// The most bytes held at any point of `actions` when a forward through chunk k keeps
/// `bytes_per_chunk[k]` until its backward (its weight pass, where the schedule has them: the
/// input pass frees what only the input's gradient needed but keeps the gradients the weight
/// pass starts from, about as much); saturates at INT64_MAX.
int64_t peak_held_bytes(const std::vector<PipelineAction>& actions, const std::vector<int64_t>& bytes_per_chunk);

/// The idle fraction of an ideal pipeline with equal stage times: (p - 1) / (v m + p - 1) for
/// p stages of v chunks each (v = 1: (p - 1) / (m + p - 1)).
double ideal_bubble_fraction(int stages, int microbatches, int chunks = 1);

/// Whether `actions` split backward passes into input and weight passes.
bool has_weight_passes(const std::vector<PipelineAction>& actions);

/// The idle fraction of zb_h1 with `microbatches` >= `stages` and passes of the given times:
/// (p - 1) (F + max(B - W, 0)) / (m (F + B + W) + (p - 1) (F + max(B - W, 0))).
double ideal_zero_bubble_fraction(int stages, int microbatches, double forward_time, double backward_time,
                                  double weight_time);

/// Runs `schedule` on `stages` ranks of `chunks` chunks as this host does (a receive waits for
/// its sender's pass, a send never waits; transfers take no time), each forward through a chunk
/// taking `forward_time`, each input-gradient pass `backward_time` and each weight-gradient
/// pass `weight_time` (a schedule without weight passes runs both in its backward), and
/// returns the idle fraction of the ranks' time over the step: the exact bubble of the
/// schedule. Throws std::logic_error if the ranks would wait on each other forever.
double simulated_bubble_fraction(const std::string& schedule, int stages, int microbatches, int chunks,
                                 double forward_time, double backward_time, double weight_time = 0);

}  // namespace keel
