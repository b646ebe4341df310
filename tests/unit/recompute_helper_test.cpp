// keel::recompute, the SDK's checkpointing helper: the wrapped function runs once in forward
// (keeping nothing inside it) and again in backward with keel::recomputing() true; the
// gradients equal those of the plain function bitwise; the random state of the rerun is the
// first run's, and the rerun leaves the generator where the forward left it; parameters used
// inside get gradients even when no input requires one.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <keel/recompute.hpp>

namespace keel {
namespace {

TEST(RecomputeHelper, RerunsInBackwardAndGivesTheSameGradientsBitwise) {
  at::manual_seed(3);
  at::Tensor w = at::randn({16, 16}).requires_grad_(true);
  at::Tensor x = at::randn({4, 16}).requires_grad_(true);
  int calls = 0, reruns = 0;
  auto fn = [&](const std::vector<at::Tensor>& in) {
    ++calls;
    reruns += recomputing() ? 1 : 0;
    return at::silu(at::matmul(in[0], w)) * in[0];
  };
  at::Tensor plain = fn({x});
  plain.sum().backward();
  const at::Tensor w_grad = w.grad().clone(), x_grad = x.grad().clone();
  w.mutable_grad().zero_();
  x.mutable_grad().zero_();
  calls = reruns = 0;

  at::Tensor kept = recompute(fn, {x});
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(recomputing());
  EXPECT_TRUE(at::equal(kept, plain));
  kept.sum().backward();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(reruns, 1);
  EXPECT_FALSE(recomputing());
  EXPECT_TRUE(at::equal(w.grad(), w_grad));
  EXPECT_TRUE(at::equal(x.grad(), x_grad));
}

TEST(RecomputeHelper, TheRerunDrawsTheSameRandomNumbersAndLeavesTheGeneratorAsForwardDid) {
  at::manual_seed(11);
  at::Tensor x = at::randn({8}).requires_grad_(true);
  std::vector<at::Tensor> draws;
  auto fn = [&](const std::vector<at::Tensor>& in) {
    at::Tensor noise = at::rand({8});
    draws.push_back(noise);
    return in[0] * noise;
  };
  at::Tensor y = recompute(fn, {x});
  const at::Tensor after_forward = at::detail::getDefaultCPUGenerator().get_state();
  y.sum().backward();
  ASSERT_EQ(draws.size(), 2u);
  EXPECT_TRUE(at::equal(draws[0], draws[1]));
  EXPECT_TRUE(at::equal(x.grad(), draws[0]));
  EXPECT_TRUE(at::equal(at::detail::getDefaultCPUGenerator().get_state(), after_forward));
}

TEST(RecomputeHelper, ParametersInsideGetGradientsWhenNoInputRequiresOne) {
  at::Tensor w = at::full({3}, 2.0).requires_grad_(true);
  at::Tensor x = at::ones({3});
  at::Tensor y = recompute([&](const std::vector<at::Tensor>& in) { return in[0] * w; }, {x});
  ASSERT_TRUE(y.requires_grad());
  y.sum().backward();
  EXPECT_TRUE(at::equal(w.grad(), at::ones({3})));
  EXPECT_FALSE(x.grad().defined());
}

TEST(RecomputeHelper, WithoutGradientsTheFunctionRunsOnce) {
  at::Tensor x = at::ones({2}).requires_grad_(true);
  int calls = 0;
  at::NoGradGuard no_grad;
  at::Tensor y = recompute(
      [&](const std::vector<at::Tensor>& in) {
        ++calls;
        return in[0] * 2;
      },
      {x});
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(y.requires_grad());
}

}  // namespace
}  // namespace keel
