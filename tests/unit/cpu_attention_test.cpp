// keel::cpu_causal_attention, the SDK's blocked CPU attention: its output and the gradients of
// q, k and v against exact (fp64) materialised attention, at lengths that end inside a block
// and span several, with value heads of another size and with key/value heads shared by query
// heads; on oneDNN and on the BLAS products alike; bitwise repeatable; and the operands it
// leaves to LibTorch's kernels.
//
// Error model: each result is a chain of fp32 sums, a score over d_qk terms, a softmax and a
// weighted sum over at most `seq` keys (backward: the same chains transposed). Each sum of n
// terms errs by at most gamma_n = n u / (1 - n u) of the sum of its terms' magnitudes (u =
// 2^-24; Higham, Accuracy and Stability of Numerical Algorithms, 3.1) whatever its order, and
// the chain's stages add up, so every element of a result X is within 4 gamma_{d_qk + seq}
// max|X_exact| of the exact value: two roundings per stage (product and sum), two stages.
#include <gtest/gtest.h>

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <limits>
#include <vector>

#include <keel/attention.hpp>
#include <keel/cpu_attention.hpp>

namespace keel {
namespace {

struct Shape {
  int64_t batch, heads, kv_heads, seq, qk_dim, v_dim;
};

struct Operands {
  at::Tensor q, k, v, grad_out;
};

Operands operands(const Shape& s) {
  at::manual_seed(11);
  return {at::randn({s.batch, s.heads, s.seq, s.qk_dim}).requires_grad_(),
          at::randn({s.batch, s.kv_heads, s.seq, s.qk_dim}).requires_grad_(),
          at::randn({s.batch, s.kv_heads, s.seq, s.v_dim}).requires_grad_(),
          at::randn({s.batch, s.heads, s.seq, s.v_dim})};
}

// Materialised attention in fp64: the output and the gradients of q, k, v.
std::vector<at::Tensor> exact(const Operands& o, double scale) {
  const int64_t group = o.q.size(1) / o.k.size(1), seq = o.q.size(2);
  const at::Tensor q = o.q.detach().to(at::kDouble).requires_grad_(), k = o.k.detach().to(at::kDouble).requires_grad_(),
                   v = o.v.detach().to(at::kDouble).requires_grad_();
  const at::Tensor keys = k.repeat_interleave(group, 1), values = v.repeat_interleave(group, 1);
  const at::Tensor future = at::ones({seq, seq}, at::TensorOptions().dtype(at::kBool)).triu(1);
  const at::Tensor probs = at::softmax(
      (at::matmul(q, keys.transpose(-1, -2)) * scale).masked_fill(future, -std::numeric_limits<double>::infinity()),
      -1);
  const at::Tensor out = at::matmul(probs, values);
  std::vector<at::Tensor> grads = torch::autograd::grad({out}, {q, k, v}, {o.grad_out.to(at::kDouble)});
  return {out.detach(), grads[0], grads[1], grads[2]};
}

std::vector<at::Tensor> blocked(const Operands& o, double scale) {
  const at::Tensor out = cpu_causal_attention(o.q, o.k, o.v, scale);
  std::vector<at::Tensor> grads = torch::autograd::grad({out}, {o.q, o.k, o.v}, {o.grad_out});
  return {out.detach(), grads[0], grads[1], grads[2]};
}

// The largest |actual - exact| over the model's bound (see the file comment); <= 1 holds.
double deviation(const at::Tensor& actual, const at::Tensor& exact, const Shape& s) {
  const double u = std::ldexp(1.0, -24), n = static_cast<double>(s.qk_dim + s.seq);
  const double bound = 4 * (n * u / (1 - n * u)) * exact.abs().max().item<double>();
  const double error = (actual.to(at::kDouble) - exact).abs().max().item<double>();
  // An exact zero (one key: the scores take no gradient) must come out zero.
  if (bound == 0) return error == 0 ? 0 : std::numeric_limits<double>::infinity();
  return error / bound;
}

void expect_within_the_bound(const Shape& s) {
  const Operands o = operands(s);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.qk_dim));
  const std::vector<at::Tensor> want = exact(o, scale), got = blocked(o, scale);
  const char* names[] = {"output", "grad q", "grad k", "grad v"};
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].sizes(), want[i].sizes()) << names[i];
    EXPECT_LE(deviation(got[i], want[i], s), 1.0) << names[i] << " at seq " << s.seq;
  }
}

// Restores LibTorch's oneDNN switch, which a test flips.
struct OneDnnSwitch {
  bool before = at::globalContext().userEnabledMkldnn();
  ~OneDnnSwitch() { at::globalContext().setUserEnabledMkldnn(before); }
};

TEST(CpuAttention, IsWithinTheFp32BoundOfExactAttentionAcrossBlocks) {
  // One block exactly, one row past it, several blocks ending mid-block, a single position.
  for (const Shape& s : {Shape{1, 2, 2, kCpuAttentionRows, 16, 16}, Shape{2, 2, 2, kCpuAttentionRows + 1, 24, 16},
                         Shape{1, 3, 3, 2 * kCpuAttentionRows + 77, 40, 24}, Shape{2, 2, 2, 1, 8, 8}})
    expect_within_the_bound(s);
}

TEST(CpuAttention, SharedKeyValueHeadsSumTheirQueryHeadsGradients) {
  expect_within_the_bound(Shape{2, 6, 2, kCpuAttentionRows + 40, 16, 16});
}

TEST(CpuAttention, BlasProductsAreWithinTheSameBound) {
  OneDnnSwitch restore;
  at::globalContext().setUserEnabledMkldnn(false);
  expect_within_the_bound(Shape{1, 2, 2, kCpuAttentionRows + 30, 24, 16});
}

TEST(CpuAttention, RepeatedCallsAreBitwiseEqual) {
  const Shape s{1, 4, 2, 2 * kCpuAttentionRows + 5, 32, 16};
  const Operands o = operands(s);
  const std::vector<at::Tensor> first = blocked(o, 0.125), second = blocked(o, 0.125);
  for (size_t i = 0; i < first.size(); ++i) EXPECT_TRUE(first[i].equal(second[i])) << i;
}

TEST(CpuAttention, CausalAttentionTakesItForFp32CpuOperandsFromTheCrossover) {
  const Operands o = operands(Shape{1, 2, 2, kCpuFusedAttentionFrom, 16, 8});
  const at::Tensor out = causal_attention(o.q, o.k, o.v);
  EXPECT_NE(out.grad_fn()->name().find("CpuCausalAttention"), std::string::npos) << out.grad_fn()->name();
  EXPECT_TRUE(out.equal(cpu_causal_attention(o.q, o.k, o.v, 1.0 / std::sqrt(16.0))));
  const Operands shorter = operands(Shape{1, 2, 2, kCpuFusedAttentionFrom - 1, 16, 8});
  const at::Tensor below = causal_attention(shorter.q, shorter.k, shorter.v);
  EXPECT_EQ(below.grad_fn()->name().find("CpuCausalAttention"), std::string::npos) << below.grad_fn()->name();
}

TEST(CpuAttention, LeavesOtherDtypesAndCpuAutocastToLibTorch) {
  const Operands o = operands(Shape{1, 2, 2, 40, 16, 16});
  EXPECT_TRUE(cpu_causal_attention_takes(o.q, o.k, o.v));
  EXPECT_FALSE(cpu_causal_attention_takes(o.q.to(at::kBFloat16), o.k.to(at::kBFloat16), o.v.to(at::kBFloat16)));
  EXPECT_FALSE(cpu_causal_attention_takes(o.q.to(at::kDouble), o.k.to(at::kDouble), o.v.to(at::kDouble)));
  EXPECT_FALSE(cpu_causal_attention_takes(o.q, o.k.narrow(1, 0, 1).repeat({1, 3, 1, 1}), o.v));  // 2 heads over 3
  {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    EXPECT_FALSE(cpu_causal_attention_takes(o.q, o.k, o.v));
    at::autocast::set_autocast_enabled(at::kCPU, false);
  }
}

}  // namespace
}  // namespace keel
