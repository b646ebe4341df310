// keel::linear, the SDK's linear layer whose fp32 CPU products run on oneDNN: its forward and
// both backward products against the exact (fp64) products under the standard bound of an
// fp32 dot product of length k, |fl(a.b) - a.b| <= gamma_k |a|.|b| with gamma_k = k u / (1 - k u)
// and u = 2^-24 (Higham, Accuracy and Stability of Numerical Algorithms, 3.1) — whatever order
// the kernel sums in; a split backward (input gradient, then weight gradient) gives bitwise the
// joint one; repeated calls are bitwise equal; and every case oneDNN must not take (another
// dtype, CPU autocast, a vector input, oneDNN switched off) is bitwise at::linear.
#include <gtest/gtest.h>

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <utility>

#include <keel/linear.hpp>

namespace keel {
namespace {

// The bound of every element of a @ b (a [m, k], b [k, n]) computed in fp32: gamma_k |a| |b|.
at::Tensor product_bound(const at::Tensor& a, const at::Tensor& b) {
  const double u = std::ldexp(1.0, -24), k = static_cast<double>(a.size(-1));
  return (k * u / (1 - k * u)) * at::matmul(a.to(at::kDouble).abs(), b.to(at::kDouble).abs());
}

// The largest |actual - exact| / bound over the elements of actual = fl(a @ b); <= 1 holds.
double deviation_from_exact(const at::Tensor& actual, const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor exact = at::matmul(a.to(at::kDouble), b.to(at::kDouble));
  return ((actual.to(at::kDouble) - exact).abs() / product_bound(a, b)).max().item<double>();
}

// Restores LibTorch's oneDNN switch, which a test flips.
struct OneDnnSwitch {
  bool before = at::globalContext().userEnabledMkldnn();
  ~OneDnnSwitch() { at::globalContext().setUserEnabledMkldnn(before); }
};

class Linear : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!at::hasMKLDNN()) GTEST_SKIP() << "this LibTorch has no oneDNN: keel::linear is at::linear";
    at::globalContext().setUserEnabledMkldnn(true);
    at::manual_seed(7);
  }
  OneDnnSwitch restore_;
};

TEST_F(Linear, Fp32CpuProductsRunOnOneDnn) {
  const at::Tensor x = at::randn({2, 5, 64}), w = at::randn({48, 64});
  EXPECT_TRUE(linear_uses_onednn(x, w));
  EXPECT_TRUE(linear_uses_onednn(x.view({10, 64}), w));
  const at::Tensor y = keel::linear(x, w.clone().requires_grad_(true));
  EXPECT_NE(y.grad_fn()->name().find("OneDnnLinearFunction"), std::string::npos) << y.grad_fn()->name();
}

TEST_F(Linear, ForwardIsWithinTheFp32BoundOfTheExactProduct) {
  const at::Tensor x = at::randn({3, 7, 200}), w = at::randn({96, 200});
  const at::Tensor y = keel::linear(x, w);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{3, 7, 96}));
  EXPECT_LE(deviation_from_exact(y.view({21, 96}), x.view({21, 200}), w.t()), 1.0);
  // The check can fail: the same result with one element moved by four times its bound.
  at::Tensor moved = y.view({21, 96}).clone();
  moved[4][9] += 4 * product_bound(x.view({21, 200}), w.t())[4][9].item<double>();
  EXPECT_GT(deviation_from_exact(moved, x.view({21, 200}), w.t()), 1.0);
}

TEST_F(Linear, AStridedWeightViewAndANonContiguousInputGiveTheirProduct) {
  const at::Tensor stored = at::randn({64, 96});  // the weight is its transpose, [96, 64]
  const at::Tensor w = stored.t(), x = at::randn({40, 2, 64}).transpose(0, 1);
  ASSERT_FALSE(w.is_contiguous());
  ASSERT_FALSE(x.is_contiguous());
  const at::Tensor y = keel::linear(x, w);
  EXPECT_LE(deviation_from_exact(y.reshape({80, 96}), x.reshape({80, 64}), w.t()), 1.0);
}

TEST_F(Linear, BothGradientsAreWithinTheFp32BoundOfTheExactProducts) {
  // Fewer outputs than inputs, and more: the weight's gradient is computed either way round.
  for (const auto& [out, in] : {std::pair<int64_t, int64_t>{56, 72}, {72, 40}}) {
    const at::Tensor x = at::randn({4, 33, in}).requires_grad_(true), w = at::randn({out, in}).requires_grad_(true);
    const at::Tensor g = at::randn({4, 33, out});
    keel::linear(x, w).backward(g);
    const at::Tensor g2 = g.view({132, out}), x2 = x.detach().view({132, in});
    // dL/dx = g w (sums of `out`), dL/dw = g^T x (sums over the 132 rows).
    EXPECT_LE(deviation_from_exact(x.grad().view({132, in}), g2, w.detach()), 1.0) << out << " x " << in;
    EXPECT_LE(deviation_from_exact(w.grad(), g2.t(), x2), 1.0) << out << " x " << in;
  }
}

TEST_F(Linear, ASplitBackwardGivesBitwiseTheJointOne) {
  const at::Tensor x = at::randn({2, 9, 40}).requires_grad_(true), w = at::randn({24, 40}).requires_grad_(true);
  const at::Tensor g = at::randn({2, 9, 24});
  keel::linear(x, w).backward(g);
  const at::Tensor joint_x = x.grad().clone(), joint_w = w.grad().clone();

  const at::Tensor y = keel::linear(x, w);
  const at::Tensor input_only = torch::autograd::grad({y}, {x}, {g}, /*retain_graph=*/true)[0];
  const at::Tensor weight_only = torch::autograd::grad({y}, {w}, {g})[0];
  EXPECT_TRUE(at::equal(input_only, joint_x));
  EXPECT_TRUE(at::equal(weight_only, joint_w));
}

TEST_F(Linear, OnlyTheWeightOrOnlyTheInputMayRequireAGradient) {
  const at::Tensor x = at::randn({6, 16}), w = at::randn({8, 16}).requires_grad_(true);
  keel::linear(x, w).sum().backward();
  EXPECT_LE(deviation_from_exact(w.grad(), at::ones({8, 6}), x), 1.0);

  const at::Tensor x2 = at::randn({6, 16}).requires_grad_(true), w2 = at::randn({8, 16});
  keel::linear(x2, w2).sum().backward();
  EXPECT_LE(deviation_from_exact(x2.grad(), at::ones({6, 8}), w2), 1.0);
}

TEST_F(Linear, RepeatedCallsAreBitwiseEqual) {
  const at::Tensor x = at::randn({5, 11, 128}), w = at::randn({80, 128});
  EXPECT_TRUE(at::equal(keel::linear(x, w), keel::linear(x, w)));
}

TEST_F(Linear, EmptyOperandsTakeAtLinearAndGetGradients) {
  // No rows, no outputs, no sums: at::linear's results, gradients included.
  for (const auto& [rows, out, in] : {std::tuple<int64_t, int64_t, int64_t>{0, 8, 16}, {4, 0, 16}, {4, 8, 0}}) {
    const at::Tensor x = at::randn({rows, in}).requires_grad_(true), w = at::randn({out, in}).requires_grad_(true);
    EXPECT_FALSE(linear_uses_onednn(x, w));
    const at::Tensor y = keel::linear(x, w);
    EXPECT_EQ(y.sizes(), (std::vector<int64_t>{rows, out}));
    y.sum().backward();
    EXPECT_EQ(x.grad().sizes(), x.sizes());
    EXPECT_TRUE(at::equal(w.grad(), at::zeros({out, in})));
  }
}

TEST_F(Linear, ASecondDerivativeIsTheExactOne) {
  // y = x w^T; with g = dL/dy, dL/dx = g w, and d/dw of sum(c * dL/dx) is g^T c: a product of
  // the rows, within its fp32 bound.
  const at::Tensor x = at::randn({6, 10, 24}).requires_grad_(true), w = at::randn({40, 24}).requires_grad_(true);
  const at::Tensor g = at::randn({6, 10, 40}), c = at::randn({6, 10, 24});
  const at::Tensor grad_x = torch::autograd::grad({keel::linear(x, w)}, {x}, {g}, /*retain_graph=*/true,
                                                  /*create_graph=*/true)[0];
  EXPECT_LE(deviation_from_exact(grad_x.view({60, 24}), g.view({60, 40}), w.detach()), 1.0);
  (grad_x * c).sum().backward();
  EXPECT_LE(deviation_from_exact(w.grad(), g.view({60, 40}).t(), c.view({60, 24})), 1.0);
}

TEST_F(Linear, NonFiniteInputsPropagateAsAtLinearsDo) {
  at::Tensor x = at::randn({4, 16});
  x[1][3] = std::numeric_limits<float>::infinity();
  x[2][0] = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor w = at::randn({8, 16});
  EXPECT_TRUE(at::equal(at::isfinite(keel::linear(x, w)), at::isfinite(at::linear(x, w))));
}

// What oneDNN must not take is exactly at::linear.
void expect_at_linear(const at::Tensor& x, const at::Tensor& w) {
  EXPECT_FALSE(linear_uses_onednn(x, w));
  EXPECT_TRUE(at::equal(keel::linear(x, w), at::linear(x, w)));
}

TEST_F(Linear, OtherDtypesAndVectorInputsTakeAtLinear) {
  expect_at_linear(at::randn({4, 32}).to(at::kBFloat16), at::randn({8, 32}).to(at::kBFloat16));
  expect_at_linear(at::randn({4, 32}, at::kDouble), at::randn({8, 32}, at::kDouble));
  expect_at_linear(at::randn({32}), at::randn({8, 32}));
}

TEST_F(Linear, CpuAutocastKeepsAtLinearsReducedPrecisionProducts) {
  const at::Tensor x = at::randn({4, 32}), w = at::randn({8, 32});
  at::autocast::set_autocast_enabled(at::kCPU, true);
  const bool uses = linear_uses_onednn(x, w);
  const at::Tensor y = keel::linear(x, w), expected = at::linear(x, w);
  at::autocast::set_autocast_enabled(at::kCPU, false);
  EXPECT_FALSE(uses);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(y, expected));
}

TEST_F(Linear, SwitchingOneDnnOffTakesAtLinear) {
  at::globalContext().setUserEnabledMkldnn(false);
  const at::Tensor x = at::randn({3, 4, 32}).requires_grad_(true), w = at::randn({8, 32}).requires_grad_(true);
  expect_at_linear(x, w);
  const at::Tensor y = keel::linear(x, w);
  EXPECT_EQ(y.grad_fn()->name().find("OneDnn"), std::string::npos) << y.grad_fn()->name();
}

}  // namespace
}  // namespace keel
