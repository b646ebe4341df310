// The deepseek_v3_mtp plugin through the host: stage-aware parts with the embedding replica,
// model-table validation, the expert-bias update, and the dry-run figures of 671b and 16b.
#include <gtest/gtest.h>

#include <keel/init.hpp>

#include <algorithm>
#include <cmath>
#include <map>

#include "common/error.hpp"
#include "config/config_tree.hpp"
#include "dry_run_counts.hpp"
#include "kept_bytes.hpp"
#include "mesh/mesh.hpp"
#include "metrics/step_metrics.hpp"
#include "model_fixture.hpp"
#include "plugins/components.hpp"
#include "plugins/plugin_registry.hpp"
#include "test_support.hpp"
#include "train/dry_run.hpp"
#include "train/job.hpp"

namespace keel {
namespace {

class DeepSeekModel : public test::ModelFixture {
 protected:
  DeepSeekModel() : ModelFixture("deepseek_v3_mtp") {}
  std::string error(const std::string& table) {
    try {
      make(table);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  }
};

TEST_F(DeepSeekModel, TwoStagePartsHoldTheEmbeddingReplicaUnderTheSameFqn) {
  auto model = make("flavor = \"tiny\"\n");
  ModelPart& first = model->build_part(spec(0, 2, 0, 2));
  ModelPart& last = model->build_part(spec(1, 2, 2, 1));
  std::map<std::string, const ParamRef*> a, b;
  for (const ParamRef& p : first.parameters()) a[p.fqn()] = &p;
  for (const ParamRef& p : last.parameters()) b[p.fqn()] = &p;

  ASSERT_TRUE(a.count("tok_embeddings.weight"));
  ASSERT_TRUE(b.count("tok_embeddings.weight"));
  EXPECT_FALSE(a["tok_embeddings.weight"]->replica());
  EXPECT_TRUE(b["tok_embeddings.weight"]->replica());
  EXPECT_EQ(a["tok_embeddings.weight"]->tensor().sizes(), b["tok_embeddings.weight"]->tensor().sizes());
  EXPECT_EQ(b["tok_embeddings.weight"]->tensor().sizes(), (at::IntArrayRef{256, 64}));
  // Layers 0-1 on the first stage; layer 2, the head and MTP on the last.
  EXPECT_TRUE(a.count("layers.1.moe.router.gate.weight"));
  EXPECT_TRUE(a.count("layers.0.feed_forward.w1.weight"));
  EXPECT_FALSE(a.count("output.weight") || a.count("norm.weight") || a.count("mtp.0.eh_proj.weight"));
  EXPECT_TRUE(b.count("layers.2.attention.wkv_a.weight"));
  EXPECT_EQ(b["output.weight"]->tensor().sizes(), (at::IntArrayRef{256, 64}));
  EXPECT_EQ(b["mtp.0.eh_proj.weight"]->tensor().sizes(), (at::IntArrayRef{64, 128}));
  EXPECT_EQ(b["mtp.0.eh_proj.weight"]->module_group(), "mtp");
  // Expert tensors are flagged and placed in their global tensor.
  const ParamRef& w1 = *b["layers.2.moe.experts.w1"];
  EXPECT_TRUE(w1.expert());
  EXPECT_EQ(w1.shard_dim(), 0);
  EXPECT_EQ(w1.global_dim_size(), 8);
  EXPECT_EQ(w1.tensor().sizes(), (at::IntArrayRef{8, 32, 64}));
  // No FQN but the embedding appears on both stages.
  for (const auto& [fqn, p] : a) {
    if (fqn != "tok_embeddings.weight") {
      EXPECT_FALSE(b.count(fqn)) << fqn;
    }
  }
  // The expert bias is a persistent buffer; the load counter is not.
  bool bias = false, load = false;
  for (const ParamRef& buf : last.buffers()) {
    if (buf.fqn() == "layers.2.moe.expert_bias") bias = buf.persistent();
    if (buf.fqn() == "layers.2.moe.tokens_per_expert") load = !buf.persistent();
  }
  EXPECT_TRUE(bias && load);
}

TEST_F(DeepSeekModel, InitIsTheSameOnEitherStageAndOnASingleStage) {
  auto split = make("flavor = \"tiny\"\n");
  ModelPart& s0 = split->build_part(spec(0, 2, 0, 2));
  ModelPart& s1 = split->build_part(spec(1, 2, 2, 1));
  s0.init_weights(3);
  s1.init_weights(3);
  auto whole_model = make("flavor = \"tiny\"\n");
  ModelPart& whole = whole_model->build_part(spec(0, 1, 0, 3));
  whole.init_weights(3);
  std::map<std::string, at::Tensor> reference;
  for (const ParamRef& p : whole.parameters()) reference[p.fqn()] = p.tensor();
  for (ModelPart* part : {&s0, &s1}) {
    for (const ParamRef& p : part->parameters()) {
      EXPECT_TRUE(at::equal(p.tensor(), reference.at(p.fqn()))) << p.fqn();
    }
  }
}

TEST_F(DeepSeekModel, InitIsTorchtitansDepthScaledPerBlock) {
  // torchtitan's DeepSeek-V3: 0.02 into a block; the router, wo, w2 and w3 of block `layer`
  // (MTP depth k is block n_layers + k) at 0.02 / sqrt(2 (layer + 1)).
  auto model = make("flavor = \"tiny\"\n");
  ModelPart& part = model->build_part(spec(0, 1, 0, 3));
  part.init_weights(7);
  std::map<std::string, at::Tensor> weights;
  for (const ParamRef& p : part.parameters()) weights[p.fqn()] = p.tensor();
  auto expect_drawn = [&](const std::string& fqn, int64_t layer_or_input, int64_t expert = -1) {
    const double std = layer_or_input < 0 ? 0.02 : 0.02 / std::sqrt(2.0 * static_cast<double>(layer_or_input + 1));
    at::Tensor actual = expert < 0 ? weights.at(fqn) : weights.at(fqn)[expert];
    at::Tensor expected = at::empty(actual.sizes());
    init::truncated_normal_(expected, 7, fqn, std, 3.0, expert);
    EXPECT_TRUE(at::equal(actual, expected)) << fqn << " expert " << expert << ", std " << std;
  };
  const int64_t input = -1;
  expect_drawn("layers.0.attention.wq_a.weight", input);
  expect_drawn("layers.0.attention.wkv_b.weight", input);
  expect_drawn("layers.0.attention.wo.weight", 0);
  expect_drawn("layers.0.feed_forward.w1.weight", input);
  expect_drawn("layers.0.feed_forward.w2.weight", 0);
  expect_drawn("layers.0.feed_forward.w3.weight", 0);
  expect_drawn("layers.2.moe.router.gate.weight", 2);
  expect_drawn("layers.2.moe.experts.w1", input, 5);
  expect_drawn("layers.2.moe.experts.w2", 2, 5);
  expect_drawn("layers.2.moe.experts.w3", 2, 5);
  expect_drawn("layers.2.moe.shared_experts.w3.weight", 2);
  expect_drawn("mtp.0.eh_proj.weight", input);
  expect_drawn("mtp.0.block.moe.experts.w3", 3, 0);
  EXPECT_TRUE(at::equal(weights.at("layers.1.ffn_norm.weight"), at::ones({64})));
}

TEST_F(DeepSeekModel, ImpossibleShapesAreConfigErrorsNamingTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"flavor = \"tiny\"\ntop_k = 9\n", "job.toml:3: model.top_k: exceeds n_routed_experts (8)"},
      {"flavor = \"tiny\"\nn_expert_groups = 3\n",
       "job.toml:3: model.n_expert_groups: must divide n_routed_experts (8)"},
      {"flavor = \"tiny\"\nn_limited_groups = 5\n", "job.toml:3: model.n_limited_groups: exceeds n_expert_groups (4)"},
      {"flavor = \"tiny\"\nqk_rope_head_dim = 7\n", "job.toml:3: model.qk_rope_head_dim: must be even"},
      {"flavor = \"tiny\"\nscore_func = \"relu\"\n",
       "job.toml:3: model.score_func: must be \"softmax\" or \"sigmoid\""},
      {"flavor = \"tiny\"\nn_dense_layers = 4\n", "job.toml:3: model.n_dense_layers: exceeds n_layers (3)"},
      {"flavor = \"tiny\"\nn_heads = 0\n", "job.toml:3: model.n_heads: must be at least 1"},
      {"flavor = \"tiny\"\nn_limited_groups = 1\ntop_k = 3\n",
       "model.top_k: exceeds the experts of the n_limited_groups"},
      {"flavor = \"huge\"\n", "job.toml:2: model.flavor: unknown flavor 'huge'"},
  };
  for (const auto& [table, expected] : cases) {
    std::string message = error(table);
    EXPECT_NE(message.find(expected), std::string::npos) << table << " -> " << message;
  }
}

TEST_F(DeepSeekModel, PostStepMovesTheBiasTowardsUnderloadedExperts) {
  auto model = make("flavor = \"tiny\"\nload_balance_coeff = 0.01\n");
  ModelPart& part = model->build_part(spec(0, 1, 0, 3));
  part.init_weights(1);
  at::Tensor *load = nullptr, *bias = nullptr;
  for (const ParamRef& b : part.buffers()) {
    if (b.fqn() == "layers.1.moe.tokens_per_expert") load = &b.tensor();
    if (b.fqn() == "layers.1.moe.expert_bias") bias = &b.tensor();
  }
  ASSERT_TRUE(load && bias);
  load->copy_(at::tensor({10.f, 0.f, 5.f, 5.f, 5.f, 5.f, 5.f, 5.f}));  // expert 0 over, expert 1 under
  model->post_step();
  EXPECT_LT((*bias)[0].item<float>(), 0.f);
  EXPECT_GT((*bias)[1].item<float>(), 0.f);
  EXPECT_NEAR(bias->sum().item<float>(), 0.f, 1e-7);  // centred
  EXPECT_EQ(load->sum().item<float>(), 0.f);          // counts restart each step
}

TEST_F(DeepSeekModel, TheActivationEstimateIsWithinAQuarterOfWhatAForwardKeeps) {
  // The routed experts run apart on oneDNN (slots rounded up) and batched on BLAS: the estimate
  // follows LibTorch's oneDNN switch, as training.cpu_gemm sets it.
  const bool before = at::globalContext().userEnabledMkldnn();
  for (const bool onednn : {true, false}) {
    at::globalContext().setUserEnabledMkldnn(onednn);
    // One stage of layers 0-2 with the head and MTP; or layers 0-1, then layer 2 and the head.
    for (const test::KeptBytes& k : test::estimates_against_kept_bytes(
             [this] { return make("flavor = \"tiny\"\n"); }, {{spec(0, 1, 0, 3)}, {spec(0, 2, 0, 2), spec(1, 2, 2, 1)}},
             /*batch=*/2, /*seq=*/48, 256, 64)) {
      std::printf("ACTIVATIONS | tiny %s %s stage %d/%d | estimate %.0f B, measured %.0f B, ratio %.3f\n",
                  onednn ? "onednn" : "blas", k.mode.c_str(), k.spec.stage_index, k.spec.num_stages, k.estimate,
                  k.measured, k.estimate / k.measured);
      EXPECT_NEAR(k.estimate / k.measured, 1.0, 0.25)
          << (onednn ? "onednn " : "blas ") << k.mode << " stage " << k.spec.stage_index;
    }
  }
  at::globalContext().setUserEnabledMkldnn(before);
}

std::map<std::string, ParamCount> dry_run(const std::string& flavor) {
  return test::dry_run_counts("deepseek_v3_mtp", flavor);
}

TEST(DeepSeekDryRun, V3_671bMatchesThePublishedSizes) {
  auto counts = dry_run("671b");
  // Published: 671 B main model, 37 B activated per token, 14 B MTP module (which counts its
  // own copy of the embedding and head; here they are shared: 11.6 B + 2 x 0.93 B).
  EXPECT_EQ(counts["main"].total, 671026404352);
  EXPECT_NEAR(counts["main"].activated / 1e9, 37.0, 0.5);
  EXPECT_NEAR((counts["mtp"].total + 2 * 129280.0 * 7168) / 1e9, 14.0, 0.6);
}

TEST(DeepSeekDryRun, V2Lite_16bMatchesThePublishedSizes) {
  auto counts = dry_run("16b");
  EXPECT_NEAR(counts["main"].total / 1e9, 15.7, 0.05);    // published 15.7 B
  EXPECT_NEAR(counts["main"].activated / 1e9, 2.4, 0.1);  // published 2.4 B
  EXPECT_EQ(counts.count("mtp"), 0u);
}

}  // namespace
}  // namespace keel
