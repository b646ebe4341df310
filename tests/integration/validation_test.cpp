// Held-out evaluation across real processes: every layout's val_loss against the single-rank
// run's, training bitwise untouched by evaluations, the same figures after a resume.
#include <gtest/gtest.h>

#include <cmath>

#include "job_runs.hpp"
#include "tolerance.hpp"

namespace keel {
namespace {

using test::JobRun;

// The shared tiny DeepSeek-V3 job (4 layers, 2 microbatches, MTP, clipping that bites), 6 steps
// with an evaluation of 2 batches every 2 steps: after steps 2, 4 and 6.
const std::string kJob = test::tiny_deepseek_job("interval = 3\n") + R"(
[validation]
interval = 2
steps = 2
)";

std::vector<std::string> six_steps(std::vector<std::string> sets) {
  sets.push_back("training.steps=6");
  return sets;
}

JobRun train(const test::TempDir& dir, const std::string& name, int ranks, const std::vector<std::string>& sets,
             const std::string& job = kJob) {
  JobRun run = test::run_job(dir, name, ranks, job, six_steps(sets));
  EXPECT_EQ(run.result.status, 0) << run.result.output;
  return run;
}

// `layout`'s evaluations match the single-rank run's: val_loss and every model figure within
// the loss tolerance of the error model (tests/support/tolerance.hpp).
void expect_validation_parity(const std::string& layout, int ranks, std::vector<std::string> sets,
                              const std::vector<std::string>& both = {}) {
  test::TempDir dir;
  JobRun single = train(dir, "single", 1, both);
  sets.insert(sets.end(), both.begin(), both.end());
  JobRun parallel = train(dir, "parallel", ranks, sets);
  ASSERT_EQ(single.validation.size(), 3u) << single.result.output;
  ASSERT_EQ(parallel.validation.size(), 3u) << parallel.result.output;
  double worst = 0;
  for (const auto& [step, figures] : single.validation) {
    ASSERT_TRUE(parallel.validation.count(step)) << layout << ": no evaluation after step " << step;
    const std::map<std::string, double>& other = parallel.validation.at(step);
    for (const char* name : {"val_loss", "val_lm_loss", "val_mtp_loss", "val_mtp_loss.1"}) {
      ASSERT_TRUE(figures.count(name) && other.count(name)) << name << " missing at step " << step;
      const double expected = figures.at(name), actual = other.at(name);
      EXPECT_NEAR(actual, expected, test::kLossRtol * expected) << layout << " step " << step << " " << name;
      worst = std::max(worst, test::relative_difference(actual, expected));
    }
    EXPECT_EQ(other.at("val_tokens"), figures.at("val_tokens"));
  }
  std::printf(
      "VALIDATION | %-16s | val_loss after step 6: %.9f vs single %.9f | worst relative difference %.2g "
      "(bound %.0e) | eval %.3f s vs single %.3f s\n",
      layout.c_str(), parallel.validation.at(6).at("val_loss"), single.validation.at(6).at("val_loss"), worst,
      test::kLossRtol, parallel.validation.at(6).at("val_seconds"), single.validation.at(6).at("val_seconds"));
}

TEST(Validation, Pp2OneFOneBMatchesTheSingleRankRun) { expect_validation_parity("PP2 1f1b", 2, {"parallelism.pp=2"}); }

TEST(Validation, Pp2GpipeMatchesTheSingleRankRun) {
  expect_validation_parity("PP2 gpipe", 2, {"parallelism.pp=2", "parallelism.schedule=\\\"gpipe\\\""});
}

TEST(Validation, Pp4MatchesTheSingleRankRun) { expect_validation_parity("PP4", 4, {"parallelism.pp=4"}); }

TEST(Validation, Dp2Ep2MatchesTheSingleRankRun) {
  expect_validation_parity("DP2 EP2", 2, {"parallelism.dp=2", "parallelism.ep=2"});
}

TEST(Validation, Pp2Dp2Ep2MatchesTheSingleRankRun) {
  expect_validation_parity("PP2 DP2 EP2", 4, {"parallelism.pp=2", "parallelism.dp=2", "parallelism.ep=2"});
}

// An evaluation batch of its own shape (4 samples of 8 tokens; training's are 8 of 16) through
// the pipeline, which sizes its buffers by the batch it is given.
TEST(Validation, ItsOwnBatchAndLengthUnderPp2MatchTheSingleRankRun) {
  expect_validation_parity("PP2 batch 4x8", 2, {"parallelism.pp=2"},
                           {"validation.global_batch=4", "validation.seq_len=8"});
}

// Evaluations on vs off: the same losses, grad norms and final state (parameters, buffers
// with the expert bias, AdamW), bit for bit.
void expect_training_untouched(int ranks, const std::vector<std::string>& layout) {
  test::TempDir dir;
  JobRun on = train(dir, "on", ranks, layout);
  std::vector<std::string> off_sets = layout;
  off_sets.push_back("validation.interval=0");
  JobRun off = train(dir, "off", ranks, off_sets);
  ASSERT_EQ(on.validation.size(), 3u);
  EXPECT_TRUE(off.validation.empty());
  ASSERT_EQ(on.loss.size(), 6u);
  ASSERT_EQ(on.loss.size(), off.loss.size());
  for (size_t s = 0; s < on.loss.size(); ++s) {
    EXPECT_EQ(on.loss[s], off.loss[s]) << "step " << s + 1;
    EXPECT_EQ(on.grad_norm[s], off.grad_norm[s]) << "step " << s + 1;
  }
  ASSERT_FALSE(off.state.empty());
  ASSERT_EQ(on.state.size(), off.state.size());
  for (const auto& [key, t] : off.state) EXPECT_TRUE(at::equal(t, on.state.at(key))) << key;
}

TEST(Validation, EvaluatingLeavesTrainingBitwiseUntouchedOnOneRank) { expect_training_untouched(1, {}); }

TEST(Validation, EvaluatingLeavesTrainingBitwiseUntouchedUnderPp2Dp2Ep2) {
  expect_training_untouched(4, {"parallelism.pp=2", "parallelism.dp=2", "parallelism.ep=2"});
}

// Straight vs saved after step 3 and resumed: the evaluations after steps 4 and 6 are the
// same bits, and the resumed run's checkpoints record the last figures.
TEST(Validation, AResumedRunEvaluatesTheSame) {
  test::TempDir dir;
  JobRun straight = train(dir, "straight", 1, {});
  JobRun resumed = train(dir, "resumed", 1, {"checkpoint.load=\\\"" + straight.dir + "/checkpoints/step-3\\\""});
  ASSERT_EQ(straight.validation.size(), 3u);
  ASSERT_EQ(resumed.validation.size(), 2u) << resumed.result.output;
  for (int64_t step : {4, 6})
    EXPECT_EQ(resumed.validation.at(step).at("val_loss"), straight.validation.at(step).at("val_loss")) << step;
}

}  // namespace
}  // namespace keel
