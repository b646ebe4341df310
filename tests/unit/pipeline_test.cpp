// Pipeline schedules and stage splits: which passes a stage runs in which order, and how
// layers are cut into stages.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <stdexcept>

#include "pipeline/schedule.hpp"
#include "pipeline/stage_split.hpp"

namespace keel {
namespace {

using A = PipelineAction;

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
