// Pipeline x data x expert parallelism across real processes (keel-launch, Gloo, one thread
// per rank) against the single-rank run of the same job: the tiny DeepSeek-V3 with MTP, two
// microbatches, 10 steps, clipping active. Every run checks all copies of every parameter
// after every step (debug.replica_check_interval = 1); the final parameters, buffers and AdamW
// state come from debug.dump_state. Runs are compared under the error model of
// tests/support/tolerance.hpp, so the comparisons hold on any CPU and any LibTorch kernel set.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "job_runs.hpp"
#include "tolerance.hpp"

namespace keel {
namespace {

const std::string kJob = test::tiny_deepseek_job();

constexpr double kMaxNorm = 0.05;

// What the error model needs to know of kJob (tests/support/tolerance.hpp).
test::TrainingBounds job_bounds() {
  test::TrainingBounds b;
  b.lr = 3e-4, b.steps = 10, b.max_grad_norm = kMaxNorm, b.load_balance_coeff = 1e-3;
  return b;
}

using test::JobRun;

JobRun train(const test::TempDir& dir, const std::string& name, int ranks, const std::vector<std::string>& sets,
             const std::string& job = kJob) {
  return test::run_job(dir, name, ranks, job, sets);
}

std::string joined(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  return text;
}

// `run` against `reference` under the error model: loss and grad norm at every step, then
// every entry of the final state. Returns the state comparison; prints one row of the parity
// table (each worst deviation as a fraction of its bound: <= 1 passes).
test::StateComparison compare_runs(const std::string& layout, const JobRun& run, const JobRun& reference,
                                   bool& scalars_within) {
  scalars_within = true;
  double worst_loss = 0, worst_norm = 0;
  for (size_t s = 0; s < reference.loss.size() && s < run.loss.size(); ++s) {
    worst_loss = std::max(worst_loss, test::relative_difference(run.loss[s], reference.loss[s]));
    worst_norm = std::max(worst_norm, test::relative_difference(run.grad_norm[s], reference.grad_norm[s]));
  }
  scalars_within = worst_loss <= test::kLossRtol && worst_norm <= test::kLossRtol;
  test::StateComparison c = test::compare_states(run.state, reference.state, job_bounds());
  std::string classes;
  for (const auto& [cls, worst] : c.worst) {
    char fraction[32];
    std::snprintf(fraction, sizeof(fraction), " %.2g", worst);
    if (cls != "counters") classes += " | " + cls + fraction;
  }
  std::printf("PARITY | %-14s | loss %.2f | grad norm %.2f%s | %zu entries | %.1f s\n", layout.c_str(),
              worst_loss / test::kLossRtol, worst_norm / test::kLossRtol, classes.c_str(), c.compared, run.seconds);
  return c;
}

// The run a layout is compared with: the single-rank run unless named otherwise.
struct Reference {
  int ranks = 1;
  std::vector<std::string> sets;
};

// The layout's run matches the reference run within the error model; returns the layout's run.
JobRun expect_parity(const std::string& layout, int ranks, const std::vector<std::string>& sets,
                     const std::string& job = kJob, const Reference& reference = {}) {
  test::TempDir dir;
  JobRun single = train(dir, "reference", reference.ranks, reference.sets, job);
  EXPECT_EQ(single.result.status, 0) << single.result.output;
  JobRun parallel = train(dir, "parallel", ranks, sets, job);
  EXPECT_EQ(parallel.result.status, 0) << parallel.result.output;
  if (single.result.status != 0 || parallel.result.status != 0) return parallel;
  EXPECT_NE(parallel.result.output.find("replica guard: 10 check(s), every copy of every parameter bitwise equal"),
            std::string::npos)
      << parallel.result.output;

  EXPECT_EQ(single.loss.size(), 10u);
  EXPECT_EQ(parallel.loss.size(), 10u);
  if (single.loss.size() != 10u || parallel.loss.size() != 10u) return parallel;
  for (size_t s = 0; s < 10; ++s) {
    EXPECT_GT(single.grad_norm[s], kMaxNorm) << "clipping must bite at step " << s + 1;
    EXPECT_NEAR(parallel.loss[s], single.loss[s], test::kLossRtol * single.loss[s]) << layout << " step " << s + 1;
    EXPECT_NEAR(parallel.grad_norm[s], single.grad_norm[s], test::kLossRtol * single.grad_norm[s])
        << layout << " step " << s + 1;
  }
  EXPECT_FALSE(single.state.empty());
  bool scalars_within = false;
  test::StateComparison c = compare_runs(layout, parallel, single, scalars_within);
  EXPECT_TRUE(c.failures.empty()) << layout << ":\n" << joined(c.failures);
  EXPECT_EQ(c.compared, single.state.size());
  return parallel;
}

TEST(ParallelParity, Pp2MatchesTheSingleRankRun) { expect_parity("PP2", 2, {"parallelism.pp=2"}); }

TEST(ParallelParity, Pp4MatchesTheSingleRankRun) { expect_parity("PP4", 4, {"parallelism.pp=4"}); }

TEST(ParallelParity, Dp2Ep2MatchesTheSingleRankRun) {
  expect_parity("DP2 EP2", 2, {"parallelism.dp=2", "parallelism.ep=2"});
}

TEST(ParallelParity, Pp2Dp2Ep2MatchesTheSingleRankRun) {
  expect_parity("PP2 DP2 EP2", 4, {"parallelism.pp=2", "parallelism.dp=2", "parallelism.ep=2"});
}

// At 640 positions the attention takes the fused kernel (keel::kCpuFusedAttentionFrom): the
// pipeline and the experts' all-to-all around it match the single-rank run as at 64.
TEST(ParallelParity, LongSequencePp2Dp2Ep2MatchesTheSingleRankRun) {
  const std::vector<std::string> shape = {"training.seq_len=640", "training.global_batch=4"};
  std::vector<std::string> sets = {"parallelism.pp=2", "parallelism.dp=2", "parallelism.ep=2"};
  sets.insert(sets.end(), shape.begin(), shape.end());
  expect_parity("PP2 DP2 EP2 640", 4, sets, kJob, {1, shape});
}

TEST(ParallelParity, Pp2Dp2Ep1MatchesTheSingleRankRun) {
  expect_parity("PP2 DP2 EP1", 4, {"parallelism.pp=2", "parallelism.dp=2"});
}

TEST(ParallelParity, Dp4Ep4MatchesTheSingleRankRun) {
  expect_parity("DP4 EP4", 4, {"parallelism.dp=4", "parallelism.ep=4"});
}

// training.cpu_gemm: LibTorch's BLAS (MKL) instead of oneDNN for the models' fp32 products
// only orders the sums otherwise, so its run matches oneDNN's under the same error model.
TEST(ParallelParity, BlasProductsMatchOneDnnProducts) {
  expect_parity("cpu_gemm blas", 1, {"training.cpu_gemm=\\\"blas\\\""});
}

TEST(ParallelParity, Llama3Pp2Dp2MatchesTheSingleRankRun) {
  std::string job = kJob;
  job.replace(job.find("deepseek_v3_mtp"), 15, "llama3");
  job.erase(job.find("n_layers = 4\n"), 13);
  expect_parity("llama3 PP2 DP2", 4, {"parallelism.pp=2", "parallelism.dp=2"}, job);
}

// Two stages per rank: 4 layers in 4 parts, rank 0 holding stages 0 and 2 (the embedding, and
// layer 2), rank 1 stages 1 and 3 (the head, MTP and the embedding's REPLICA).
TEST(ParallelParity, InterleavedPp2MatchesTheSingleRankRun) {
  expect_parity("PP2 v2", 2,
                {"parallelism.pp=2", "parallelism.schedule=interleaved_1f1b", "parallelism.stages_per_rank=2"});
}

TEST(ParallelParity, InterleavedPp2Dp2Ep2MatchesTheSingleRankRun) {
  expect_parity("PP2 DP2 EP2 v2", 4,
                {"parallelism.pp=2", "parallelism.dp=2", "parallelism.ep=2", "parallelism.schedule=interleaved_1f1b",
                 "parallelism.stages_per_rank=2"});
}

// The sharded optimizer with reduce-scattered gradients against the unsharded optimizer of the
// same layout. The clipper sums the norm from each rank's owned rows, in another order than
// the unsharded sum, so the two agree within the error model rather than bitwise (with whole
// gradients the sharded optimizer is bitwise the unsharded one: sharded_optimizer_test.cpp).
void expect_reduce_scatter_parity(const std::string& layout, int ranks, const std::vector<std::string>& sets,
                                  const std::string& scattered) {
  std::vector<std::string> sharded = sets;
  sharded.push_back("parallelism.shard_optimizer=true");
  const JobRun run = expect_parity(layout, ranks, sharded, kJob, {ranks, sets});
  EXPECT_NE(run.result.output.find("gradients reduce-scattered in " + scattered), std::string::npos)
      << run.result.output;
}

TEST(ParallelParity, ReduceScatteredDp2MatchesTheUnshardedOptimizer) {
  expect_reduce_scatter_parity("DP2 RS", 2, {"parallelism.dp=2"}, "2 of 2 bucket(s)\n");
}

TEST(ParallelParity, ReduceScatteredDp4Ep2MatchesTheUnshardedOptimizer) {
  // A bucket per parameter: cuts inside nearly every parameter, experts over edp = 2.
  expect_reduce_scatter_parity("DP4 EP2 RS", 4,
                               {"parallelism.dp=4", "parallelism.ep=2", "parallelism.grad_bucket_mb=0"},
                               "83 of 83 bucket(s)\n");
}

TEST(ParallelParity, ReduceScatteredPp2Dp2Ep2MatchesTheUnshardedOptimizer) {
  // A bucket per parameter: the embedding's and its REPLICA's stay all-reduced (pre_clip sums
  // them whole), every other dense one is reduce-scattered.
  expect_reduce_scatter_parity(
      "PP2 DP2 EP2 RS", 4, {"parallelism.pp=2", "parallelism.dp=2", "parallelism.ep=2", "parallelism.grad_bucket_mb=0"},
      "25 of 26 bucket(s) (the others hold a parameter with a REPLICA copy");
}

// Two schedules of one PP2 DP2 EP2 layout (4 microbatches) give the same bits: every chunk's
// gradients accumulate in microbatch order under both.
void expect_schedules_bitwise(const std::string& a_schedule, const std::string& b_schedule,
                              const std::vector<std::string>& more = {}) {
  test::TempDir dir;
  std::vector<std::string> layout = {"parallelism.pp=2", "parallelism.dp=2", "parallelism.ep=2",
                                     "parallelism.microbatches=4", "training.global_batch=16"};
  layout.insert(layout.end(), more.begin(), more.end());
  std::vector<std::string> a_sets = layout, b_sets = layout;
  a_sets.push_back("parallelism.schedule=" + a_schedule);
  b_sets.push_back("parallelism.schedule=" + b_schedule);
  JobRun a = train(dir, a_schedule, 4, a_sets), b = train(dir, b_schedule, 4, b_sets);
  ASSERT_EQ(a.result.status, 0) << a.result.output;
  ASSERT_EQ(b.result.status, 0) << b.result.output;
  EXPECT_EQ(a.loss.size(), 10u);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.grad_norm, b.grad_norm);
  ASSERT_EQ(a.state.size(), b.state.size());
  for (const auto& [key, t] : a.state) EXPECT_TRUE(at::equal(t, b.state.at(key))) << key;
}

TEST(ParallelParity, GPipeAndOneFOneBAreBitwiseIdentical) { expect_schedules_bitwise("gpipe", "1f1b"); }

// The split backward passes (input, then weight) give the whole passes' gradients bit for bit,
// with the overlapped reduction arming before each chunk's last weight pass.
TEST(ParallelParity, ZeroBubbleH1AndOneFOneBAreBitwiseIdentical) { expect_schedules_bitwise("zb_h1", "1f1b"); }

// With the sharded optimizer the overlapped reduce-scatter starts from the weight passes'
// gradients, and selective recomputation reruns its attention core in the input pass.
TEST(ParallelParity, ZeroBubbleH1WithShardedOptimizerAndSelectiveRecomputeIsBitwiseOneFOneB) {
  expect_schedules_bitwise(
      "zb_h1", "1f1b",
      {"parallelism.shard_optimizer=true", "training.recompute=selective", "parallelism.grad_bucket_mb=0"});
}

TEST(ParallelParity, ZeroBubbleH1Llama3Pp2Dp2MatchesTheSingleRankRun) {
  std::string job = kJob;
  job.replace(job.find("deepseek_v3_mtp"), 15, "llama3");
  job.erase(job.find("n_layers = 4\n"), 13);
  expect_parity("llama3 PP2 DP2 zb_h1", 4, {"parallelism.pp=2", "parallelism.dp=2", "parallelism.schedule=zb_h1"}, job);
}

const std::vector<std::string> kZeroBubbleV = {"parallelism.schedule=zbv", "parallelism.stages_per_rank=2"};

// Every logged step of a pipelined run reports its bubble and the share of it that unequal
// stages force (pipeline_imbalance), which no schedule goes below: 0 <= imbalance <= bubble.
void expect_bubble_metrics(const JobRun& run) {
  const std::vector<double>& bubble = run.pipeline.at("pipeline_bubble");
  const std::vector<double>& imbalance = run.pipeline.at("pipeline_imbalance");
  ASSERT_EQ(bubble.size(), 10u);
  ASSERT_EQ(imbalance.size(), 10u);
  for (size_t s = 0; s < bubble.size(); ++s) {
    EXPECT_GE(imbalance[s], 0.0) << "step " << s + 1;
    EXPECT_LE(imbalance[s], bubble[s]) << "step " << s + 1;
  }
}

// The V: rank 0 holds stages 0 and 3 (the embedding, the head with MTP and the embedding's
// REPLICA), rank 1 stages 1 and 2, handed over in memory at the turn.
TEST(ParallelParity, ZeroBubbleVPp2MatchesTheSingleRankRun) {
  std::vector<std::string> sets = {"parallelism.pp=2"};
  sets.insert(sets.end(), kZeroBubbleV.begin(), kZeroBubbleV.end());
  expect_bubble_metrics(expect_parity("PP2 zbv", 2, sets));
}

TEST(ParallelParity, ZeroBubbleVPp2Dp2Ep2MatchesTheSingleRankRun) {
  std::vector<std::string> sets = {"parallelism.pp=2", "parallelism.dp=2", "parallelism.ep=2"};
  sets.insert(sets.end(), kZeroBubbleV.begin(), kZeroBubbleV.end());
  expect_parity("PP2 DP2 EP2 zbv", 4, sets);
}

TEST(ParallelParity, ZeroBubbleVLlama3Pp2MatchesTheSingleRankRun) {
  std::string job = kJob;
  job.replace(job.find("deepseek_v3_mtp"), 15, "llama3");
  std::vector<std::string> sets = {"parallelism.pp=2"};
  sets.insert(sets.end(), kZeroBubbleV.begin(), kZeroBubbleV.end());
  expect_parity("llama3 PP2 zbv", 2, sets, job);
}

TEST(ParallelParity, ZeroBubbleH1Pp2MatchesTheSingleRankRun) {
  expect_bubble_metrics(expect_parity("PP2 zb_h1", 2, {"parallelism.pp=2", "parallelism.schedule=zb_h1"}));
}

// The comparison has teeth: a genuinely wrong run (a learning rate 10% too large, as a schedule
// off by a step or a wrong scaling would give) fails it, and so does one parameter element
// moved by just over its bound (as a damaged load would), while one moved by just under passes.
TEST(ParallelParity, TheComparisonFailsForAWrongRun) {
  test::TempDir dir;
  JobRun single = train(dir, "single", 1, {});
  ASSERT_EQ(single.result.status, 0) << single.result.output;
  JobRun wrong = train(dir, "wrong", 2, {"parallelism.dp=2", "parallelism.ep=2", "optimizer.lr=3.3e-4"});
  ASSERT_EQ(wrong.result.status, 0) << wrong.result.output;
  bool scalars_within = true;
  test::StateComparison c = compare_runs("lr 10% off", wrong, single, scalars_within);
  EXPECT_FALSE(scalars_within);
  EXPECT_FALSE(c.failures.empty());
  EXPECT_GT(c.worst["exp_avg"], 1.0);

  std::string key;
  for (const auto& [k, t] : single.state)
    if (test::state_class(k) == "parameters" && t.numel() > 0) key = k;
  ASSERT_FALSE(key.empty());
  const test::Tolerance bound = test::parameter_tolerance(job_bounds());
  for (double by : {1.01, 0.99}) {
    std::map<std::string, at::Tensor> moved = single.state;
    at::Tensor t = moved.at(key).clone();
    const double x = t.view({-1})[0].item<double>();
    t.view({-1})[0] = x + by * (bound.atol + bound.rtol * std::abs(x));
    moved[key] = t;
    test::StateComparison one = test::compare_states(moved, single.state, job_bounds());
    if (by > 1) {
      ASSERT_EQ(one.failures.size(), 1u) << joined(one.failures);
      EXPECT_EQ(one.failures[0].rfind(key + ": ", 0), 0u) << one.failures[0];
    } else {
      EXPECT_TRUE(one.failures.empty()) << joined(one.failures);
    }
  }
}

TEST(ReplicaContract, APerturbedReplicaBeforePostInitIsRepairedByIt) {
  test::TempDir dir;
  JobRun run = train(dir, "repaired", 2, {"parallelism.pp=2", "debug.perturb_replicas=before_post_init"});
  ASSERT_EQ(run.result.status, 0) << run.result.output;
  EXPECT_NE(run.result.output.find("perturbed 1 replica(s) before post_init"), std::string::npos);
  EXPECT_NE(run.result.output.find("replica guard: 10 check(s), every copy of every parameter bitwise equal"),
            std::string::npos)
      << run.result.output;
}

TEST(ReplicaContract, APerturbationAfterPostInitIsCaughtByTheGuardNamingTheParameter) {
  test::TempDir dir;
  JobRun run = train(dir, "caught", 2, {"parallelism.pp=2", "debug.perturb_replicas=after_post_init"});
  EXPECT_NE(run.result.status, 0);
  // The hashes differ from CPU to CPU; the parameter, the ranks and their order do not.
  const std::string& out = run.result.output;
  const size_t named = out.find("replica guard after step 1: the copies of 'tok_embeddings.weight' differ: ");
  ASSERT_NE(named, std::string::npos) << out;
  const size_t first = out.find("rank(s) 0 hold xxh64 ", named),
               second = out.find("rank(s) 1 (REPLICA) hold xxh64 ", named);
  ASSERT_NE(first, std::string::npos) << out;
  ASSERT_NE(second, std::string::npos) << out;
  EXPECT_LT(first, second) << "ranks in ascending order:\n" << out;
}

// A bad layout stops one process before any work (no rendezvous is awaited), naming the setting.
void expect_refused(const std::string& world, const std::string& sets, const std::string& message) {
  test::TempDir dir;
  test::write_file(dir / "job.toml", kJob);
  auto start = std::chrono::steady_clock::now();
  auto r = test::run_command("RANK=0 WORLD_SIZE=" + world + " MASTER_PORT=" + std::to_string(test::free_port()) +
                             " timeout 60 " + test::bin_dir() + "/keel-train --plugin-path " + test::plugin_dir() +
                             " --config " + (dir / "job.toml") + sets);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20.0);
}

TEST(BadLayout, PpTimesDpOtherThanTheWorldIsRefused) {
  expect_refused("3", " --set parallelism.pp=2", "parallelism.pp: pp x dp = 2 x 1 = 2, but the job runs 3 rank(s)");
}

TEST(BadLayout, EpNotDividingDpIsRefused) {
  expect_refused("4", " --set parallelism.dp=4 --set parallelism.ep=3",
                 "parallelism.ep: ep must divide dp; ep = 3, dp = 4");
}

TEST(BadLayout, ExpertsNotDivisibleByEpAreRefused) {
  expect_refused("6", " --set parallelism.dp=6 --set parallelism.ep=3 --set training.global_batch=12",
                 "model.n_routed_experts: must be divisible by parallelism.ep (3), got 8");
}

TEST(BadLayout, FewerLayersThanStagesAreRefused) {
  expect_refused("8", " --set parallelism.pp=8",
                 "parallelism.pp: the model has 4 layers, fewer than the 8 pipeline stages");
}

TEST(BadLayout, ExplicitStageLayersMustCoverTheModel) {
  expect_refused("2", " --set parallelism.pp=2 --set parallelism.layers_per_stage=[3,2]",
                 "parallelism.layers_per_stage: the counts sum to 5 layers, but the model has 4");
}

TEST(BadLayout, InterleavingLayersThatDoNotDivideIntoTheStagesIsRefused) {
  expect_refused("2",
                 " --set parallelism.pp=2 --set parallelism.schedule=interleaved_1f1b --set "
                 "parallelism.stages_per_rank=3",
                 "parallelism.stages_per_rank: the model's 4 layers do not divide into pp x stages_per_rank = 6 equal "
                 "stages");
}

TEST(BadLayout, InterleavingMicrobatchesThatAreNoMultipleOfPpAreRefused) {
  expect_refused("2",
                 " --set parallelism.pp=2 --set parallelism.schedule=interleaved_1f1b --set "
                 "parallelism.stages_per_rank=2 --set parallelism.microbatches=1",
                 "parallelism.microbatches: interleaved_1f1b needs a multiple of pp = 2, got 1");
}

TEST(BadLayout, ZeroBubbleWithFullRecomputationIsRefused) {
  expect_refused("2", " --set parallelism.pp=2 --set parallelism.schedule=zb_h1 --set training.recompute=full",
                 "training.recompute: \"full\" cannot run under parallelism.schedule = \"zb_h1\"");
}

TEST(BadLayout, ZeroBubbleWithLeanRecomputationIsRefused) {
  // Lean regions hold weights, as full ones do: no separate weight pass to defer.
  expect_refused("2", " --set parallelism.pp=2 --set parallelism.schedule=zb_h1 --set training.recompute=lean",
                 "training.recompute: \"lean\" cannot run under parallelism.schedule = \"zb_h1\"");
}

TEST(BadLayout, ZeroBubbleVHoldsTwoStagesPerRankOnTwoOrMoreRanks) {
  expect_refused("2", " --set parallelism.pp=2 --set parallelism.schedule=zbv",
                 "parallelism.stages_per_rank: zbv holds 2 stages per rank in a V (set stages_per_rank = 2), got 1");
  expect_refused("1", " --set parallelism.schedule=zbv --set parallelism.stages_per_rank=2",
                 "parallelism.pp: zbv needs pp >= 2, got 1");
  expect_refused("4", " --set parallelism.pp=4 --set parallelism.schedule=zbv --set parallelism.stages_per_rank=2",
                 "parallelism.stages_per_rank: the model's 4 layers do not divide into pp x stages_per_rank = 8 equal "
                 "stages");
  expect_refused("2",
                 " --set parallelism.pp=2 --set parallelism.schedule=zbv --set parallelism.stages_per_rank=2 --set "
                 "training.recompute=full",
                 "training.recompute: \"full\" cannot run under parallelism.schedule = \"zbv\"");
}

TEST(BadLayout, SeveralStagesPerRankNeedTheInterleavedSchedule) {
  expect_refused(
      "2", " --set parallelism.pp=2 --set parallelism.stages_per_rank=2",
      "parallelism.stages_per_rank: only schedule = \"interleaved_1f1b\" or \"zbv\" holds several stages per rank; "
      "\"1f1b\" holds 1, got 2");
}

TEST(DryRun, EveryRankPartOfALayoutIsPrintedFromOneProcess) {
  test::TempDir dir;
  test::write_file(dir / "job.toml", kJob);
  auto r = test::run_command(test::bin_dir() + "/keel-train --dry-run --plugin-path " + test::plugin_dir() +
                             " --config " + (dir / "job.toml") +
                             " --set parallelism.pp=2 --set parallelism.dp=4 --set parallelism.ep=2"
                             " --set parallelism.layers_per_stage=[1,3]");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("mesh: pp 2 x dp 4 (ep 2, edp 2), 8 rank(s)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ranks 0,2: stage 0/2, layers 0-0 (1), "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ranks 1,3: stage 0/2, layers 0-0 (1), "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ranks 5,7: stage 1/2, layers 1-3 (3), experts 4-7 of 8"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("REPLICA: tok_embeddings.weight"), std::string::npos) << r.output;
  // The logical model is counted once whatever the layout.
  auto single = test::run_command(test::bin_dir() + "/keel-train --dry-run --plugin-path " + test::plugin_dir() +
                                  " --config " + (dir / "job.toml"));
  std::string total = single.output.substr(single.output.find("  total"));
  EXPECT_NE(r.output.find(total.substr(0, total.find(','))), std::string::npos) << single.output << r.output;
}

}  // namespace
}  // namespace keel
