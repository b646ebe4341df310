// norm_clipper against LibTorch's clip_grad_norm_, and its REPLICA and no-gradient rules.
#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>

#include <keel/keel.hpp>

#include <cmath>
#include <limits>
#include <memory>

#include "common/error.hpp"
#include "common/text.hpp"
#include "config/config_tree.hpp"
#include "mesh/mesh.hpp"
#include "metrics/step_metrics.hpp"
#include "plugins/components.hpp"
#include "plugins/plugin_registry.hpp"
#include "test_support.hpp"

namespace keel {
namespace {

class NormClipperTest : public ::testing::Test {
 protected:
  std::unique_ptr<Clipper> make(const std::string& table) {
    tree_ = std::make_unique<ConfigTree>(ConfigTree::from_string("[clipper]\n" + table, "job.toml"));
    section_ = std::make_unique<ConfigSection>(tree_->section("clipper"));
    PluginRegistry registry({test::plugin_dir()});
    const keel_component& c = registry.component("norm_clipper", "norm_clipper", KEEL_COMPONENT_CLIPPER);
    return std::make_unique<Clipper>(c, "norm_clipper", *section_, HostServices{&mesh_, &metrics_});
  }

  // A parameter with a random gradient, declared in `table_`.
  at::Tensor& add(const std::string& fqn, std::vector<int64_t> shape, uint32_t flags = 0, int seed = 0) {
    at::Tensor t = at::randn(shape).requires_grad_(true);
    t.mutable_grad() = at::randn(shape, at::detail::getDefaultCPUGenerator()) * (1.0 + seed);
    return table_.add(fqn, std::move(t), std::nullopt, {.flags = flags}).tensor();
  }

  std::vector<const keel_param_info*> infos() {
    auto [ptr, n] = table_.view();
    return std::vector<const keel_param_info*>(ptr, ptr + n);
  }

  Mesh mesh_{MeshLayout::compute(1, 1, 1, 0)};
  StepMetrics metrics_;
  std::unique_ptr<ConfigTree> tree_;
  std::unique_ptr<ConfigSection> section_;
  ParamTable table_;
};

TEST_F(NormClipperTest, MatchesTorchClipGradNormWhenClippingBites) {
  at::manual_seed(1);
  std::vector<at::Tensor> reference;
  for (auto shape : std::vector<std::vector<int64_t>>{{7, 5}, {13}, {3, 4, 2}, {64, 32}}) {
    at::Tensor& p = add(cat("p", reference.size()), shape);
    at::Tensor copy = p.detach().clone().requires_grad_(true);
    copy.mutable_grad() = p.grad().clone();
    reference.push_back(copy);
  }
  auto clipper = make("max_norm = 0.5\n");
  clipper->bind_model_parts(infos());
  double expected = torch::nn::utils::clip_grad_norm_(reference, 0.5);
  at::Tensor norm = clipper->clip(infos());
  EXPECT_GT(expected, 0.5);  // the coefficient is < 1: clipping is active
  EXPECT_NEAR(norm.item<double>(), expected, 1e-6 * expected);
  for (size_t i = 0; i < reference.size(); ++i)
    EXPECT_TRUE(at::allclose(table_.records()[i]->grad(), reference[i].grad(), 1e-6, 1e-8)) << "param " << i;
}

TEST_F(NormClipperTest, LeavesGradientsUntouchedBelowMaxNorm) {
  at::Tensor& p = add("w", {10, 10});
  at::Tensor before = p.grad().clone();
  auto clipper = make("max_norm = 1e6\n");
  at::Tensor norm = clipper->clip(infos());
  EXPECT_NEAR(norm.item<double>(), before.norm().item<double>(), 1e-5);
  EXPECT_TRUE(at::equal(p.grad(), before));
}

TEST_F(NormClipperTest, ReplicaExcludedFromNormAndScaledByTheSameCoefficient) {
  at::Tensor& owner = add("tok_embeddings.weight", {16, 8});
  at::Tensor& replica = add("tok_embeddings.weight", {16, 8}, KEEL_PARAM_REPLICA);
  replica.grad().copy_(owner.grad());
  at::Tensor& other = add("output.weight", {16, 8});
  at::Tensor ref_owner = owner.detach().clone().requires_grad_(true),
             ref_other = other.detach().clone().requires_grad_(true);
  ref_owner.mutable_grad() = owner.grad().clone();
  ref_other.mutable_grad() = other.grad().clone();
  double expected = torch::nn::utils::clip_grad_norm_(std::vector<at::Tensor>{ref_owner, ref_other}, 0.1);

  auto clipper = make("max_norm = 0.1\n");
  clipper->bind_model_parts(infos());
  at::Tensor norm = clipper->clip(infos());
  EXPECT_NEAR(norm.item<double>(), expected, 1e-6 * expected);  // counted once
  EXPECT_TRUE(at::equal(owner.grad(), replica.grad()));         // same coefficient, same bits
  EXPECT_TRUE(at::allclose(owner.grad(), ref_owner.grad(), 1e-6, 1e-8));
}

TEST_F(NormClipperTest, NoGradientsGiveZeroNormOnTheParametersDevice) {
  table_.add("frozen", at::randn({4, 4}), std::nullopt, {});
  auto clipper = make("max_norm = 1.0\n");
  at::Tensor norm = clipper->clip(infos());
  EXPECT_EQ(norm.item<double>(), 0.0);
  EXPECT_EQ(norm.device(), table_.records()[0]->tensor().device());
  EXPECT_EQ(norm.dim(), 0);
}

TEST_F(NormClipperTest, InfNormMatchesTorch) {
  at::manual_seed(3);
  at::Tensor& a = add("a", {5, 5});
  at::Tensor& b = add("b", {9});
  std::vector<at::Tensor> ref;
  for (at::Tensor* t : {&a, &b}) {
    ref.push_back(t->detach().clone().requires_grad_(true));
    ref.back().mutable_grad() = t->grad().clone();
  }
  double expected = torch::nn::utils::clip_grad_norm_(ref, 0.2, std::numeric_limits<double>::infinity());
  auto clipper = make("max_norm = 0.2\nnorm_type = \"inf\"\n");
  EXPECT_NEAR(clipper->clip(infos()).item<double>(), expected, 1e-6 * expected);
  EXPECT_TRUE(at::allclose(a.grad(), ref[0].grad(), 1e-6, 1e-8));
}

TEST_F(NormClipperTest, InfNormIsTheLargestMagnitudeEitherSignAndAnEmptyGradientCountsZero) {
  at::Tensor& a = add("a", {4});
  add("empty", {0, 3});
  at::Tensor& b = add("b", {2, 3});
  a.mutable_grad().copy_(at::tensor({0.5f, -0.25f, 0.0f, 0.125f}));
  b.mutable_grad().copy_(at::tensor({0.1f, -0.75f, 0.3f, 0.2f, 0.6f, -0.7f}).view({2, 3}));
  auto clipper = make("max_norm = 10.0\nnorm_type = \"inf\"\n");
  EXPECT_EQ(clipper->clip(infos()).item<float>(), 0.75f);
  b.mutable_grad()[0][1] = 0.5f;  // now the largest is positive, in the first gradient
  a.mutable_grad()[0] = 0.8f;
  EXPECT_EQ(clipper->clip(infos()).item<float>(), 0.8f);
}

TEST_F(NormClipperTest, InfNormCarriesANanAsInfinitySoAMaxReductionCannotDropIt) {
  // Gloo's MAX all-reduce keeps a finite value over a NaN; +inf survives every maximum.
  at::manual_seed(4);
  add("a", {5, 5});
  at::Tensor& b = add("b", {9});
  b.mutable_grad()[3] = std::numeric_limits<float>::quiet_NaN();
  auto clipper = make("max_norm = 0.2\nnorm_type = \"inf\"\n");
  const double norm = clipper->clip(infos()).item<double>();
  EXPECT_TRUE(std::isinf(norm) && norm > 0) << norm;
}

TEST_F(NormClipperTest, InvalidMaxNormNamesKeyAndLine) {
  try {
    make("max_norm = 0.0\n");
    FAIL() << "accepted max_norm = 0";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("job.toml:2: clipper.max_norm: must be a positive number"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace keel
