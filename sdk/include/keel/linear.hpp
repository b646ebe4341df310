// keel/linear.hpp — linear layers whose fp32 CPU products run on oneDNN.
//
// LibTorch sends an fp32 `at::linear` on CPU to MKL's sgemm, which on AMD's AVX-512 cores runs
// its AVX2 kernels: about half of what the cores can do. oneDNN, which LibTorch also carries,
// picks its kernels by the instruction sets the CPU reports, whatever its vendor, and runs the
// same fp32 products (fp32 inputs, fp32 accumulation, no reduced-precision math) at up to twice
// the rate there. keel::linear reaches oneDNN through LibTorch's own `mkldnn::_linear_pointwise`
// operator, for the forward product and both backward ones (at::matmul's under create_graph, so
// that a second derivative exists); everything else (CUDA, other dtypes, CPU autocast, empty
// operands, a LibTorch without oneDNN, or oneDNN switched off with
// `at::globalContext().setUserEnabledMkldnn(false)`, as `training.cpu_gemm = "blas"` does) takes
// `at::linear`. The two differ only in the order of the fp32 sums.
//
// Included on its own, as it pulls in LibTorch's autograd headers.
#pragma once

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <string>

namespace keel {

namespace detail {

/// The signature onednn_product calls the operator with (LibTorch 2.0 on).
inline constexpr const char* kOneDnnLinearSchema =
    "mkldnn::_linear_pointwise(Tensor X, Tensor W, Tensor? B, str attr, Scalar?[] scalars, str? algorithm) -> Tensor Y";

/// LibTorch's oneDNN linear operator, or nullopt when this LibTorch has none with the signature
/// onednn_product calls (a boxed call does not check its arguments against the schema).
inline const std::optional<c10::OperatorHandle>& onednn_linear_operator() {
  static const std::optional<c10::OperatorHandle> op = []() -> std::optional<c10::OperatorHandle> {
    if (!at::hasMKLDNN()) return std::nullopt;
    auto found = c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
    if (!found || c10::toString(found->schema()) != kOneDnnLinearSchema) return std::nullopt;
    return found;
  }();
  return op;
}

/// x [..., k] times w [n, k] transposed on oneDNN: [..., n]. `w` may be any strided view; `x`
/// is copied contiguous first when it is not.
inline at::Tensor onednn_product(const at::Tensor& x, const at::Tensor& w) {
  torch::jit::Stack stack{x,
                          w,
                          c10::IValue(),
                          c10::IValue(std::string("none")),
                          c10::IValue(c10::List<std::optional<at::Scalar>>()),
                          c10::IValue()};
  onednn_linear_operator()->callBoxed(&stack);
  return stack[0].toTensor();
}

struct OneDnnLinearFunction : public torch::autograd::Function<OneDnnLinearFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w) {
    ctx->save_for_backward({x, w});
    return onednn_product(x, w);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    const int64_t n = w.size(0), k = w.size(1);
    const at::Tensor grad = grads[0].reshape({-1, n}), rows = x.reshape({-1, k});
    const bool create_graph = at::GradMode::is_enabled();
    at::Tensor grad_x, grad_w;
    // Each product only where it is asked for: a split backward pass runs the input's and the
    // weight's apart. Under create_graph the products must be differentiable again: at::matmul.
    if (ctx->needs_input_grad(0))
      grad_x = (create_graph ? at::matmul(grad, w) : onednn_product(grad, w.t())).view(x.sizes());
    if (ctx->needs_input_grad(1)) {
      if (create_graph)
        grad_w = at::matmul(grad.t(), rows);
      else if (n <= k)
        grad_w = onednn_product(grad.t(), rows.t());  // copies grad^T, [n, rows]
      else
        // A widening layer (the output head: n = vocabulary) would copy the larger grad^T:
        // copy x^T [k, rows] instead and hand back dW^T's transpose, bitwise the same product.
        grad_w = onednn_product(rows.t(), grad.t()).t();
    }
    return {grad_x, grad_w};
  }
};

}  // namespace detail

/// Whether keel::linear's fp32 CPU products run on oneDNN now, whatever the tensors: outside
/// CPU autocast (whose bf16 products at::linear keeps), oneDNN present and enabled.
inline bool onednn_linear_enabled() {
  return !at::autocast::is_autocast_enabled(at::kCPU) && at::globalContext().userEnabledMkldnn() &&
         detail::onednn_linear_operator().has_value();
}

/// Whether keel::linear(x, w) runs on oneDNN: non-empty fp32 CPU tensors, x at least a matrix
/// and w a matrix, while onednn_linear_enabled().
inline bool linear_uses_onednn(const at::Tensor& x, const at::Tensor& w) {
  return x.device().is_cpu() && w.device().is_cpu() && x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat &&
         x.dim() >= 2 && w.dim() == 2 && x.numel() > 0 && w.numel() > 0 && onednn_linear_enabled();
}

/// x [..., k] times w [n, k] transposed, as at::linear(x, w) without a bias, differentiable in
/// both; on oneDNN where linear_uses_onednn says so.
inline at::Tensor linear(const at::Tensor& x, const at::Tensor& w) {
  if (!linear_uses_onednn(x, w)) return at::linear(x, w);
  return detail::OneDnnLinearFunction::apply(x, w);
}

}  // namespace keel
