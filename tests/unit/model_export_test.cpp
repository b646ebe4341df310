// Model export through the ABI (1.1): an ABI 1.0 plugin still loads and is refused export by
// name; the llama3 and deepseek_v3_mtp plugins export Hugging Face names, shapes and config.json.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "common/error.hpp"
#include "config/config_tree.hpp"
#include "mesh/mesh.hpp"
#include "metrics/step_metrics.hpp"
#include "plugins/components.hpp"
#include "plugins/plugin_registry.hpp"
#include "test_support.hpp"

namespace keel {
namespace {

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

using State = std::vector<std::pair<std::string, at::Tensor>>;

class PluginExport : public ::testing::Test {
 protected:
  Model& make(const std::string& plugin, const std::string& table) {
    tree_ = std::make_unique<ConfigTree>(ConfigTree::from_string("[model]\n" + table, "job.toml"));
    section_ = std::make_unique<ConfigSection>(tree_->section("model"));
    PluginRegistry registry({test::test_plugin_dir(), test::plugin_dir()});
    const keel_component& c = registry.component(plugin, plugin, KEEL_COMPONENT_MODEL);
    model_ = std::make_unique<Model>(c, plugin, *section_, HostServices{&mesh_, &metrics_});
    return *model_;
  }
  // A single-stage CPU part with seeded weights: its parameters and persistent buffers.
  State seeded_state(Model& model) {
    keel_part_spec spec{};
    spec.struct_size = sizeof(spec);
    spec.num_stages = 1;
    spec.num_layers = model.info().num_layers;
    ModelPart& part = model.build_part(spec);
    part.init_weights(5);
    State state;
    for (const ParamRef& p : part.parameters()) state.emplace_back(p.fqn(), p.tensor().detach());
    for (const ParamRef& b : part.buffers())
      if (b.persistent()) state.emplace_back(b.fqn(), b.tensor().detach());
    return state;
  }
  static std::string refusal(Model& model, const std::string& format, const State& state) {
    try {
      model.export_state(format, state);
    } catch (const InputError& e) {
      return e.what();
    }
    return "(exported)";
  }
  static const at::Tensor& named(const ModelExport& e, const std::string& name) {
    for (const auto& [n, t] : e.tensors)
      if (n == name) return t;
    throw std::runtime_error("no exported tensor " + name);
  }
  static const at::Tensor& named(const State& s, const std::string& name) {
    for (const auto& [n, t] : s)
      if (n == name) return t;
    throw std::runtime_error("no state tensor " + name);
  }

  Mesh mesh_{MeshLayout::compute(1, 1, 1, 0)};
  StepMetrics metrics_;
  std::unique_ptr<ConfigTree> tree_;
  std::unique_ptr<ConfigSection> section_;
  std::unique_ptr<Model> model_;
};

TEST_F(PluginExport, AbiOneZeroPluginLoadsAndIsRefusedExportByName) {
  Model& model = make("abi_1_0", "");
  EXPECT_EQ(model.vtable().export_state, nullptr);
  std::string m = refusal(model, "hf", {});
  EXPECT_HAS(m, "model abi_1_0 (abi_1_0) cannot export to 'hf'");
  EXPECT_HAS(m, "no export_state");
}

TEST_F(PluginExport, UnknownFormatIsRefusedNamingIt) {
  Model& model = make("llama3", "flavor = \"tiny\"");
  std::string m = refusal(model, "gguf", seeded_state(model));
  EXPECT_HAS(m, "llama3 cannot export format 'gguf'; it exports: hf");
}

TEST_F(PluginExport, StateThatDoesNotMatchTheConfigIsRefusedNamingTheTensor) {
  Model& model = make("llama3", "flavor = \"tiny\"");
  State state = seeded_state(model);
  std::erase_if(state, [](const auto& item) { return item.first == "norm.weight"; });
  EXPECT_HAS(refusal(model, "hf", state), "the state lacks 'norm.weight'");
}

TEST_F(PluginExport, LlamaQueryAndKeyRowsMoveFromInterleavedPairsToHalves) {
  Model& model = make("llama3", "flavor = \"tiny\"");
  State state = seeded_state(model);
  ModelExport e = model.export_state("hf", state);
  EXPECT_EQ(e.tensors.size(), state.size());
  // tiny: 4 query heads and 2 key heads of head_dim 16; row 2i + j of a head -> row j * 8 + i.
  const int64_t hd = 16;
  for (const auto& [keel_name, hf_name, heads] :
       {std::tuple{"layers.1.attention.wq.weight", "model.layers.1.self_attn.q_proj.weight", 4},
        std::tuple{"layers.1.attention.wk.weight", "model.layers.1.self_attn.k_proj.weight", 2}}) {
    const at::Tensor &ours = named(state, keel_name), &theirs = named(e, hf_name);
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < hd / 2; ++i)
        for (int64_t j = 0; j < 2; ++j)
          ASSERT_TRUE(at::equal(theirs[h * hd + j * hd / 2 + i], ours[h * hd + 2 * i + j])) << hf_name;
  }
  EXPECT_TRUE(
      at::equal(named(e, "model.layers.1.self_attn.v_proj.weight"), named(state, "layers.1.attention.wv.weight")));
  EXPECT_TRUE(at::equal(named(e, "lm_head.weight"), named(state, "output.weight")));
  auto config = nlohmann::json::parse(e.files.at("config.json"));
  EXPECT_EQ(config["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["rope_parameters"]["rope_theta"], 10000.0);
}

// Tied: the head is model.embed_tokens (transformers ties it from config.json), so no
// lm_head.weight is written; untied exports say tie_word_embeddings = false.
TEST_F(PluginExport, TiedLlamaExportsNoLmHeadAndSaysSo) {
  Model& model = make("llama3", "flavor = \"tiny\"\ntie_embeddings = true");
  State state = seeded_state(model);
  ModelExport e = model.export_state("hf", state);
  EXPECT_EQ(e.tensors.size(), state.size());
  for (const auto& [name, tensor] : e.tensors) EXPECT_NE(name, "lm_head.weight");
  EXPECT_TRUE(at::equal(named(e, "model.embed_tokens.weight"), named(state, "tok_embeddings.weight")));
  EXPECT_EQ(nlohmann::json::parse(e.files.at("config.json"))["tie_word_embeddings"], true);

  Model& untied = make("llama3", "flavor = \"tiny\"");
  EXPECT_EQ(nlohmann::json::parse(
                untied.export_state("hf", seeded_state(untied)).files.at("config.json"))["tie_word_embeddings"],
            false);
}

// The MTP depth is written as the DeepSeek-V3 release stores it: the extra layer n_layers (3 in
// the tiny flavor) with its own norms and projection and copies of the embedding and head.
TEST_F(PluginExport, DeepSeekFusesExpertsAndWritesMtpAsTheRelease) {
  Model& model = make("deepseek_v3_mtp", "flavor = \"tiny\"");
  State state = seeded_state(model);
  ModelExport e = model.export_state("hf", state);
  std::set<std::string> names;
  for (const auto& [name, tensor] : e.tensors) {
    names.insert(name);
    EXPECT_EQ(name.find("mtp"), std::string::npos) << name;
  }
  const at::Tensor& fused = named(e, "model.layers.2.mlp.experts.gate_up_proj");
  EXPECT_TRUE(
      at::equal(fused, at::cat({named(state, "layers.2.moe.experts.w1"), named(state, "layers.2.moe.experts.w3")}, 1)));
  EXPECT_EQ(fused.sizes().vec(), (std::vector<int64_t>{8, 64, 64}));
  EXPECT_EQ(names.count("model.layers.2.mlp.gate.e_score_correction_bias"), 1u);
  EXPECT_EQ(names.count("model.layers.0.mlp.gate_proj.weight"), 1u);
  for (const auto& [theirs, ours] : std::vector<std::pair<std::string, std::string>>{
           {"model.layers.3.enorm.weight", "mtp.0.enorm.weight"},
           {"model.layers.3.hnorm.weight", "mtp.0.hnorm.weight"},
           {"model.layers.3.eh_proj.weight", "mtp.0.eh_proj.weight"},
           {"model.layers.3.shared_head.norm.weight", "mtp.0.norm.weight"},
           {"model.layers.3.self_attn.kv_b_proj.weight", "mtp.0.block.attention.wkv_b.weight"},
           {"model.layers.3.mlp.gate.e_score_correction_bias", "mtp.0.block.moe.expert_bias"},
           {"model.layers.3.embed_tokens.weight", "tok_embeddings.weight"},
           {"model.layers.3.shared_head.head.weight", "output.weight"}})
    EXPECT_TRUE(at::equal(named(e, theirs), named(state, ours))) << theirs;
  EXPECT_TRUE(
      at::equal(named(e, "model.layers.3.mlp.experts.gate_up_proj"),
                at::cat({named(state, "mtp.0.block.moe.experts.w1"), named(state, "mtp.0.block.moe.experts.w3")}, 1)));
  EXPECT_EQ(names.count("model.layers.4.enorm.weight"), 0u);
  auto config = nlohmann::json::parse(e.files.at("config.json"));
  EXPECT_EQ(config["model_type"], "deepseek_v3");
  EXPECT_EQ(config["rope_parameters"]["rope_type"], "yarn");
  EXPECT_EQ(config["num_hidden_layers"], 3);
  EXPECT_EQ(config["num_nextn_predict_layers"], 1);
}

TEST_F(PluginExport, DeepSeekWithSoftmaxScoresIsRefused) {
  Model& model = make("deepseek_v3_mtp", "flavor = \"tiny\"\nscore_func = \"softmax\"");
  EXPECT_HAS(refusal(model, "hf", seeded_state(model)),
             "score_func \"softmax\" has no DeepseekV3ForCausalLM equivalent");
}

}  // namespace
}  // namespace keel
