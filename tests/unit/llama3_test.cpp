// The llama3 plugin with tied embeddings (model.tie_embeddings = true), through the host: a
// single stage uses one table as embedding and head (no output.weight); two stages put a
// REPLICA of the table on the last stage; the tied table's init; the key's validation.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <map>

#include "common/error.hpp"
#include "config/config_tree.hpp"
#include "llama3_args.hpp"
#include "llama3_part.hpp"
#include "mesh/mesh.hpp"
#include "metrics/step_metrics.hpp"
#include "model_fixture.hpp"
#include "plugins/components.hpp"
#include "plugins/plugin_registry.hpp"
#include "test_support.hpp"

namespace keel {
namespace {

class TiedLlama : public test::ModelFixture {
 protected:
  TiedLlama() : ModelFixture("llama3") {}
  static std::map<std::string, const ParamRef*> by_fqn(ModelPart& part) {
    std::map<std::string, const ParamRef*> out;
    for (const ParamRef& p : part.parameters()) out[p.fqn()] = &p;
    return out;
  }
};

const char* const kTied = "flavor = \"tiny\"\ntie_embeddings = true\n";

TEST_F(TiedLlama, ASingleStageHasOneTableAndNoOutputWeight) {
  auto model = make(kTied);
  auto whole = by_fqn(model->build_part(spec(0, 1, 0, 2)));
  EXPECT_FALSE(whole.count("output.weight"));
  ASSERT_TRUE(whole.count("tok_embeddings.weight"));
  EXPECT_FALSE(whole["tok_embeddings.weight"]->replica());
  EXPECT_EQ(whole["tok_embeddings.weight"]->active_fraction(), 1.0) << "the head reads every row";
  EXPECT_TRUE(whole.count("norm.weight"));
  EXPECT_EQ(whole.size(), 20u);  // untied: 21, with output.weight

  auto untied = make("flavor = \"tiny\"\n");
  auto u = by_fqn(untied->build_part(spec(0, 1, 0, 2)));
  EXPECT_TRUE(u.count("output.weight"));
  EXPECT_DOUBLE_EQ(u["tok_embeddings.weight"]->active_fraction(), 1.0 / 256);
}

TEST_F(TiedLlama, TheLastOfTwoStagesHoldsAReplicaOfTheTable) {
  auto model = make(kTied);
  auto first = by_fqn(model->build_part(spec(0, 2, 0, 1)));
  auto last = by_fqn(model->build_part(spec(1, 2, 1, 1)));
  ASSERT_TRUE(first.count("tok_embeddings.weight"));
  ASSERT_TRUE(last.count("tok_embeddings.weight"));
  EXPECT_FALSE(first["tok_embeddings.weight"]->replica());
  EXPECT_TRUE(last["tok_embeddings.weight"]->replica());
  EXPECT_EQ(last["tok_embeddings.weight"]->tensor().sizes(), (at::IntArrayRef{256, 64}));
  EXPECT_EQ(last["tok_embeddings.weight"]->active_fraction(), 1.0);
  EXPECT_FALSE(first.count("output.weight") || first.count("norm.weight"));
  EXPECT_FALSE(last.count("output.weight"));
  EXPECT_TRUE(last.count("norm.weight"));
  for (const auto& [fqn, p] : first)
    if (fqn != "tok_embeddings.weight") {
      EXPECT_FALSE(last.count(fqn)) << fqn;
    }

  // Untied, the last stage holds no copy of the table.
  auto untied = make("flavor = \"tiny\"\n");
  untied->build_part(spec(0, 2, 0, 1));
  auto u = by_fqn(untied->build_part(spec(1, 2, 1, 1)));
  EXPECT_FALSE(u.count("tok_embeddings.weight"));
  EXPECT_TRUE(u.count("output.weight"));
}

// The replica draws the owner's bits, which are the single stage's; the tied table is a 0.02
// truncated normal, as Hugging Face's Llama draws it (the untied table stays N(0, 1)).
TEST_F(TiedLlama, TheTableIsInitialisedAlikeOnEveryStage) {
  auto split = make(kTied);
  ModelPart& s0 = split->build_part(spec(0, 2, 0, 1));
  ModelPart& s1 = split->build_part(spec(1, 2, 1, 1));
  s0.init_weights(3);
  s1.init_weights(3);
  auto whole_model = make(kTied);
  ModelPart& whole = whole_model->build_part(spec(0, 1, 0, 2));
  whole.init_weights(3);
  std::map<std::string, at::Tensor> reference;
  for (const ParamRef& p : whole.parameters()) reference[p.fqn()] = p.tensor();
  for (ModelPart* part : {&s0, &s1})
    for (const ParamRef& p : part->parameters()) {
      EXPECT_TRUE(at::equal(p.tensor(), reference.at(p.fqn()))) << p.fqn();
    }

  const double std = 0.02;
  const at::Tensor& table = reference.at("tok_embeddings.weight");
  EXPECT_LE(table.abs().max().item<double>(), 3 * std);
  EXPECT_NEAR(table.std().item<double>(), std, 0.05 * std);

  auto untied_model = make("flavor = \"tiny\"\n");
  ModelPart& untied = untied_model->build_part(spec(0, 1, 0, 2));
  untied.init_weights(3);
  for (const ParamRef& p : untied.parameters())
    if (p.fqn() == "tok_embeddings.weight") {
      EXPECT_NEAR(p.tensor().std().item<double>(), 1.0, 0.05);
    }
}

// The tiny flavor, tied, as one seeded part holding the whole model.
std::unique_ptr<llama3::Part> tiny_tied_part() {
  llama3::Args args;
  args.dim = 64, args.n_layers = 2, args.n_heads = 4, args.n_kv_heads = 2, args.ffn_hidden = 128;
  args.vocab_size = 256, args.rope_theta = 10000.0, args.tie_embeddings = true;
  keel_part_spec s{};
  s.struct_size = sizeof(s);
  s.num_stages = 1;
  s.num_layers = 2;
  s.device_type = KEEL_DEVICE_CPU;
  auto part = std::make_unique<llama3::Part>(nullptr, args, s);
  part->init_weights(3);
  return part;
}

// The head is the table: changing the row of a token absent from the input moves that
// token's logit, exactly as h . row.
TEST(TiedLlamaPart, TheHeadReadsTheEmbeddingTable) {
  std::unique_ptr<llama3::Part> whole = tiny_tied_part();
  llama3::Part& part = *whole;
  c10::NoGradGuard no_grad;
  at::Tensor tokens = at::arange(8, at::kLong).view({1, 8});  // tokens 0..7; row 200 is unused
  at::Tensor before = part.logits(tokens);
  at::Tensor& table = *part.tok_embeddings();
  table[200].add_(1.0);
  at::Tensor after = part.logits(tokens);
  at::Tensor moved = (after - before).abs().sum(-1).squeeze(0);  // per position, over the vocab
  at::Tensor row = (after - before).select(-1, 200).abs().squeeze(0);
  EXPECT_TRUE(at::allclose(moved, row)) << "only token 200's logit moves";
  EXPECT_GT(row.min().item<double>(), 0.0);
}

// At init the tied model's logits are near uniform: the first loss is ln(vocab), not the
// ~sqrt(dim) self-logit's (8.2 on tiny) that the head's dim^-1/2 rule would give.
TEST(TiedLlamaPart, TheFirstLossIsLnVocab) {
  std::unique_ptr<llama3::Part> whole = tiny_tied_part();
  llama3::Part& part = *whole;
  c10::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(11);
  at::Tensor tokens = at::randint(256, {4, 33}, gen, at::kLong);
  at::Tensor logits = part.logits(tokens.slice(1, 0, 32));
  const double loss =
      at::cross_entropy_loss(logits.reshape({-1, 256}), tokens.slice(1, 1).reshape({-1})).item<double>();
  EXPECT_NEAR(loss, std::log(256.0), 0.1);
}

TEST_F(TiedLlama, ANonBooleanTieEmbeddingsIsAConfigErrorNamingTheKey) {
  try {
    make("flavor = \"tiny\"\ntie_embeddings = 1\n");
    FAIL() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("model.tie_embeddings: expected a boolean (true or false), found an integer"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace keel
