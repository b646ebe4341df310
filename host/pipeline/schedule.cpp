#include "pipeline/schedule.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <utility>

#include "common/text.hpp"

namespace keel {

namespace {

// Megatron-LM's interleaved 1F1B (forward_backward_pipelining_with_interleaving): virtual
// microbatch k of the forward order passes microbatch (k / (p v)) p + k % p through chunk
// (k / p) % v; the backward order the same microbatches through the chunks in reverse.
std::vector<PipelineAction> interleaved(int stage, int stages, int microbatches, int chunks) {
  if (chunks < 2)
    throw std::invalid_argument(cat("pipeline: interleaved_1f1b needs 2 or more chunks per rank, got ", chunks));
  if (microbatches % stages != 0)
    throw std::invalid_argument(cat("pipeline: interleaved_1f1b needs microbatches to be a multiple of the ", stages,
                                    " pipeline ranks, got ", microbatches));
  const int total = microbatches * chunks, group = stages * chunks;
  auto pass = [&](PipelineAction::Kind kind, int k) {
    const int chunk = (k % group) / stages;
    return PipelineAction{kind, (k / group) * stages + k % stages,
                          kind == PipelineAction::forward ? chunk : chunks - 1 - chunk};
  };
  const int warmup = microbatches == stages ? total : std::min((stages - stage - 1) * 2 + (chunks - 1) * stages, total);
  std::vector<PipelineAction> out;
  for (int k = 0; k < warmup; ++k) out.push_back(pass(PipelineAction::forward, k));
  for (int i = 0; i < total - warmup; ++i) {
    out.push_back(pass(PipelineAction::forward, warmup + i));
    out.push_back(pass(PipelineAction::backward, i));
  }
  for (int k = total - warmup; k < total; ++k) out.push_back(pass(PipelineAction::backward, k));
  return out;
}

// The V-shaped zero-bubble order (schedule.hpp). Each counter walks one chunk's passes in
// microbatch order, so gradients accumulate as under every other schedule.
std::vector<PipelineAction> zero_bubble_v(int rank, int ranks, int microbatches, int chunks) {
  if (chunks != 2) throw std::invalid_argument(cat("pipeline: zbv runs 2 chunks per rank, got ", chunks));
  std::vector<PipelineAction> out;
  int forwards[2] = {0, 0}, backwards[2] = {0, 0}, weights[2] = {0, 0};
  const int m = microbatches;
  auto forward = [&](int c) {
    if (forwards[c] < m) out.push_back({PipelineAction::forward, forwards[c]++, c});
  };
  auto backward = [&](int c) {
    if (backwards[c] < forwards[c]) out.push_back({PipelineAction::backward, backwards[c]++, c});
  };
  auto weight = [&](int c) {
    if (weights[c] < backwards[c]) out.push_back({PipelineAction::weight, weights[c]++, c});
  };
  auto all_three = [&](int c) {  // the next microbatch through chunk c, start to end
    forward(c);
    backward(c);
    weight(c);
  };
  for (int i = 0; i < 2 * (ranks - rank) - 1; ++i) forward(0);
  for (int i = 0; i < rank; ++i) {
    forward(1);
    forward(0);
  }
  for (int i = 0; i < ranks - rank; ++i) all_three(1);
  while (forwards[1] < forwards[0] || forwards[0] < m) {
    forward(0);
    if (backwards[0] < backwards[1]) {
      backward(0);
      weight(0);
    }
    all_three(1);
  }
  for (int i = 0; i < rank; ++i) {
    backward(0);
    backward(1);
  }
  for (int i = 0; i < ranks - rank; ++i) {
    backward(0);
    weight(0);
  }
  while (backwards[1] < m) backward(1);
  while (backwards[0] < m) backward(0);
  while (weights[1] < m) weight(1);
  while (weights[0] < m) weight(0);
  return out;
}

}  // namespace

int chunk_stage(const std::string& schedule, int rank, int ranks, int chunk) {
  if (schedule == "zbv") return chunk == 0 ? rank : 2 * ranks - 1 - rank;
  return rank + chunk * ranks;
}

int stage_rank(const std::string& schedule, int stage, int ranks) {
  if (schedule == "zbv") return stage < ranks ? stage : 2 * ranks - 1 - stage;
  return stage % ranks;
}

std::vector<PipelineAction> stage_actions(const std::string& schedule, int stage, int stages, int microbatches,
                                          int chunks) {
  if (stages < 1 || microbatches < 1 || stage < 0 || stage >= stages || chunks < 1)
    throw std::invalid_argument(cat("pipeline: stage ", stage, " of ", stages, " with ", microbatches,
                                    " microbatches and ", chunks, " chunk(s) is impossible"));
  if (schedule == "interleaved_1f1b") return interleaved(stage, stages, microbatches, chunks);
  if (schedule == "zbv") return zero_bubble_v(stage, stages, microbatches, chunks);
  if (chunks != 1) throw std::invalid_argument(cat("pipeline: ", schedule, " runs one chunk per rank, got ", chunks));
  std::vector<PipelineAction> out;
  auto forward = [&](int mb) { out.push_back({PipelineAction::forward, mb}); };
  auto backward = [&](int mb) { out.push_back({PipelineAction::backward, mb}); };
  auto weight = [&](int mb) { out.push_back({PipelineAction::weight, mb}); };
  if (schedule == "zb_h1") {
    // 1f1b's order with each backward split; the first `stage` weight passes wait for the
    // cool-down, so a gradient reaches the rank before it sooner by a weight pass per rank.
    const int warmup = std::min(stages - stage - 1, microbatches);
    for (int mb = 0; mb < warmup; ++mb) forward(mb);
    int weights = 0;
    for (int i = 0; i < microbatches; ++i) {
      if (warmup + i < microbatches) forward(warmup + i);
      backward(i);
      if (i >= stage) weight(weights++);
    }
    while (weights < microbatches) weight(weights++);
    return out;
  }
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

std::vector<PipelineAction> evaluation_actions(int microbatches, int chunks) {
  std::vector<PipelineAction> out;
  for (int mb = 0; mb < microbatches; ++mb)
    for (int chunk = 0; chunk < chunks; ++chunk) out.push_back({PipelineAction::forward, mb, chunk});
  return out;
}

bool has_weight_passes(const std::vector<PipelineAction>& actions) {
  return std::any_of(actions.begin(), actions.end(),
                     [](const PipelineAction& a) { return a.kind == PipelineAction::weight; });
}

int peak_in_flight(const std::vector<PipelineAction>& actions) {
  const PipelineAction::Kind releases = has_weight_passes(actions) ? PipelineAction::weight : PipelineAction::backward;
  int alive = 0, peak = 0;
  for (const PipelineAction& a : actions) {
    if (a.kind == PipelineAction::forward) ++alive;
    if (a.kind == releases) --alive;
    peak = std::max(peak, alive);
  }
  return peak;
}

int64_t peak_held_bytes(const std::vector<PipelineAction>& actions, const std::vector<int64_t>& bytes_per_chunk) {
  // Counted in wide integers: the figures come from a plugin, and a huge one must not wrap.
  const PipelineAction::Kind releases = has_weight_passes(actions) ? PipelineAction::weight : PipelineAction::backward;
  __int128 held = 0, peak = 0;
  for (const PipelineAction& a : actions) {
    const __int128 bytes = bytes_per_chunk.at(static_cast<size_t>(a.chunk));
    if (a.kind == PipelineAction::forward) held += bytes;
    if (a.kind == releases) held -= bytes;
    peak = std::max(peak, held);
  }
  constexpr __int128 most = std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(std::min(peak, most));
}

double ideal_bubble_fraction(int stages, int microbatches, int chunks) {
  return static_cast<double>(stages - 1) / static_cast<double>(chunks * microbatches + stages - 1);
}

double ideal_zero_bubble_fraction(int stages, int microbatches, double forward_time, double backward_time,
                                  double weight_time) {
  const double idle = (stages - 1) * (forward_time + std::max(backward_time - weight_time, 0.0));
  return idle / (microbatches * (forward_time + backward_time + weight_time) + idle);
}

double simulated_bubble_fraction(const std::string& schedule, int stages, int microbatches, int chunks,
                                 double forward_time, double backward_time, double weight_time) {
  const int virtual_stages = stages * chunks;
  std::vector<std::vector<PipelineAction>> actions;
  for (int r = 0; r < stages; ++r) actions.push_back(stage_actions(schedule, r, stages, microbatches, chunks));
  const bool split = has_weight_passes(actions.front());
  // When each (virtual stage, microbatch) pass finished; negative: not yet run.
  auto slot = [&](int stage, int mb) {
    return static_cast<size_t>(stage) * static_cast<size_t>(microbatches) + static_cast<size_t>(mb);
  };
  std::vector<double> forward_done(slot(virtual_stages, 0), -1), backward_done(slot(virtual_stages, 0), -1);
  std::vector<size_t> next(static_cast<size_t>(stages), 0);
  std::vector<double> free_at(static_cast<size_t>(stages), 0);
  double busy = 0;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < stages; ++r) {
      const size_t ri = static_cast<size_t>(r);
      while (next[ri] < actions[ri].size()) {
        const PipelineAction& a = actions[ri][next[ri]];
        const int s = chunk_stage(schedule, r, stages, a.chunk);
        // What the pass receives: the previous stage's activation, or the next stage's gradient.
        double ready = 0;
        if (a.kind == PipelineAction::forward && s > 0) ready = forward_done[slot(s - 1, a.microbatch)];
        if (a.kind == PipelineAction::weight) ready = backward_done[slot(s, a.microbatch)];
        if (a.kind == PipelineAction::backward)
          ready =
              s + 1 < virtual_stages ? backward_done[slot(s + 1, a.microbatch)] : forward_done[slot(s, a.microbatch)];
        if (ready < 0) break;  // blocked in a receive: another rank must move first
        const double took = a.kind == PipelineAction::forward  ? forward_time
                            : a.kind == PipelineAction::weight ? weight_time
                            : split                            ? backward_time
                                                               : backward_time + weight_time;
        free_at[ri] = std::max(free_at[ri], ready) + took;
        busy += took;
        if (a.kind == PipelineAction::forward) forward_done[slot(s, a.microbatch)] = free_at[ri];
        if (a.kind == PipelineAction::backward) backward_done[slot(s, a.microbatch)] = free_at[ri];
        ++next[ri];
        progress = true;
      }
    }
  }
  for (int r = 0; r < stages; ++r)
    if (next[static_cast<size_t>(r)] < actions[static_cast<size_t>(r)].size())
      throw std::logic_error(cat("pipeline: ", schedule, " deadlocks: rank ", r, " waits forever at action ",
                                 next[static_cast<size_t>(r)]));
  const double makespan = *std::max_element(free_at.begin(), free_at.end());
  return makespan > 0 ? 1.0 - busy / (makespan * stages) : 0.0;
}

}  // namespace keel
