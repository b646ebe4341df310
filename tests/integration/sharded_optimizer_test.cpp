// The sharded optimizer (parallelism.shard_optimizer, ZeRO-1) against the unsharded one: each
// member of a dp/edp group steps only its rows of the gradient buckets, then the rows are
// all-gathered. The cuts keep ATen's fused AdamW on the same per-element code path
// (optim/optimizer_shards.hpp), so with gradients all-reduced whole
// (parallelism.reduce_scatter_grads = false) the runs must agree bitwise: losses, grad norms,
// the final state and every checkpoint entry (the moments saved as row pieces by several ranks,
// consolidated under their canonical keys). The replica guard checks every copy of every
// parameter after every step. Checkpoints resume across sharded and unsharded runs.
// Reduce-scattered gradients sum the norm in another order, so they are compared with the
// unsharded optimizer under the error model instead (parallel_parity_test.cpp); here a
// reduce-scattered run resumes bitwise.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "checkpoint/checkpoint_reader.hpp"
#include "job_runs.hpp"

namespace keel {
namespace {

using test::JobRun;

// The shared tiny job (10 steps, clipping active, the guard after every step) with a
// checkpoint every 3 steps.
const std::string kJob = test::tiny_deepseek_job("interval = 3\n");
const std::string kSharded = "parallelism.shard_optimizer=true";
const std::string kWhole = "parallelism.reduce_scatter_grads=false";

std::vector<std::string> with(std::vector<std::string> sets, const std::vector<std::string>& more) {
  sets.insert(sets.end(), more.begin(), more.end());
  return sets;
}

std::string load(const JobRun& run, int step) {
  return "checkpoint.load=\\\"" + run.dir + "/checkpoints/step-" + std::to_string(step) + "\\\"";
}

bool has(const JobRun& run, const std::string& text) { return run.result.output.find(text) != std::string::npos; }

// Every entry but the per-rank random states, bitwise equal; returns how many were compared.
size_t expect_same_entries(const std::string& a, const std::string& b) {
  CheckpointReader x(a), y(b);
  size_t compared = 0, in_b = 0;
  for (const auto& [key, entry] : y.manifest().entries) in_b += key.rfind("rng.", 0) == 0 ? 0 : 1;
  for (const auto& [key, entry] : x.manifest().entries) {
    if (key.rfind("rng.", 0) == 0) continue;
    if (!y.has(key)) {
      ADD_FAILURE() << key << " missing from " << b;
      continue;
    }
    EXPECT_TRUE(at::equal(x.read_whole(key), y.read_whole(key))) << key;
    ++compared;
  }
  EXPECT_EQ(compared, in_b) << b << " holds entries " << a << " does not";
  return compared;
}

// The steps of `part` equal those of `whole` from `whole`'s step `first` on, bit for bit.
void expect_same_steps(const JobRun& whole, const JobRun& part, size_t first, const std::string& label) {
  ASSERT_EQ(whole.loss.size(), 10u) << label;
  ASSERT_EQ(part.loss.size(), 10u - first) << label;
  for (size_t i = 0; i < part.loss.size(); ++i) {
    EXPECT_EQ(std::memcmp(&part.loss[i], &whole.loss[first + i], sizeof(double)), 0)
        << label << " step " << first + i + 1;
    EXPECT_EQ(std::memcmp(&part.grad_norm[i], &whole.grad_norm[first + i], sizeof(double)), 0)
        << label << " step " << first + i + 1;
  }
}

void expect_same_state(const JobRun& a, const JobRun& b, const std::string& label) {
  ASSERT_FALSE(a.state.empty()) << label;
  ASSERT_EQ(a.state.size(), b.state.size()) << label;
  for (const auto& [key, tensor] : a.state) {
    ASSERT_TRUE(b.state.count(key)) << label << ": " << key;
    EXPECT_TRUE(at::equal(tensor, b.state.at(key))) << label << ": " << key;
  }
}

void expect_sharding_is_bitwise_the_same(const std::string& label, int ranks, const std::vector<std::string>& layout) {
  test::TempDir dir;
  const JobRun whole = test::run_job(dir, "whole", ranks, kJob, layout);
  const JobRun sharded = test::run_job(dir, "sharded", ranks, kJob, with(layout, {kSharded, kWhole}));
  ASSERT_EQ(whole.result.status, 0) << whole.result.output;
  ASSERT_EQ(sharded.result.status, 0) << sharded.result.output;
  EXPECT_TRUE(has(sharded, "optimizer state sharded over dp (dense) and edp (experts)")) << sharded.result.output;
  EXPECT_TRUE(has(sharded, "gradients all-reduced whole: parallelism.reduce_scatter_grads = false"))
      << sharded.result.output;
  EXPECT_FALSE(has(whole, "optimizer state sharded"));
  expect_same_steps(whole, sharded, 0, label);
  expect_same_state(whole, sharded, label);
  const size_t entries = expect_same_entries(whole.dir + "/checkpoints/step-9", sharded.dir + "/checkpoints/step-9");
  EXPECT_GT(entries, 300u);
  std::printf(
      "SHARDED_OPTIMIZER | %-34s | 10 steps: losses, grad norms, %zu final state tensors and %zu checkpoint "
      "entries bitwise equal | replicas checked after every step | %.1f s vs %.1f s\n",
      label.c_str(), sharded.state.size(), entries, sharded.seconds, whole.seconds);
}

TEST(ShardedOptimizer, Dp2IsBitwiseTheUnshardedOptimizer) {
  expect_sharding_is_bitwise_the_same("DP2", 2, {"parallelism.dp=2"});
}

TEST(ShardedOptimizer, Dp4Ep2IsBitwiseTheUnshardedOptimizer) {
  // One bucket per parameter: a cut inside nearly every parameter, experts over edp = 2.
  expect_sharding_is_bitwise_the_same("DP4 EP2, a bucket per parameter", 4,
                                      {"parallelism.dp=4", "parallelism.ep=2", "parallelism.grad_bucket_mb=0"});
}

TEST(ShardedOptimizer, Pp2Dp2Ep2IsBitwiseTheUnshardedOptimizer) {
  expect_sharding_is_bitwise_the_same("PP2 DP2 EP2", 4, {"parallelism.pp=2", "parallelism.dp=2", "parallelism.ep=2"});
}

TEST(ShardedOptimizer, CheckpointsResumeShardedToUnshardedToSharded) {
  // Sharded from step 0; unsharded resumed from its step 3; sharded again from the unsharded
  // run's step 6: every step and the final state as the uninterrupted sharded run's.
  const std::vector<std::string> layout = {"parallelism.pp=2", "parallelism.dp=2", "parallelism.ep=2"};
  test::TempDir dir;
  const JobRun sharded = test::run_job(dir, "sharded", 4, kJob, with(layout, {kSharded, kWhole}));
  ASSERT_EQ(sharded.result.status, 0) << sharded.result.output;
  const JobRun unsharded = test::run_job(dir, "unsharded", 4, kJob, with(layout, {load(sharded, 3)}));
  ASSERT_EQ(unsharded.result.status, 0) << unsharded.result.output;
  const JobRun again = test::run_job(dir, "again", 4, kJob, with(layout, {kSharded, kWhole, load(unsharded, 6)}));
  ASSERT_EQ(again.result.status, 0) << again.result.output;
  EXPECT_TRUE(has(again, "resuming after step 6")) << again.result.output;
  expect_same_steps(sharded, unsharded, 3, "unsharded after step 3");
  expect_same_steps(sharded, again, 6, "sharded again after step 6");
  expect_same_state(sharded, again, "sharded -> unsharded -> sharded");
  expect_same_entries(sharded.dir + "/checkpoints/step-9", unsharded.dir + "/checkpoints/step-9");
  expect_same_entries(sharded.dir + "/checkpoints/step-9", again.dir + "/checkpoints/step-9");
  std::printf(
      "SHARDED_RESUME | PP2 DP2 EP2 | sharded -> unsharded (step 3) -> sharded (step 6): steps 4-10 and the final "
      "state bitwise the uninterrupted sharded run's\n");
}

TEST(ShardedOptimizer, AReduceScatteredRunResumesBitwise) {
  // Reduce-scattered from step 0, and again from its own step 6: steps 7-10, the final state and
  // the last checkpoint bitwise the uninterrupted run's.
  const std::vector<std::string> layout = {"parallelism.pp=2", "parallelism.dp=2", "parallelism.ep=2", kSharded};
  test::TempDir dir;
  const JobRun scattered = test::run_job(dir, "scattered", 4, kJob, layout);
  ASSERT_EQ(scattered.result.status, 0) << scattered.result.output;
  EXPECT_TRUE(has(scattered, "gradients reduce-scattered in ")) << scattered.result.output;
  const JobRun resumed = test::run_job(dir, "resumed", 4, kJob, with(layout, {load(scattered, 6)}));
  ASSERT_EQ(resumed.result.status, 0) << resumed.result.output;
  EXPECT_TRUE(has(resumed, "resuming after step 6")) << resumed.result.output;
  expect_same_steps(scattered, resumed, 6, "reduce-scattered, resumed after step 6");
  expect_same_state(scattered, resumed, "reduce-scattered, resumed");
  expect_same_entries(scattered.dir + "/checkpoints/step-9", resumed.dir + "/checkpoints/step-9");
}

TEST(ShardedOptimizer, ACheckpointOfAnotherLayoutResumesSharded) {
  // Saved unsharded under DP2 EP2, resumed sharded under DP4 EP2: the same state re-saved.
  test::TempDir dir;
  const JobRun source = test::run_job(dir, "source", 2, kJob, {"parallelism.dp=2", "parallelism.ep=2"});
  ASSERT_EQ(source.result.status, 0) << source.result.output;
  const JobRun resaved = test::run_job(
      dir, "resaved", 4, kJob, {"parallelism.dp=4", "parallelism.ep=2", kSharded, load(source, 3), "training.steps=3"});
  ASSERT_EQ(resaved.result.status, 0) << resaved.result.output;
  EXPECT_GT(expect_same_entries(source.dir + "/checkpoints/step-3", resaved.dir + "/checkpoints/step-3"), 300u);
}

}  // namespace
}  // namespace keel
