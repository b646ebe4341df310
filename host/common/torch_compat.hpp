// The LibTorch API differences within the supported range (2.11 to 2.15), in one place. Each
// helper detects the newer call at compile time (a requires-expression, not a version number,
// so versions in between pick whichever they have) and falls back to the older one.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <vector>

namespace keel::torch_compat {

/// Gathers every member's `input` into `output` (dim 0): c10d's all_gather_single (2.15), which
/// LibTorch 2.11 names _allgather_base (2.15 keeps that name as a deprecated alias).
template <typename Backend>
c10::intrusive_ptr<c10d::Work> all_gather_single(Backend& backend, at::Tensor& output, at::Tensor& input) {
  if constexpr (requires { backend.all_gather_single(output, input); })
    return backend.all_gather_single(output, input);
  else
    return backend._allgather_base(output, input);
}

/// All-to-all of one buffer with split sizes: c10d's all_to_all_single (2.15), which LibTorch
/// 2.11 names alltoall_base (2.15 keeps that name as a deprecated alias).
template <typename Backend>
c10::intrusive_ptr<c10d::Work> all_to_all_single(Backend& backend, at::Tensor& output, at::Tensor& input,
                                                 std::vector<int64_t>& output_splits,
                                                 std::vector<int64_t>& input_splits) {
  if constexpr (requires { backend.all_to_all_single(output, input, output_splits, input_splits); })
    return backend.all_to_all_single(output, input, output_splits, input_splits);
  else
    return backend.alltoall_base(output, input, output_splits, input_splits);
}

}  // namespace keel::torch_compat
