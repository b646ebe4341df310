// Held-out evaluation across real processes: every layout's val_loss against the single-rank
// run's, training bitwise untouched by evaluations, the same figures after a resume.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "checkpoint/checkpoint_writer.hpp"
#include "checkpoint/manifest.hpp"
#include "common/text.hpp"
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

TEST(Validation, InterleavedPp2MatchesTheSingleRankRun) {
  expect_validation_parity(
      "PP2 v2", 2, {"parallelism.pp=2", "parallelism.schedule=interleaved_1f1b", "parallelism.stages_per_rank=2"});
}

// The forward-only pass down the V and back up, turning on rank 1.
TEST(Validation, ZeroBubbleVPp2MatchesTheSingleRankRun) {
  expect_validation_parity("PP2 zbv", 2,
                           {"parallelism.pp=2", "parallelism.schedule=zbv", "parallelism.stages_per_rank=2"});
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
  // The checkpoint after step 3 records the evaluation after step 2; a run resumed from it
  // carries those figures into its checkpoints until it evaluates again (here only after its
  // last step, 6).
  const Manifest step3 = read_manifest(straight.dir + "/checkpoints/step-3");
  ASSERT_TRUE(step3.validation);
  EXPECT_EQ(step3.validation->step, 2);
  EXPECT_EQ(step3.validation->metrics.at("val_loss"), straight.validation.at(2).at("val_loss"));
  JobRun carried = train(dir, "carried", 1,
                         {"checkpoint.load=\\\"" + straight.dir + "/checkpoints/step-3\\\"", "validation.interval=10",
                          "checkpoint.interval=1"});
  for (const char* name : {"step-4", "step-5"}) {
    const Manifest m = read_manifest(carried.dir + "/checkpoints/" + name);
    ASSERT_TRUE(m.validation) << name;
    EXPECT_EQ(m.validation->step, 2) << name;
    EXPECT_EQ(m.validation->metrics, step3.validation->metrics) << name;
  }
  EXPECT_EQ(read_manifest(carried.dir + "/checkpoints/step-6").validation->step, 6);
}

// What checkpoint.keep_latest = 1 and keep_best = 2 must leave of a run that saved and
// evaluated after every step up to `last`: the last step's and the two of lowest val_loss (the
// earlier step on a tie), and the one it resumed from (`loaded`, never pruned; 0 = none).
std::set<std::string> kept_by_best(const JobRun& run, int64_t last, int64_t loaded) {
  std::vector<std::pair<double, int64_t>> ranked;
  for (const auto& [step, figures] : run.validation) ranked.emplace_back(figures.at("val_loss"), step);
  std::sort(ranked.begin(), ranked.end());
  std::set<std::string> kept = {"step-" + std::to_string(last)};
  if (loaded > 0) kept.insert("step-" + std::to_string(loaded));
  for (size_t i = 0; i < 2 && i < ranked.size(); ++i) kept.insert("step-" + std::to_string(ranked[i].second));
  return kept;
}

// keep_best keeps the checkpoints of lowest val_loss on top of keep_latest, ranked from the
// manifests on disk, so a resumed run goes on ranking the first run's checkpoints; each kept
// manifest records the val_loss of its own step, bit for bit the logged one. (The ranking
// itself, with ties, NaN and stale figures, is unit-tested: keep_best_test.cpp.)
TEST(Validation, KeepBestKeepsTheLowestValLossCheckpointsAcrossAResume) {
  test::TempDir dir;
  const std::string job =
      test::tiny_deepseek_job("interval = 1\nkeep_latest = 1\nkeep_best = 2\n") + "[validation]\ninterval = 1\n";
  const std::vector<std::string> sets = {"optimizer.lr=0.05", "clipper.max_norm=10.0"};
  std::vector<std::string> first_sets = sets, resumed_sets = sets;
  first_sets.push_back("training.steps=6");
  resumed_sets.insert(resumed_sets.end(), {"training.steps=10", "checkpoint.load=latest"});
  for (const auto& [steps, run_sets] : {std::pair{6, first_sets}, std::pair{10, resumed_sets}}) {
    JobRun run = test::run_job(dir, "run", 1, job, run_sets);
    ASSERT_EQ(run.result.status, 0) << run.result.output;
    ASSERT_EQ(run.validation.size(), static_cast<size_t>(steps)) << run.result.output;
    const std::vector<std::string> on_disk = complete_checkpoints(run.dir + "/checkpoints");
    std::string losses;
    for (const auto& [step, figures] : run.validation)
      losses += format(" %ld:%.4f", long(step), figures.at("val_loss"));
    std::printf("KEEP_BEST | after %d steps, val_loss by step:%s | kept: %s\n", steps, losses.c_str(),
                join(on_disk, ", ").c_str());
    EXPECT_EQ(std::set<std::string>(on_disk.begin(), on_disk.end()), kept_by_best(run, steps, steps == 10 ? 6 : 0))
        << "after " << steps << " steps";
    for (const std::string& name : on_disk) {
      const Manifest m = read_manifest(run.dir + "/checkpoints/" + name);
      ASSERT_TRUE(m.validation) << name;
      EXPECT_EQ(m.validation->step, m.step) << name;
      EXPECT_EQ(m.validation->metrics.at("val_loss"), run.validation.at(m.step).at("val_loss")) << name;
    }
    // keel-ckpt ls shows them.
    const std::string latest = run.dir + "/checkpoints/step-" + std::to_string(steps);
    const test::CommandResult ls = test::run_command(test::bin_dir() + "/keel-ckpt ls " + latest);
    ASSERT_EQ(ls.status, 0) << ls.output;
    EXPECT_NE(
        ls.output.find(format("validation  val_loss %.4f, val_lm_loss ", run.validation.at(steps).at("val_loss"))),
        std::string::npos)
        << ls.output;
    EXPECT_NE(ls.output.find(format("(after step %d)\n", steps)), std::string::npos) << ls.output;
  }
}

}  // namespace
}  // namespace keel
