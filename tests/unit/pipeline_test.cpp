// Pipeline schedules and stage splits: which passes a stage runs in which order, and how
// layers are cut into stages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <stdexcept>
#include <tuple>

#include "pipeline/schedule.hpp"
#include "pipeline/stage_split.hpp"

namespace keel {
namespace {

using A = PipelineAction;
using K = A::Kind;

TEST(PipelineSchedule, OneFOneBOnTheFirstOfFourStagesWarmsUpWithThreeForwards) {
  std::vector<A> got = stage_actions("1f1b", 0, 4, 5);
  std::vector<A> want = {{A::forward, 0}, {A::forward, 1},  {A::forward, 2},  {A::forward, 3},  {A::backward, 0},
                         {A::forward, 4}, {A::backward, 1}, {A::backward, 2}, {A::backward, 3}, {A::backward, 4}};
  EXPECT_EQ(got, want);
}

TEST(PipelineSchedule, OneFOneBOnTheLastStageAlternatesFromTheStart) {
  std::vector<A> got = stage_actions("1f1b", 3, 4, 3);
  std::vector<A> want = {{A::forward, 0},  {A::backward, 0}, {A::forward, 1},
                         {A::backward, 1}, {A::forward, 2},  {A::backward, 2}};
  EXPECT_EQ(got, want);
}

TEST(PipelineSchedule, GPipeRunsEveryForwardThenEveryBackwardInMicrobatchOrder) {
  std::vector<A> got = stage_actions("gpipe", 1, 2, 3);
  std::vector<A> want = {{A::forward, 0},  {A::forward, 1},  {A::forward, 2},
                         {A::backward, 0}, {A::backward, 1}, {A::backward, 2}};
  EXPECT_EQ(got, want);
}

TEST(PipelineSchedule, EverySchedulePassesEachMicrobatchOnceForwardBeforeBackwardInOrder) {
  for (const char* schedule : {"1f1b", "gpipe"})
    for (int stages : {1, 2, 3, 4})
      for (int stage = 0; stage < stages; ++stage)
        for (int m : {1, 2, 3, 8}) {
          std::vector<A> actions = stage_actions(schedule, stage, stages, m);
          ASSERT_EQ(actions.size(), static_cast<size_t>(2 * m));
          std::vector<int> forwards, backwards;
          int alive = 0, peak = 0;
          for (const A& a : actions) {
            if (a.kind == A::forward) {
              forwards.push_back(a.microbatch);
              peak = std::max(peak, ++alive);
            } else {
              EXPECT_NE(std::find(forwards.begin(), forwards.end(), a.microbatch), forwards.end());
              backwards.push_back(a.microbatch);
              --alive;
            }
          }
          std::vector<int> in_order(static_cast<size_t>(m));
          for (int i = 0; i < m; ++i) in_order[static_cast<size_t>(i)] = i;
          EXPECT_EQ(forwards, in_order) << schedule;
          // Gradients accumulate in microbatch order under both schedules: bitwise equal steps.
          EXPECT_EQ(backwards, in_order) << schedule;
          if (std::string(schedule) == "1f1b") {
            EXPECT_LE(peak, std::min(m, stages - stage)) << "1F1B memory bound";
          }
        }
}

TEST(PipelineSchedule, InterleavedOneFOneBFollowsMegatronsOrder) {
  // 2 ranks x 2 chunks, 4 microbatches: groups of 2 microbatches through chunk 0, then chunk 1;
  // backwards through chunk 1, then chunk 0. Rank 0 warms up with (2-0-1)*2 + (2-1)*2 = 4.
  auto f = [](int mb, int chunk) { return A{A::forward, mb, chunk}; };
  auto b = [](int mb, int chunk) { return A{A::backward, mb, chunk}; };
  EXPECT_EQ(stage_actions("interleaved_1f1b", 0, 2, 4, 2),
            (std::vector<A>{f(0, 0), f(1, 0), f(0, 1), f(1, 1), f(2, 0), b(0, 1), f(3, 0), b(1, 1), f(2, 1), b(0, 0),
                            f(3, 1), b(1, 0), b(2, 1), b(3, 1), b(2, 0), b(3, 0)}));
  EXPECT_EQ(stage_actions("interleaved_1f1b", 1, 2, 4, 2),
            (std::vector<A>{f(0, 0), f(1, 0), f(0, 1), b(0, 1), f(1, 1), b(1, 1), f(2, 0), b(0, 0), f(3, 0), b(1, 0),
                            f(2, 1), b(2, 1), f(3, 1), b(3, 1), b(2, 0), b(3, 0)}));
  // As many microbatches as ranks: every forward warms up.
  const std::vector<A> all = stage_actions("interleaved_1f1b", 1, 2, 2, 2);
  EXPECT_EQ(all, (std::vector<A>{f(0, 0), f(1, 0), f(0, 1), f(1, 1), b(0, 1), b(1, 1), b(0, 0), b(1, 0)}));
}

TEST(PipelineSchedule, InterleavedOneFOneBRunsWithoutDeadlockAndAccumulatesInMicrobatchOrder) {
  for (int stages : {2, 3, 4})
    for (int chunks : {2, 3})
      for (int groups : {1, 2, 3}) {
        const int m = groups * stages;
        for (int stage = 0; stage < stages; ++stage) {
          const std::vector<A> actions = stage_actions("interleaved_1f1b", stage, stages, m, chunks);
          ASSERT_EQ(actions.size(), static_cast<size_t>(2 * m * chunks));
          std::vector<std::vector<int>> forwards(static_cast<size_t>(chunks)), backwards(forwards);
          for (const A& a : actions) {
            const std::vector<int>& forwarded = forwards[static_cast<size_t>(a.chunk)];
            if (a.kind == A::backward) {
              EXPECT_NE(std::find(forwarded.begin(), forwarded.end(), a.microbatch), forwarded.end());
            }
            (a.kind == A::forward ? forwards : backwards)[static_cast<size_t>(a.chunk)].push_back(a.microbatch);
          }
          std::vector<int> in_order(static_cast<size_t>(m));
          for (int i = 0; i < m; ++i) in_order[static_cast<size_t>(i)] = i;
          for (int k = 0; k < chunks; ++k) {
            EXPECT_EQ(forwards[static_cast<size_t>(k)], in_order);
            // Each chunk's gradients accumulate in microbatch order: bitwise the other schedules.
            EXPECT_EQ(backwards[static_cast<size_t>(k)], in_order);
          }
        }
        // Receives block and sends do not, as in the runner: every rank gets through its list.
        EXPECT_NO_THROW(simulated_bubble_fraction("interleaved_1f1b", stages, m, chunks, 1.0, 2.0))
            << stages << " ranks, " << chunks << " chunks, " << m << " microbatches";
      }
}

TEST(PipelineSchedule, TheSimulatedBubbleIsTheTextbookOneForOneFOneBAndInterleaving) {
  // Backward twice the forward, per chunk a v-th of a stage's work.
  for (int stages : {2, 4})
    for (int m : {4, 8}) {
      EXPECT_NEAR(simulated_bubble_fraction("1f1b", stages, m, 1, 1.0, 2.0), ideal_bubble_fraction(stages, m), 1e-12);
      EXPECT_NEAR(simulated_bubble_fraction("interleaved_1f1b", stages, m, 2, 0.5, 1.0),
                  ideal_bubble_fraction(stages, m, 2), 1e-12)
          << stages << " ranks, " << m << " microbatches";
    }
}

TEST(PipelineSchedule, InterleavingNeedsChunksAndAMultipleOfTheRanks) {
  EXPECT_THROW(stage_actions("interleaved_1f1b", 0, 2, 4, 1), std::invalid_argument);
  EXPECT_THROW(stage_actions("interleaved_1f1b", 0, 2, 3, 2), std::invalid_argument);
  EXPECT_THROW(stage_actions("1f1b", 0, 2, 4, 2), std::invalid_argument);
  EXPECT_THROW(stage_actions("gpipe", 0, 2, 4, 2), std::invalid_argument);
}

TEST(PipelineSchedule, InterleavingHoldsTheSumOfItsChunksAtThePeak) {
  // Rank 0 of 2 x 2 chunks, 4 microbatches: 4 passes warm up (two per chunk) and a fifth
  // starts before the first backward; after the backward of microbatch 0 on chunk 1 comes the
  // forward of microbatch 3 on chunk 0: the peak holds four passes of chunk 0 and one of chunk 1.
  const std::vector<A> actions = stage_actions("interleaved_1f1b", 0, 2, 4, 2);
  EXPECT_EQ(peak_in_flight(actions), 5);
  EXPECT_EQ(peak_held_bytes(actions, {100, 10}), 4 * 100 + 1 * 10);
  EXPECT_EQ(peak_held_bytes(stage_actions("1f1b", 0, 2, 4), {7}), 2 * 7);
  EXPECT_EQ(peak_held_bytes(actions, {INT64_MAX, 1}), INT64_MAX) << "saturates";
}

TEST(PipelineSchedule, UnknownScheduleAndImpossibleSizesAreRefused) {
  EXPECT_THROW(stage_actions("interleaved", 0, 2, 2), std::invalid_argument);
  EXPECT_THROW(stage_actions("1f1b", 2, 2, 2), std::invalid_argument);
  EXPECT_THROW(stage_actions("1f1b", 0, 2, 0), std::invalid_argument);
}

TEST(PipelineSchedule, OneFOneBHoldsAtMostStagesMinusStageMicrobatchesAndGPipeHoldsThemAll) {
  for (int stages : {1, 2, 4})
    for (int m : {1, 3, 8})
      for (int stage = 0; stage < stages; ++stage) {
        EXPECT_EQ(peak_in_flight(stage_actions("1f1b", stage, stages, m)), std::min(m, stages - stage))
            << stage << "/" << stages << " m=" << m;
        EXPECT_EQ(peak_in_flight(stage_actions("gpipe", stage, stages, m)), m);
      }
}

TEST(PipelineSchedule, IdealBubbleIsPMinusOneOverMPlusPMinusOne) {
  EXPECT_DOUBLE_EQ(ideal_bubble_fraction(1, 4), 0.0);
  EXPECT_DOUBLE_EQ(ideal_bubble_fraction(2, 4), 1.0 / 5.0);
  EXPECT_DOUBLE_EQ(ideal_bubble_fraction(4, 8), 3.0 / 11.0);
}

TEST(PipelineSchedule, ZeroBubbleH1DefersTheFirstRWeightPassesOfRankR) {
  auto f = [](int mb) { return A{K::forward, mb}; };
  auto b = [](int mb) { return A{K::backward, mb}; };
  auto w = [](int mb) { return A{K::weight, mb}; };
  // The first rank weighs each microbatch right after its backward; the last, whose input
  // gradients every rank before it waits for, defers two weight passes to its cool-down.
  EXPECT_EQ(stage_actions("zb_h1", 0, 3, 3), (std::vector<A>{f(0), f(1), f(2), b(0), w(0), b(1), w(1), b(2), w(2)}));
  EXPECT_EQ(stage_actions("zb_h1", 1, 3, 3), (std::vector<A>{f(0), f(1), b(0), f(2), b(1), w(0), b(2), w(1), w(2)}));
  EXPECT_EQ(stage_actions("zb_h1", 2, 3, 3), (std::vector<A>{f(0), b(0), f(1), b(1), f(2), b(2), w(0), w(1), w(2)}));
  EXPECT_THROW(stage_actions("zb_h1", 0, 2, 4, 2), std::invalid_argument);
}

TEST(PipelineSchedule, ZeroBubbleH1PassesEachMicrobatchInOrderAndHoldsAtMostStagesOfThem) {
  for (int stages : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 3, 5, 8, 16})
      for (int stage = 0; stage < stages; ++stage) {
        const std::vector<A> actions = stage_actions("zb_h1", stage, stages, m);
        ASSERT_TRUE(has_weight_passes(actions));
        std::vector<int> forwards, backwards, weights;
        std::vector<int> phase(static_cast<size_t>(m), 0);  // 0 none, 1 forward, 2 backward, 3 weight
        for (const A& a : actions) {
          int& p = phase[static_cast<size_t>(a.microbatch)];
          EXPECT_EQ(p, static_cast<int>(a.kind)) << "forward, backward, weight in that order";
          p = static_cast<int>(a.kind) + 1;
          (a.kind == K::forward ? forwards : a.kind == K::backward ? backwards : weights).push_back(a.microbatch);
        }
        std::vector<int> in_order(static_cast<size_t>(m));
        for (int i = 0; i < m; ++i) in_order[static_cast<size_t>(i)] = i;
        EXPECT_EQ(forwards, in_order);
        EXPECT_EQ(backwards, in_order);
        EXPECT_EQ(weights, in_order) << "weights accumulate in microbatch order: bitwise the other schedules";
        EXPECT_LE(peak_in_flight(actions), std::min(m, stages)) << stage << "/" << stages << " m=" << m;
        EXPECT_NO_THROW(simulated_bubble_fraction("zb_h1", stages, m, 1, 1.0, 1.0, 1.0));
      }
}

TEST(PipelineSchedule, ZeroBubbleH1ReachesItsIdealBubbleAndBeatsOneFOneB) {
  // Equal passes, and an input pass slower and faster than the weight pass.
  for (const auto& [forward, input, weight] :
       std::vector<std::tuple<double, double, double>>{{1, 1, 1}, {1, 1.3, 0.7}, {1, 0.8, 1.2}})
    for (int stages : {2, 4, 8})
      for (int m : {stages, 2 * stages, 4 * stages}) {
        const double zb = simulated_bubble_fraction("zb_h1", stages, m, 1, forward, input, weight);
        EXPECT_NEAR(zb, ideal_zero_bubble_fraction(stages, m, forward, input, weight), 1e-12)
            << stages << " ranks, " << m << " microbatches, " << forward << "/" << input << "/" << weight;
        EXPECT_LT(zb, simulated_bubble_fraction("1f1b", stages, m, 1, forward, input, weight));
      }
  // p - 1 idle passes against 1f1b's 3 (p - 1): a third of the bubble's time.
  EXPECT_DOUBLE_EQ(ideal_zero_bubble_fraction(4, 8, 1, 1, 1), 3.0 / 27.0);
  EXPECT_NEAR(simulated_bubble_fraction("1f1b", 4, 8, 1, 1, 1, 1), 9.0 / 33.0, 1e-12);
}

TEST(PipelineSchedule, ZeroBubbleH1HoldsEachMicrobatchUntilItsWeightPass) {
  // Rank 0 of 2, 2 microbatches: F0 F1 B0 W0 B1 W1 holds both after F1.
  const std::vector<A> actions = stage_actions("zb_h1", 0, 2, 2);
  EXPECT_EQ(peak_in_flight(actions), 2);
  EXPECT_EQ(peak_held_bytes(actions, {5}), 10);
  // The last rank defers one weight pass: F0 B0 F1 holds two, where 1f1b holds one.
  EXPECT_EQ(peak_in_flight(stage_actions("zb_h1", 1, 2, 4)), 2);
  EXPECT_EQ(peak_in_flight(stage_actions("1f1b", 1, 2, 4)), 1);
}

TEST(PipelineSchedule, ZeroBubbleVPlacesRankRAtStagesRAndTwoPMinusOneMinusR) {
  EXPECT_EQ(chunk_stage("zbv", 0, 4, 0), 0);
  EXPECT_EQ(chunk_stage("zbv", 0, 4, 1), 7);
  EXPECT_EQ(chunk_stage("zbv", 3, 4, 0), 3);
  EXPECT_EQ(chunk_stage("zbv", 3, 4, 1), 4);
  for (int stage = 0; stage < 8; ++stage) {
    const int rank = stage_rank("zbv", stage, 4);
    EXPECT_TRUE(chunk_stage("zbv", rank, 4, 0) == stage || chunk_stage("zbv", rank, 4, 1) == stage) << stage;
    EXPECT_EQ(stage_rank("interleaved_1f1b", stage, 4), stage % 4);
    EXPECT_EQ(chunk_stage("interleaved_1f1b", stage % 4, 4, stage / 4), stage);
  }
  EXPECT_EQ(chunk_stage("1f1b", 2, 4, 0), 2);
  EXPECT_THROW(stage_actions("zbv", 0, 2, 4, 1), std::invalid_argument);
}

TEST(PipelineSchedule, ZeroBubbleVPassesEachChunkInMicrobatchOrderWithoutDeadlock) {
  for (int stages = 1; stages <= 8; ++stages)
    for (int m = 1; m <= 24; ++m)
      for (int stage = 0; stage < stages; ++stage) {
        const std::vector<A> actions = stage_actions("zbv", stage, stages, m, 2);
        ASSERT_EQ(actions.size(), static_cast<size_t>(6 * m));
        for (int chunk = 0; chunk < 2; ++chunk) {
          std::vector<int> seen[3];
          std::vector<int> phase(static_cast<size_t>(m), 0);
          for (const A& a : actions) {
            if (a.chunk != chunk) continue;
            int& p = phase[static_cast<size_t>(a.microbatch)];
            EXPECT_EQ(p, static_cast<int>(a.kind)) << "forward, backward, weight in that order";
            p = static_cast<int>(a.kind) + 1;
            seen[static_cast<int>(a.kind)].push_back(a.microbatch);
          }
          std::vector<int> in_order(static_cast<size_t>(m));
          for (int i = 0; i < m; ++i) in_order[static_cast<size_t>(i)] = i;
          for (const std::vector<int>& passes : seen)
            EXPECT_EQ(passes, in_order) << stages << " ranks, " << m << " microbatches, rank " << stage;
        }
        EXPECT_LE(peak_in_flight(actions), 2 * stages) << "a microbatch's worth per rank, as 1f1b's first rank";
      }
  for (int stages = 1; stages <= 8; ++stages)
    for (int m = 1; m <= 24; ++m)
      EXPECT_NO_THROW(simulated_bubble_fraction("zbv", stages, m, 2, 1.0, 1.0, 1.0)) << stages << " x " << m;
}

TEST(PipelineSchedule, ZeroBubbleVIdlesOnlyToFillThePipeline) {
  // Equal passes of a chunk (half a rank's layers): (p - 1) forwards' worth of idle time per
  // rank against 6 m passes, once m >= 2p.
  for (int stages : {2, 4, 8})
    for (int m : {2 * stages, 3 * stages, 4 * stages}) {
      const double zbv = simulated_bubble_fraction("zbv", stages, m, 2, 1.0, 1.0, 1.0);
      EXPECT_NEAR(zbv, static_cast<double>(stages - 1) / (6.0 * m + stages - 1), 1e-12) << stages << " x " << m;
      // The same work per rank under zb_h1 (passes of a whole rank's layers take twice as long).
      EXPECT_LT(zbv, simulated_bubble_fraction("zb_h1", stages, m, 1, 2.0, 2.0, 2.0));
    }
}

TEST(StageSplit, BalancedSplitGivesEarlierStagesTheRemainder) {
  std::vector<StageLayers> s = split_layers(7, 3);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].first, 0);
  EXPECT_EQ(s[0].count, 3);
  EXPECT_EQ(s[1].first, 3);
  EXPECT_EQ(s[1].count, 2);
  EXPECT_EQ(s[2].first, 5);
  EXPECT_EQ(s[2].count, 2);
}

TEST(StageSplit, ExplicitCountsAreUsedAsGivenAndMustSumToTheModel) {
  std::vector<StageLayers> s = split_layers(6, std::vector<int64_t>{4, 2});
  EXPECT_EQ(s[1].first, 4);
  EXPECT_EQ(s[1].count, 2);
  EXPECT_EQ(split_layers(3, std::vector<int64_t>{3, 0})[1].count, 0);  // a head-only last stage
  EXPECT_THROW(split_layers(6, std::vector<int64_t>{4, 1}), std::invalid_argument);
  EXPECT_THROW(split_layers(6, std::vector<int64_t>{7, -1}), std::invalid_argument);
  EXPECT_THROW(split_layers(2, 3), std::invalid_argument);
}

}  // namespace
}  // namespace keel
