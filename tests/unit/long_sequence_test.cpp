// DeepSeek-V3 at sequences where the attention kernel matters (512 positions and more): the
// fused kernel against the materialised product, selective recomputation on the fused path,
// and the activation estimate of both paths against what a forward keeps.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>
#include <keel/attention.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>

#include "kept_bytes.hpp"
#include "model_fixture.hpp"

namespace keel {
namespace {

class LongSequence : public test::ModelFixture {
 protected:
  LongSequence() : ModelFixture("deepseek_v3_mtp") {}

  struct Run {
    double loss = 0;
    std::map<std::string, at::Tensor> grads;
  };

  // One forward and backward of the whole tiny model on [batch, seq] random tokens.
  Run run(const std::string& kernel, int64_t batch, int64_t seq, const std::string& recompute = "none") {
    auto model = make("flavor = \"tiny\"\nattention_kernel = \"" + kernel + "\"\n");
    if (recompute != "none") model->set_recompute(recompute, "training.recompute");
    ModelPart& part = model->build_part(spec(0, 1, 0, 3));
    part.init_weights(5);
    at::manual_seed(11);
    const at::Tensor tokens = at::randint(256, {batch, seq}, at::kLong);
    const at::Tensor labels = at::randint(256, {batch, seq}, at::kLong);
    at::Tensor loss = part.forward(tokens, labels, nullptr, 0, 1);
    loss.backward();
    Run out;
    out.loss = loss.item<double>();
    for (const ParamRef& p : part.parameters())
      if (p.tensor().grad().defined()) out.grads[p.fqn()] = p.tensor().grad().clone();
    return out;
  }
};

// Both kernels sum the same fp32 products in other orders: each result within 1e-5 of the
// largest magnitude of its reference tensor (a few hundred fp32 ulps at that magnitude, for
// sums over 512 positions; a wrong mask or scale is off by a whole fraction of it).
void expect_close(const std::map<std::string, at::Tensor>& got, const std::map<std::string, at::Tensor>& want,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [fqn, ref] : want) {
    const at::Tensor& g = got.at(fqn);
    const double scale = std::max(ref.abs().max().item<double>(), 1e-30);
    const double diff = (g - ref).abs().max().item<double>();
    EXPECT_LE(diff, 1e-5 * scale) << what << ": " << fqn << " differs by " << diff << " at magnitude " << scale;
  }
}

TEST_F(LongSequence, FusedAttentionMatchesTheMaterialisedProductAndItsGradients) {
  const Run fused = run("fused", 1, 512), materialised = run("materialised", 1, 512);
  EXPECT_NEAR(fused.loss, materialised.loss, 1e-5 * std::abs(materialised.loss));
  expect_close(fused.grads, materialised.grads, "fused against materialised");
  // The tiny flavor's query/key heads (24) exceed its value heads (16): the padded path ran.
  EXPECT_EQ(fused.grads.count("layers.0.attention.wkv_b.weight"), 1u);
}

TEST_F(LongSequence, SelectiveRecomputationIsBitwiseTheKeptRunOnTheFusedPath) {
  const Run kept = run("fused", 1, 512), selective = run("fused", 1, 512, "selective");
  EXPECT_EQ(kept.loss, selective.loss);
  ASSERT_EQ(kept.grads.size(), selective.grads.size());
  for (const auto& [fqn, g] : kept.grads) EXPECT_TRUE(at::equal(g, selective.grads.at(fqn))) << fqn;
}

TEST_F(LongSequence, AutoTakesTheFusedKernelFromTheMeasuredCrossover) {
  // "auto" is the fused run from keel::kCpuFusedAttentionFrom positions, the materialised one
  // below, bitwise.
  const int64_t from = keel::kCpuFusedAttentionFrom;
  const Run at_crossover = run("auto", 1, from), fused = run("fused", 1, from);
  EXPECT_EQ(at_crossover.loss, fused.loss);
  for (const auto& [fqn, g] : fused.grads) EXPECT_TRUE(at::equal(g, at_crossover.grads.at(fqn))) << fqn;
  const Run below = run("auto", 1, from - 1), materialised = run("materialised", 1, from - 1);
  EXPECT_EQ(below.loss, materialised.loss);
  for (const auto& [fqn, g] : materialised.grads) EXPECT_TRUE(at::equal(g, below.grads.at(fqn))) << fqn;
}

TEST_F(LongSequence, TheActivationEstimateFollowsTheKernelWithin15Percent) {
  for (const char* kernel : {"fused", "materialised"})
    for (const test::KeptBytes& k : test::estimates_against_kept_bytes(
             [&] { return make(std::string("flavor = \"tiny\"\nattention_kernel = \"") + kernel + "\"\n"); },
             {{spec(0, 1, 0, 3)}, {spec(0, 2, 0, 2), spec(1, 2, 2, 1)}}, /*batch=*/1, /*seq=*/512, 256, 64)) {
      std::printf("ACTIVATIONS | tiny seq 512 %s %s stage %d/%d | estimate %.0f B, measured %.0f B, ratio %.3f\n",
                  kernel, k.mode.c_str(), k.spec.stage_index, k.spec.num_stages, k.estimate, k.measured,
                  k.estimate / k.measured);
      EXPECT_NEAR(k.estimate / k.measured, 1.0, 0.15) << kernel << " " << k.mode << " stage " << k.spec.stage_index;
    }
}

TEST_F(LongSequence, TheDebugFlavorsEstimateIsWithin15PercentAt512And2048) {
  // The debug flavor's shapes (a dense and an MoE layer, one each, so that it stays quick) at
  // the lengths of the memory plan's check, each kernel as "auto" takes it: materialised at
  // 512, fused at 2048.
  for (const int64_t seq : {512, 2048})
    for (const test::KeptBytes& k : test::estimates_against_kept_bytes(
             [&] { return make("flavor = \"debug\"\nn_layers = 2\nnum_mtp_layers = 0\n"); },
             {{spec(0, 2, 0, 1)}, {spec(0, 2, 1, 1)}}, /*batch=*/1, seq, 2048, 256)) {
      if (k.mode == "full") continue;
      std::printf("ACTIVATIONS | debug seq %ld %s layer %d | estimate %.0f B, measured %.0f B, ratio %.3f\n",
                  static_cast<long>(seq), k.mode.c_str(), k.spec.first_layer, k.estimate, k.measured,
                  k.estimate / k.measured);
      EXPECT_NEAR(k.estimate / k.measured, 1.0, 0.15) << seq << " " << k.mode << " layer " << k.spec.first_layer;
    }
}

TEST_F(LongSequence, TheFusedKernelKeepsNoSquareOfTheSequence) {
  // Kept bytes per token at two lengths: the materialised path grows with the sequence (its
  // probabilities), the fused one does not (within the allocator's rounding). The fused one at
  // 1024 and 2048 positions, both on the blocked CPU kernel (from kCpuFusedAttentionFrom).
  auto per_token = [&](const char* kernel, int64_t seq) {
    auto model = make(std::string("flavor = \"tiny\"\nattention_kernel = \"") + kernel + "\"\n");
    ModelPart& part = model->build_part(spec(0, 1, 0, 3));
    part.init_weights(1);
    const int threads = at::get_num_threads();
    at::set_num_threads(1);
    const double bytes = static_cast<double>(test::measured_kept_bytes(part, 1, seq, 256, 64));
    at::set_num_threads(threads);
    return bytes / static_cast<double>(seq);
  };
  const double fused_1024 = per_token("fused", 1024), fused_2048 = per_token("fused", 2048);
  const double materialised_512 = per_token("materialised", 512), materialised_1024 = per_token("materialised", 1024);
  std::printf("KEPT PER TOKEN | fused %.0f / %.0f B (1024 / 2048), materialised %.0f / %.0f B (512 / 1024)\n",
              fused_1024, fused_2048, materialised_512, materialised_1024);
  EXPECT_NEAR(fused_2048 / fused_1024, 1.0, 0.05);
  EXPECT_GT(materialised_1024 / materialised_512, 1.3);
}

TEST_F(LongSequence, TheDebugFlavorsBf16EstimateIsWithin15PercentAt512And2048) {
  // Under autocast (training.dtype = "bf16") the products keep cast copies of their fp32
  // inputs, the residual stream stays fp32 and the weights are cast once a step (not counted
  // per microbatch): the first stage (dense layer) and the last (MoE layer, head, one MTP depth).
  for (const int64_t seq : {512, 2048})
    for (const test::KeptBytes& k : test::estimates_against_kept_bytes(
             [&] { return make("flavor = \"debug\"\nn_layers = 2\nnum_mtp_layers = 1\n"); },
             {{spec(0, 2, 0, 1), spec(1, 2, 1, 1)}}, /*batch=*/1, seq, 2048, 256, /*until_weight_pass=*/false,
             at::kBFloat16)) {
      std::printf("ACTIVATIONS | debug bf16 seq %ld %s stage %d/2 | estimate %.0f B, measured %.0f B, ratio %.3f\n",
                  static_cast<long>(seq), k.mode.c_str(), k.spec.stage_index, k.estimate, k.measured,
                  k.estimate / k.measured);
      EXPECT_NEAR(k.estimate / k.measured, 1.0, 0.15) << seq << " " << k.mode << " stage " << k.spec.stage_index;
    }
}

TEST_F(LongSequence, LeanRecomputationKeepsLessThanSelective) {
  // The lever the 671b plan needs at 4096 tokens: on an MoE layer, lean keeps less than a third
  // of what selective keeps (measured, fp32 and bf16).
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    std::map<std::string, double> kept;
    for (const test::KeptBytes& k : test::estimates_against_kept_bytes(
             [&] { return make("flavor = \"debug\"\nn_layers = 2\nnum_mtp_layers = 0\n"); }, {{spec(0, 2, 1, 1)}},
             /*batch=*/1, 1024, 2048, 256, /*until_weight_pass=*/false, dtype))
      kept[k.mode] = k.measured;
    std::printf("ACTIVATIONS | debug MoE layer seq 1024 %s | none %.0f B, selective %.0f B, lean %.0f B, full %.0f B\n",
                dtype == at::kFloat ? "fp32" : "bf16", kept["none"], kept["selective"], kept["lean"], kept["full"]);
    EXPECT_LT(kept["lean"], kept["selective"] / 3);
    EXPECT_GT(kept["lean"], kept["full"]);
  }
}

}  // namespace
}  // namespace keel
