// Llama 3 with tied embeddings (model.tie_embeddings = true) across real processes: under
// pipeline parallelism the last stage's head reads a REPLICA of tok_embeddings.weight that the
// model keeps exact (post_init broadcast, pre_clip SUM over {first, last} stage). The PP2 and
// PP2 DP2 runs match the single-rank run, where one tensor serves both ends, under the error
// model of tests/support/tolerance.hpp; every copy is checked bitwise after every step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "checkpoint/checkpoint_reader.hpp"
#include "job_runs.hpp"
#include "tolerance.hpp"

namespace keel {
namespace {

// The parallel suites' job on the tiny Llama 3 (2 layers), tied; `checkpoint` holds extra
// lines of the [checkpoint] table.
std::string tied_job(const std::string& checkpoint = "") {
  std::string job = test::tiny_deepseek_job(checkpoint);
  job.replace(job.find("deepseek_v3_mtp"), 15, "llama3");
  job.replace(job.find("n_layers = 4\n"), 13, "tie_embeddings = true\n");
  return job;
}

constexpr int kSteps = 10;
constexpr double kMaxNorm = 0.05;

test::TrainingBounds job_bounds() {
  test::TrainingBounds b;
  b.lr = 3e-4, b.steps = kSteps, b.max_grad_norm = kMaxNorm;
  return b;
}

const char* const kGuardPassed = "replica guard: 10 check(s), every copy of every parameter bitwise equal";

std::string joined(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  return text;
}

// The largest |a - b| over the parameters (not the optimizer state) of two final states.
double max_weight_difference(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  double worst = 0;
  for (const auto& [key, t] : b)
    if (test::state_class(key) == "parameters" && a.count(key))
      worst = std::max(worst, (a.at(key).to(at::kDouble) - t.to(at::kDouble)).abs().max().item<double>());
  return worst;
}

// The layout's run matches the single-rank run: loss and grad norm at every step, every entry
// of the final state; prints one row of the tied-embedding parity table.
void expect_parity(const std::string& layout, int ranks, const std::vector<std::string>& sets) {
  test::TempDir dir;
  const std::string job = tied_job();
  test::JobRun single = test::run_job(dir, "single", 1, job, {});
  ASSERT_EQ(single.result.status, 0) << single.result.output;
  test::JobRun parallel = test::run_job(dir, "parallel", ranks, job, sets);
  ASSERT_EQ(parallel.result.status, 0) << parallel.result.output;
  EXPECT_NE(parallel.result.output.find(kGuardPassed), std::string::npos) << parallel.result.output;
  ASSERT_EQ(single.loss.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(parallel.loss.size(), static_cast<size_t>(kSteps));

  double max_dloss = 0, worst_loss = 0, worst_norm = 0;
  for (size_t s = 0; s < single.loss.size(); ++s) {
    EXPECT_GT(single.grad_norm[s], kMaxNorm) << "clipping must bite at step " << s + 1;
    max_dloss = std::max(max_dloss, std::abs(parallel.loss[s] - single.loss[s]));
    worst_loss = std::max(worst_loss, test::relative_difference(parallel.loss[s], single.loss[s]));
    worst_norm = std::max(worst_norm, test::relative_difference(parallel.grad_norm[s], single.grad_norm[s]));
  }
  EXPECT_LE(worst_loss, test::kLossRtol) << layout;
  EXPECT_LE(worst_norm, test::kLossRtol) << layout;
  ASSERT_TRUE(single.state.count("tok_embeddings.weight")) << "the tied table is one logical entry";
  EXPECT_FALSE(single.state.count("output.weight"));
  test::StateComparison c = test::compare_states(parallel.state, single.state, job_bounds());
  EXPECT_TRUE(c.failures.empty()) << layout << ":\n" << joined(c.failures);
  EXPECT_EQ(c.compared, single.state.size());

  const test::Tolerance weight_bound = test::parameter_tolerance(job_bounds());
  std::printf(
      "TIED PARITY | %-12s | max |dloss| %.3g (%.2g of rtol) | grad norm %.2g of rtol | max |dweight| %.3g "
      "(%.2g of bound, atol %.3g) | exp_avg %.2g | exp_avg_sq %.2g of bound | %zu entries\n",
      layout.c_str(), max_dloss, worst_loss / test::kLossRtol, worst_norm / test::kLossRtol,
      max_weight_difference(parallel.state, single.state), c.worst["parameters"], weight_bound.atol, c.worst["exp_avg"],
      c.worst["exp_avg_sq"], c.compared);
}

TEST(TiedLlama3, Pp2MatchesTheSingleRankRun) { expect_parity("PP2", 2, {"parallelism.pp=2"}); }

TEST(TiedLlama3, Pp2Dp2MatchesTheSingleRankRun) {
  expect_parity("PP2 DP2", 4, {"parallelism.pp=2", "parallelism.dp=2"});
}

// post_init is what makes the copies equal: a replica perturbed before it is repaired, one
// perturbed after it is caught by the guard, naming the tied table.
TEST(TiedLlama3, APerturbedReplicaBeforePostInitIsRepairedByIt) {
  test::TempDir dir;
  test::JobRun run =
      test::run_job(dir, "repaired", 2, tied_job(), {"parallelism.pp=2", "debug.perturb_replicas=before_post_init"});
  ASSERT_EQ(run.result.status, 0) << run.result.output;
  EXPECT_NE(run.result.output.find("perturbed 1 replica(s) before post_init"), std::string::npos) << run.result.output;
  EXPECT_NE(run.result.output.find(kGuardPassed), std::string::npos) << run.result.output;
}

TEST(TiedLlama3, APerturbationAfterPostInitIsCaughtNamingTheTable) {
  test::TempDir dir;
  test::JobRun run =
      test::run_job(dir, "caught", 2, tied_job(), {"parallelism.pp=2", "debug.perturb_replicas=after_post_init"});
  EXPECT_NE(run.result.status, 0);
  EXPECT_NE(run.result.output.find("replica guard after step 1: the copies of 'tok_embeddings.weight' differ: "),
            std::string::npos)
      << run.result.output;
}

// A tied PP2 DP2 checkpoint holds the table once; one rank and PP2 load it (the REPLICA loads
// the owner's entry), re-save it bitwise and take the next step as the uninterrupted run did.
TEST(TiedLlama3, APp2Dp2CheckpointResumesOnOneRankAndUnderPp2) {
  test::TempDir dir;
  const std::string job = tied_job("interval = 5\n");
  test::JobRun source = test::run_job(dir, "source", 4, job, {"parallelism.pp=2", "parallelism.dp=2"});
  ASSERT_EQ(source.result.status, 0) << source.result.output;
  const std::string saved = source.dir + "/checkpoints/step-5";
  CheckpointReader reader(saved);
  EXPECT_TRUE(reader.has("model.tok_embeddings.weight"));
  EXPECT_FALSE(reader.has("model.output.weight"));
  const std::string load = "checkpoint.load=\\\"" + saved + "\\\"";

  for (const auto& [name, ranks, layout] : {std::tuple{"single", 1, std::vector<std::string>{}},
                                            std::tuple{"pp2", 2, std::vector<std::string>{"parallelism.pp=2"}}}) {
    std::vector<std::string> resave = layout, next = layout;
    resave.insert(resave.end(), {load, "training.steps=5"});
    next.insert(next.end(), {load, "training.steps=6"});
    test::JobRun resaved = test::run_job(dir, std::string(name) + "_resaved", ranks, job, resave);
    ASSERT_EQ(resaved.result.status, 0) << resaved.result.output;
    if (ranks > 1) {
      EXPECT_NE(resaved.result.output.find("replica guard after load: every copy bitwise equal"), std::string::npos)
          << resaved.result.output;
    }
    CheckpointReader again(resaved.dir + "/checkpoints/step-5");
    size_t compared = 0;
    for (const auto& [key, entry] : reader.manifest().entries) {
      if (key.rfind("rng.", 0) == 0) continue;
      ASSERT_TRUE(again.has(key)) << name << ": " << key;
      EXPECT_TRUE(at::equal(reader.read_whole(key), again.read_whole(key))) << name << ": " << key;
      ++compared;
    }
    EXPECT_GT(compared, 60u);

    test::JobRun stepped = test::run_job(dir, std::string(name) + "_next", ranks, job, next);
    ASSERT_EQ(stepped.result.status, 0) << stepped.result.output;
    ASSERT_EQ(stepped.steps, (std::vector<int64_t>{6}));
    EXPECT_NEAR(stepped.loss[0], source.loss[5], test::kLossRtol * source.loss[5]) << name;
    EXPECT_NEAR(stepped.grad_norm[0], source.grad_norm[5], test::kLossRtol * source.grad_norm[5]) << name;
  }
}

// The tied table is one logical parameter, fully activated (the head reads every row), counted
// once whatever the layout; under PP2 the last stage holds its REPLICA.
TEST(TiedLlama3, DryRunCountsTheTableOnceAndShowsTheReplica) {
  test::TempDir dir;
  test::write_file(dir / "job.toml", tied_job());
  const std::string dry_run =
      test::bin_dir() + "/keel-train --dry-run --plugin-path " + test::plugin_dir() + " --config " + (dir / "job.toml");
  auto single = test::run_command(dry_run);
  auto pp2 = test::run_command(dry_run + " --set parallelism.pp=2");
  auto untied = test::run_command(dry_run + " --set model.tie_embeddings=false");
  ASSERT_EQ(single.status, 0) << single.output;
  ASSERT_EQ(pp2.status, 0) << pp2.output;
  ASSERT_EQ(untied.status, 0) << untied.output;
  // tiny: vocab 256 x dim 64 = 16384 elements fewer than untied (106816), every one activated.
  EXPECT_NE(single.output.find("total               90432 parameters (90.43 K), activated 90.43 K\n"),
            std::string::npos)
      << single.output;
  EXPECT_NE(untied.output.find("total              106816 parameters (106.82 K), activated 90.50 K\n"),
            std::string::npos)
      << untied.output;
  EXPECT_NE(pp2.output.find("total               90432 parameters (90.43 K), activated 90.43 K, replicas 16.38 K"),
            std::string::npos)
      << pp2.output;
  EXPECT_NE(pp2.output.find("rank 1: stage 1/2, layers 1-1 (1), 11 parameter tensors (53.44 K elements here), 0 "
                            "buffers, REPLICA: tok_embeddings.weight"),
            std::string::npos)
      << pp2.output;
}

// The shipped tied PP2 DP2 job: the last stage's ranks hold the REPLICA.
TEST(TiedLlama3, TheShippedPp2Dp2ConfigPutsTheReplicaOnTheLastStage) {
  auto r = test::run_command(test::bin_dir() + "/keel-train --dry-run --plugin-path " + test::plugin_dir() +
                             " --config " + test::source_dir() + "/configs/llama3_tied_pp2_dp2.toml");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("ranks 0,1: stage 0/2, layers 0-1 (2), 19 parameter tensors"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ranks 2,3: stage 1/2, layers 2-3 (2), 20 parameter tensors (2.10 M elements here), 0 "
                          "buffers, REPLICA: tok_embeddings.weight"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace keel
