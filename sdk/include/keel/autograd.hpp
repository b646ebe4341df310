// Differentiable collectives for plugin authors, on top of the host API's collectives.
// Expert parallelism dispatches tokens to the ranks that hold their experts and brings the
// results back; autograd must carry the gradients the same way in reverse. Each function here
// is a torch::autograd::Function whose backward is the transposed collective. Backward passes
// run in an order fixed by the graph, so every member of the group reaches the reverse
// collectives in the same order; on CPU they run on the thread that called backward(), on CUDA
// on autograd's device threads, which the host API allows ([any-thread] in keel.h). A failed
// collective there throws keel::HostReported carrying the host's message (last_error), which
// autograd rethrows to whoever called backward().
#pragma once

#include <torch/csrc/autograd/custom_function.h>

#include <keel/keel.hpp>

#include <cstdint>
#include <numeric>
#include <vector>

namespace keel {

namespace detail {

// Exchanges dim-0 slices of `input` over `group` (input_splits rows to each member,
// output_splits rows from each).
inline at::Tensor exchange(keel_host* host, keel_group* group, const at::Tensor& input,
                           const std::vector<int64_t>& output_splits, const std::vector<int64_t>& input_splits) {
  std::vector<int64_t> shape = input.sizes().vec();
  shape[0] = std::accumulate(output_splits.begin(), output_splits.end(), int64_t{0});
  at::Tensor output = at::empty(shape, input.options());
  Host(host).all_to_all(group, output, input.contiguous(), output_splits, input_splits);
  return output;
}

struct AllToAllFunction : public torch::autograd::Function<AllToAllFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input, keel_host* host,
                            keel_group* group, const std::vector<int64_t>& output_splits,
                            const std::vector<int64_t>& input_splits) {
    // The context stores IValues: the borrowed handles travel as integers.
    ctx->saved_data["host"] = reinterpret_cast<int64_t>(host);
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["output_splits"] = output_splits;
    ctx->saved_data["input_splits"] = input_splits;
    return exchange(host, group, input, output_splits, input_splits);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* host = reinterpret_cast<keel_host*>(ctx->saved_data["host"].toInt());
    auto* group = reinterpret_cast<keel_group*>(ctx->saved_data["group"].toInt());
    std::vector<int64_t> output_splits = ctx->saved_data["output_splits"].toIntVector();
    std::vector<int64_t> input_splits = ctx->saved_data["input_splits"].toIntVector();
    // The reverse exchange: what arrived from member i goes back to member i.
    at::Tensor grad_input = exchange(host, group, grads[0], input_splits, output_splits);
    return {grad_input, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace detail

namespace autograd {

/// All-to-all of dim-0 slices that autograd differentiates: `input_splits[i]` rows of `input`
/// go to member i, `output_splits[i]` rows arrive from it; the backward pass runs the reverse
/// exchange (splits swapped) on the gradients. Both split lists have one entry per member.
/// [collective: group] in forward and again in backward
inline at::Tensor all_to_all(const Host& host, keel_group* group, const at::Tensor& input,
                             const std::vector<int64_t>& output_splits, const std::vector<int64_t>& input_splits) {
  return detail::AllToAllFunction::apply(input, host.raw(), group, output_splits, input_splits);
}

}  // namespace autograd

}  // namespace keel
