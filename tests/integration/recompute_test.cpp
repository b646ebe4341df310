// Activation recomputation (training.recompute) against keeping every activation: "full"
// reruns each transformer block in backward, "selective" the attention core and the SwiGLU
// products, "lean" each sub-layer with its residual (DeepSeek-V3's MoE: its router, shared
// and routed experts from the kept normed input and rows). The rerun computes bitwise what the first run did (same
// inputs, same kernels, the random state and autocast put back, statistics such as DeepSeek-V3's expert loads counted
// once), so every mode must give bitwise the same losses, grad norms and final state — MoE
// routing and the expert bias included — on llama3 and deepseek_v3_mtp, one rank and PP2.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "job_runs.hpp"

namespace keel {
namespace {

using test::JobRun;

const std::string kLlama = test::tiny_job("plugin = \"llama3\"\nflavor = \"tiny\"\nn_layers = 4\n");

void expect_modes_are_bitwise_the_same(const std::string& label, const std::string& job, int ranks,
                                       std::vector<std::string> sets) {
  test::TempDir dir;
  sets.push_back("training.steps=4");
  const JobRun kept = test::run_job(dir, "none", ranks, job, sets);
  ASSERT_EQ(kept.result.status, 0) << kept.result.output;
  ASSERT_EQ(kept.loss.size(), 4u);
  ASSERT_FALSE(kept.state.empty());
  for (const char* mode : {"full", "selective", "lean"}) {
    std::vector<std::string> with_mode = sets;
    with_mode.push_back(std::string("training.recompute=\\\"") + mode + "\\\"");
    const JobRun run = test::run_job(dir, mode, ranks, job, with_mode);
    ASSERT_EQ(run.result.status, 0) << run.result.output;
    ASSERT_EQ(run.loss.size(), kept.loss.size());
    EXPECT_EQ(std::memcmp(run.loss.data(), kept.loss.data(), 4 * sizeof(double)), 0) << label << " " << mode;
    EXPECT_EQ(std::memcmp(run.grad_norm.data(), kept.grad_norm.data(), 4 * sizeof(double)), 0) << label << " " << mode;
    ASSERT_EQ(run.state.size(), kept.state.size());
    for (const auto& [key, tensor] : kept.state) {
      ASSERT_TRUE(run.state.count(key)) << key;
      EXPECT_TRUE(at::equal(tensor, run.state.at(key))) << label << " " << mode << ": " << key;
    }
    std::printf(
        "RECOMPUTE | %-22s | %-9s | 4 steps: losses, grad norms and %zu state tensors bitwise those of "
        "none | %.1f s vs %.1f s\n",
        label.c_str(), mode, run.state.size(), run.seconds, kept.seconds);
  }
}

TEST(Recompute, Llama3OneRankIsBitwiseTheRunThatKeepsActivations) {
  expect_modes_are_bitwise_the_same("llama3, one rank", kLlama, 1, {});
}

TEST(Recompute, Llama3Pp2IsBitwiseTheRunThatKeepsActivations) {
  expect_modes_are_bitwise_the_same("llama3, PP2", kLlama, 2, {"parallelism.pp=2"});
}

TEST(Recompute, DeepSeekV3OneRankIsBitwiseTheRunThatKeepsActivations) {
  expect_modes_are_bitwise_the_same("deepseek_v3_mtp, one rank", test::tiny_deepseek_job(), 1, {});
}

TEST(Recompute, DeepSeekV3Pp2IsBitwiseTheRunThatKeepsActivations) {
  expect_modes_are_bitwise_the_same("deepseek_v3_mtp, PP2", test::tiny_deepseek_job(), 2, {"parallelism.pp=2"});
}

TEST(Recompute, DeepSeekV3Bf16IsBitwiseTheRunThatKeepsActivations) {
  // Under autocast each weight is cast once a step and shared by the microbatches; a region's
  // first run, with gradients off, casts afresh, so that no cast without a gradient function
  // reaches the cache (met by a rerun, it would cut the weights off from their gradients).
  // The rerun casts afresh as well: its inputs are leaves, whose casts autocast would cache and
  // share between their products, which would then sum their gradients in bf16.
  expect_modes_are_bitwise_the_same("deepseek_v3_mtp, bf16", test::tiny_deepseek_job(), 1,
                                    {"training.dtype=\\\"bf16\\\""});
}

TEST(Recompute, DeepSeekV3Pp2Dp2Ep2IsBitwiseTheRunThatKeepsActivations) {
  // The experts' all-to-all runs again in each rerun, on every rank of the ep group alike.
  expect_modes_are_bitwise_the_same("deepseek_v3_mtp, PP2 DP2 EP2", test::tiny_deepseek_job(), 4,
                                    {"parallelism.pp=2", "parallelism.dp=2", "parallelism.ep=2"});
}

}  // namespace
}  // namespace keel
