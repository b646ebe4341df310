// The llama3 plugin's activation estimate against what a forward keeps, measured from the CPU
// allocator, on the fused attention kernel LibTorch picks and on its math path.
#include <gtest/gtest.h>

#include <ATen/Context.h>

#include <cstdio>

#include "kept_bytes.hpp"
#include "llama3_activations.hpp"
#include "model_fixture.hpp"

namespace keel {
namespace {

class Llama3Activations : public test::ModelFixture {
 protected:
  Llama3Activations() : ModelFixture("llama3") {}
  void TearDown() override { at::globalContext().setSDPUseFlash(true); }

  // Each recompute mode on one stage and on two (both layers and the head; or layer 0, then
  // layer 1 and the head), estimate against measurement.
  void expect_estimates_within_a_quarter(const char* path) {
    for (const test::KeptBytes& k : test::estimates_against_kept_bytes(
             [this] { return make("flavor = \"tiny\"\n"); }, {{spec(0, 1, 0, 2)}, {spec(0, 2, 0, 1), spec(1, 2, 1, 1)}},
             /*batch=*/2, /*seq=*/48, 256, 64)) {
      std::printf(
          "ACTIVATIONS | llama3 tiny, %s attention, %s, stage %d/%d | estimate %.0f B, measured %.0f B, "
          "ratio %.3f\n",
          path, k.mode.c_str(), k.spec.stage_index, k.spec.num_stages, k.estimate, k.measured, k.estimate / k.measured);
      EXPECT_NEAR(k.estimate / k.measured, 1.0, 0.25) << path << " " << k.mode << " stage " << k.spec.stage_index;
    }
  }
};

TEST_F(Llama3Activations, TheEstimateIsWithinAQuarterOfWhatAForwardKeepsOnTheKernelLibTorchPicks) {
  llama3::Args args;
  args.dim = 64;
  args.n_heads = 4;
  args.n_kv_heads = 2;
  const char* path = llama3::fused_attention(args, spec(0, 1, 0, 2)) ? "fused" : "math";
  expect_estimates_within_a_quarter(path);
}

TEST_F(Llama3Activations, TheEstimateFollowsAttentionOntoTheMathPath) {
  // With the fused kernel turned off, LibTorch runs (and the estimate counts) the math path,
  // which keeps the [batch, heads, seq, seq] probabilities.
  at::globalContext().setSDPUseFlash(false);
  llama3::Args args;
  args.dim = 64;
  args.n_heads = 4;
  args.n_kv_heads = 2;
  ASSERT_FALSE(llama3::fused_attention(args, spec(0, 1, 0, 2)));
  expect_estimates_within_a_quarter("math");
}

}  // namespace
}  // namespace keel
