// The split backward pass of zero-bubble schedules: an input pass and a weight pass give the
// very gradients of one whole backward pass, and neither computes what the other does.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <utility>
#include <vector>

#include "pipeline/split_backward.hpp"

namespace keel {
namespace {

// y = x * w, recording which of its two gradients each backward call was asked for.
struct Probe : torch::autograd::Function<Probe> {
  static std::vector<std::pair<bool, bool>>& calls() {
    static std::vector<std::pair<bool, bool>> record;
    return record;
  }
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w) {
    ctx->save_for_backward({x, w});
    return x * w;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    calls().emplace_back(ctx->needs_input_grad(0), ctx->needs_input_grad(1));
    auto saved = ctx->get_saved_variables();
    return {grads[0] * saved[1], (grads[0] * saved[0]).sum(0)};
  }
};

struct CountAccumulations : torch::autograd::PostAccumulateGradHook {
  explicit CountAccumulations(int& calls) : calls_(calls) {}
  void operator()(const torch::autograd::Variable&) override { ++calls_; }
  int& calls_;
};

struct Weights {
  at::Tensor w1, norm, w2, scale;
  std::vector<at::Tensor> all() const { return {w1, norm, w2, scale}; }
};

Weights make_weights() {
  at::manual_seed(7);
  auto leaf = [](at::Tensor t) { return t.requires_grad_(true); };
  return {leaf(at::randn({16, 8})), leaf(at::rand({16}) + 0.5), leaf(at::randn({8, 16})), leaf(at::randn({8}))};
}

// A small stage: a projection, an RMSNorm with its own weight, SwiGLU-like gating, a
// projection used twice (shared weight) and the probe; `x` may be undefined (first stage).
at::Tensor stage(const Weights& w, const at::Tensor& x, const at::Tensor& tokens) {
  at::Tensor h = x.defined() ? x + tokens : tokens;
  at::Tensor a = at::rms_norm(at::linear(h, w.w1), {16}, w.norm, 1e-6);
  at::Tensor b = at::linear(at::silu(a) * a, w.w2);
  b = at::linear(at::tanh(at::linear(b, w.w1)), w.w2) + b;  // w1, w2 reached twice
  return Probe::apply(b, w.scale);
}

struct Grads {
  at::Tensor input;
  std::vector<at::Tensor> weights;
};

Grads whole(const at::Tensor& tokens, const at::Tensor& out_grad, bool with_input) {
  Weights w = make_weights();
  at::Tensor x = with_input ? at::randn({4, 8}).requires_grad_(true) : at::Tensor();
  stage(w, x, tokens).backward(out_grad);
  Grads g;
  if (with_input) {
    g.input = x.grad();
  }
  for (const at::Tensor& t : w.all()) g.weights.push_back(t.grad());
  return g;
}

Grads split(const at::Tensor& tokens, const at::Tensor& out_grad, bool with_input, size_t* branches = nullptr) {
  Weights w = make_weights();
  at::Tensor x = with_input ? at::randn({4, 8}).requires_grad_(true) : at::Tensor();
  SplitBackward pass(stage(w, x, tokens), x);
  if (branches) *branches = pass.branch_count();
  Grads g;
  g.input = pass.input_pass(out_grad);
  for (const at::Tensor& t : w.all()) EXPECT_FALSE(t.grad().defined()) << "the input pass accumulated a weight";
  pass.weight_pass();
  for (const at::Tensor& t : w.all()) g.weights.push_back(t.grad());
  return g;
}

void expect_bitwise(const Grads& a, const Grads& b) {
  ASSERT_EQ(a.input.defined(), b.input.defined());
  if (a.input.defined()) {
    EXPECT_TRUE(at::equal(a.input, b.input));
  }
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (size_t i = 0; i < a.weights.size(); ++i) {
    ASSERT_TRUE(a.weights[i].defined() && b.weights[i].defined()) << "weight " << i;
    EXPECT_TRUE(at::equal(a.weights[i], b.weights[i])) << "weight " << i;
  }
}

TEST(SplitBackward, InputThenWeightPassGiveTheWholePassesGradientsBitwise) {
  at::manual_seed(1);
  at::Tensor tokens = at::randn({4, 8}), out_grad = at::randn({4, 8});
  Probe::calls().clear();
  Grads want = whole(tokens, out_grad, true);
  ASSERT_EQ(Probe::calls(), (std::vector<std::pair<bool, bool>>{{true, true}}));
  Probe::calls().clear();
  size_t branches = 0;
  Grads got = split(tokens, out_grad, true, &branches);
  expect_bitwise(want, got);
  EXPECT_GT(branches, 4u);
  // The probe computed its input's gradient in the input pass and its weight's in the weight
  // pass, each once.
  EXPECT_EQ(Probe::calls(), (std::vector<std::pair<bool, bool>>{{true, false}, {false, true}}));
}

TEST(SplitBackward, WithoutAnInputTheWeightPassIsTheWholePass) {
  at::manual_seed(2);
  at::Tensor tokens = at::randn({4, 8}), out_grad = at::randn({4, 8});
  Grads want = whole(tokens, out_grad, false);
  size_t branches = 1;
  Grads got = split(tokens, out_grad, false, &branches);
  EXPECT_FALSE(got.input.defined());
  EXPECT_EQ(branches, 0u);
  expect_bitwise(want, got);
}

TEST(SplitBackward, AnInputThatDoesNotReachTheOutputHasNoGradient) {
  Weights w = make_weights();
  at::Tensor x = at::randn({4, 8}).requires_grad_(true);
  at::Tensor out = at::linear(at::randn({4, 8}), w.w2.t()).sum() + x.detach().sum();
  SplitBackward pass(out, x);
  EXPECT_FALSE(pass.input_pass(at::ones({})).defined());
  pass.weight_pass();
  EXPECT_TRUE(w.w2.grad().defined());
}

TEST(SplitBackward, HooksOnAnIntermediateRunOnceAndAccumulateHooksInTheWeightPass) {
  Weights w = make_weights();
  at::Tensor x = at::randn({4, 8}).requires_grad_(true);
  int tensor_hook_calls = 0, accumulate_calls = 0;
  at::Tensor a = at::linear(x, w.w1);  // its node feeds both x and w1
  a.register_hook([&](const at::Tensor& g) {
    ++tensor_hook_calls;
    return g * 2;  // applied once, as a whole pass applies it
  });
  torch::autograd::impl::set_post_acc_grad_hooks(w.w1, std::make_unique<CountAccumulations>(accumulate_calls));
  at::Tensor out = at::linear(at::relu(a), w.w2);
  at::Tensor g = at::randn(out.sizes());
  SplitBackward pass(out, x);
  at::Tensor input_grad = pass.input_pass(g);
  EXPECT_EQ(accumulate_calls, 0);
  pass.weight_pass();
  EXPECT_EQ(tensor_hook_calls, 1);
  EXPECT_EQ(accumulate_calls, 1);

  Weights v = make_weights();
  at::Tensor y = x.detach().clone().requires_grad_(true);
  at::Tensor b = at::linear(y, v.w1);
  b.register_hook([](const at::Tensor& grad) { return grad * 2; });
  at::linear(at::relu(b), v.w2).backward(g);
  EXPECT_TRUE(at::equal(input_grad, y.grad()));
  EXPECT_TRUE(at::equal(w.w1.grad(), v.w1.grad()));
}

TEST(SplitBackward, PassesOutOfOrderAreRefused) {
  Weights w = make_weights();
  at::Tensor x = at::randn({4, 8}).requires_grad_(true);
  SplitBackward pass(at::linear(x, w.w2.t()), x);
  EXPECT_THROW(pass.weight_pass(), std::logic_error);
  pass.input_pass(at::ones({4, 16}));
  EXPECT_THROW(pass.input_pass(at::ones({4, 16})), std::logic_error);
  EXPECT_THROW(SplitBackward(at::ones({2}), x), std::invalid_argument);
}

}  // namespace
}  // namespace keel
