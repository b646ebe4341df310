// data.attention = "block_causal": a packed sample of several documents against the same
// documents run one by one, for both model plugins, and the document runs the SDK cuts.
#include <gtest/gtest.h>

#include <keel/attention.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "model_fixture.hpp"

namespace keel {
namespace {

constexpr int64_t kEos = 0;

struct Outcome {
  double loss = 0;
  std::map<std::string, at::Tensor> grads;
};

// Documents of these lengths (each ending in EOS), tokens drawn from [1, vocab).
std::vector<at::Tensor> documents(const std::vector<int64_t>& lengths, int64_t vocab) {
  at::manual_seed(21);
  std::vector<at::Tensor> out;
  for (int64_t length : lengths) {
    at::Tensor doc = at::randint(1, vocab, {1, length}, at::kLong);
    doc.select(1, length - 1).fill_(kEos);
    out.push_back(doc);
  }
  return out;
}

// Next-token labels inside one packed or single sequence; the label of an EOS (whose next
// token starts another document) and of the last position are ignored, as BatchStream does.
at::Tensor labels_of(const at::Tensor& tokens) {
  at::Tensor labels = at::full_like(tokens, KEEL_IGNORE_INDEX);
  const int64_t seq = tokens.size(1);
  labels.narrow(1, 0, seq - 1).copy_(tokens.narrow(1, 1, seq - 1));
  return labels.masked_fill(tokens.eq(kEos), KEEL_IGNORE_INDEX);
}

class DocumentMasking : public test::ModelFixture, public ::testing::WithParamInterface<std::string> {
 protected:
  DocumentMasking() : ModelFixture(GetParam() == "llama3" ? "llama3" : "deepseek_v3_mtp") {}

  std::string table() const {
    // The fused kernel on both sides, so that the runs differ from the documents only by the mask.
    return GetParam() == "llama3" ? "flavor = \"tiny\"\n" : "flavor = \"tiny\"\nattention_kernel = \"fused\"\n";
  }

  // Forward and backward of every sequence, gradients summed over them.
  Outcome run(const std::vector<at::Tensor>& sequences, uint32_t attention) {
    auto model = make(table());
    if (attention != 0) {
      model->set_attention(attention, "data.attention");
      model->set_document_end(kEos);
    }
    ModelPart& part = model->build_part(spec(0, 1, 0, model->info().num_layers));
    part.init_weights(9);
    Outcome out;
    for (const at::Tensor& tokens : sequences) {
      at::Tensor loss = part.forward(tokens, labels_of(tokens), nullptr, 0, 1);
      loss.backward();
      out.loss += loss.item<double>();
    }
    for (const ParamRef& p : part.parameters())
      if (p.tensor().grad().defined()) out.grads[p.fqn()] = p.tensor().grad().clone();
    return out;
  }
};

// The packed run and the documents apart sum the same fp32 products in other orders (other
// kernel blocks, masked rows). Norm-wise: each gradient's difference within 1e-6 of the
// gradient's norm. Rounding errors of sums spread over a tensor's elements, so a norm-wise
// bound holds them at a few fp32 ulps while an element-wise one at the tensor's largest
// magnitude is met or missed by single roundings; a wrong mask moves whole rows.
double normwise(const at::Tensor& got, const at::Tensor& want) {
  return (got - want).norm().item<double>() / std::max(want.norm().item<double>(), 1e-30);
}

void expect_close(const Outcome& got, const Outcome& want, double bound) {
  EXPECT_NEAR(got.loss, want.loss, bound * std::abs(want.loss));
  ASSERT_EQ(got.grads.size(), want.grads.size());
  double worst = 0;
  for (const auto& [fqn, ref] : want.grads) {
    const double error = normwise(got.grads.at(fqn), ref);
    worst = std::max(worst, error);
    EXPECT_LE(error, bound) << fqn;
  }
  std::printf("DOCUMENTS | worst norm-wise gradient difference %.3g (bound %.3g)\n", worst, bound);
}

TEST_P(DocumentMasking, APackedSampleEqualsItsDocumentsRunOneByOne) {
  // 512 positions: one document long enough to run alone, short ones packed into runs.
  const std::vector<at::Tensor> docs = documents({300, 40, 17, 90, 65}, 256);
  const Outcome apart = run(docs, 0);
  const Outcome packed = run({at::cat(docs, 1)}, KEEL_ATTENTION_BLOCK_CAUSAL | KEEL_ATTENTION_RESET_POSITIONS);
  expect_close(packed, apart, 1e-6);
}

TEST_P(DocumentMasking, WithoutItThePackedSampleIsNotTheDocumentsApart) {
  // The comparison above can fail: causal attention over the packed sample sees across the
  // documents' ends.
  const std::vector<at::Tensor> docs = documents({300, 40, 17, 90, 65}, 256);
  const Outcome apart = run(docs, 0);
  const Outcome causal = run({at::cat(docs, 1)}, 0);
  double worst = 0;
  for (const auto& [fqn, ref] : apart.grads) worst = std::max(worst, normwise(causal.grads.at(fqn), ref));
  EXPECT_GT(worst, 1e-3);
}

TEST_P(DocumentMasking, PositionsRunAcrossTheSampleUnlessReset) {
  // Without reset_positions a later document's RoPE positions continue from the sample's
  // start. The scores depend on position differences only, so the result stays near the
  // documents' apart (rotations by other angles round otherwise), but it is not the run
  // whose positions restart: the positions do reach the rotary embedding.
  const std::vector<at::Tensor> docs = documents({300, 40, 17, 90, 65}, 256);
  const at::Tensor packed = at::cat(docs, 1);
  const Outcome running = run({packed}, KEEL_ATTENTION_BLOCK_CAUSAL);
  const Outcome reset = run({packed}, KEEL_ATTENTION_BLOCK_CAUSAL | KEEL_ATTENTION_RESET_POSITIONS);
  bool differs = false;
  for (const auto& [fqn, g] : reset.grads) differs = differs || !at::equal(g, running.grads.at(fqn));
  EXPECT_TRUE(differs);
  expect_close(running, reset, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Models, DocumentMasking, ::testing::Values("deepseek_v3", "llama3"));

TEST(DocumentRuns, LongDocumentsRunAloneAndShortOnesPackWithinASample) {
  // Sample 0: documents of 300, 40, 17, 230, 30 positions; sample 1: one of 617.
  std::vector<int64_t> ids;
  const std::pair<int64_t, int64_t> spans[] = {{0, 300}, {1, 40}, {2, 17}, {3, 230}, {4, 30}};
  for (const auto& [doc, length] : spans) ids.insert(ids.end(), static_cast<size_t>(length), doc);
  ids.insert(ids.end(), 617, 0);
  const at::Tensor documents = at::tensor(ids, at::kLong).view({2, 617});
  const DocumentRuns runs = document_runs(documents);
  // 300 alone; 40 + 17 packed (230 would pass 256); 230 + 30 would pass it too; the next sample.
  EXPECT_EQ(runs.lengths, (std::vector<int64_t>{300, 57, 230, 30, 617}));
  ASSERT_EQ(runs.masks.size(), 5u);
  EXPECT_FALSE(runs.masks[0].defined());
  ASSERT_TRUE(runs.masks[1].defined());
  EXPECT_FALSE(runs.masks[2].defined());
  EXPECT_FALSE(runs.masks[3].defined());
  EXPECT_FALSE(runs.masks[4].defined());
  // In the packed run a position sees the earlier positions of its own document only.
  const at::Tensor& mask = runs.masks[1];
  EXPECT_TRUE(mask[39][0].item<bool>());
  EXPECT_FALSE(mask[40][39].item<bool>());
  EXPECT_TRUE(mask[56][40].item<bool>());
  EXPECT_FALSE(mask[41][42].item<bool>());
}

}  // namespace
}  // namespace keel
