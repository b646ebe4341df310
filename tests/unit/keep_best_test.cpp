// checkpoint.keep_best's ranking: the lowest val_loss of an evaluation of the checkpoint's own
// weights, a non-finite one never best, ties to the earlier step.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_writer.hpp"

namespace keel {
namespace {

RankedCheckpoint evaluated(int64_t step, double val_loss, int64_t evaluated_after = -1) {
  return {"step-" + std::to_string(step), step,
          ValidationRecord{evaluated_after < 0 ? step : evaluated_after, {{"val_loss", val_loss}}}};
}

TEST(KeepBest, TheLowestValLossesWinWhateverTheirAge) {
  const std::vector<RankedCheckpoint> all = {evaluated(10, 3.0), evaluated(20, 2.0), evaluated(30, 2.5),
                                             evaluated(40, 2.75)};
  EXPECT_EQ(best_checkpoints(all, 2), (std::vector<std::string>{"step-20", "step-30"}));
  EXPECT_EQ(best_checkpoints(all, 1), (std::vector<std::string>{"step-20"}));
  EXPECT_EQ(best_checkpoints(all, 9).size(), 4u);
  EXPECT_TRUE(best_checkpoints(all, 0).empty());
}

TEST(KeepBest, ATieGoesToTheEarlierStepWhateverTheOrderGiven) {
  EXPECT_EQ(best_checkpoints({evaluated(30, 2.0), evaluated(10, 2.0), evaluated(20, 2.0)}, 2),
            (std::vector<std::string>{"step-10", "step-20"}));
}

TEST(KeepBest, NonFiniteStaleAndMissingFiguresAreNeverCandidates) {
  RankedCheckpoint unevaluated{"step-5", 5, std::nullopt};
  RankedCheckpoint without_loss{"step-6", 6, ValidationRecord{6, {{"val_lm_loss", 0.1}}}};
  const std::vector<RankedCheckpoint> all = {
      evaluated(10, std::nan("")),  // a diverged evaluation
      evaluated(20, 0.5, 10),       // carries step 10's figures: not of its own weights
      unevaluated,
      without_loss,
      evaluated(30, 4.0),
      evaluated(40, -INFINITY),
      evaluated(50, 4.5)};
  EXPECT_EQ(best_checkpoints(all, 3), (std::vector<std::string>{"step-30", "step-50"}));
}

}  // namespace
}  // namespace keel
