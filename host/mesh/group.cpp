#include "mesh/group.hpp"

#include <stdexcept>

#include "common/text.hpp"

namespace keel {

namespace {
void check_peer(int peer, const char* what) {
  if (peer != 0) throw std::invalid_argument(cat(what, ": group rank ", peer, " does not exist in a group of 1"));
}
void check_same_shape(const at::Tensor& output, const at::Tensor& input, const char* what) {
  if (output.sizes() != input.sizes())
    throw std::invalid_argument(
        cat(what, ": output shape ", output.sizes(), " differs from input ", input.sizes(), " in a group of 1"));
}
}  // namespace

void SoloGroup::broadcast(at::Tensor&, int root) { check_peer(root, "broadcast"); }

void SoloGroup::all_gather(at::Tensor& output, const at::Tensor& input) {
  check_same_shape(output, input, "all_gather");
  if (!output.is_same(input)) output.copy_(input);
}

void SoloGroup::reduce_scatter(at::Tensor& output, const at::Tensor& input, keel_reduce_op) {
  check_same_shape(output, input, "reduce_scatter");
  if (!output.is_same(input)) output.copy_(input);
}

void SoloGroup::all_to_all(at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& output_splits,
                           const std::vector<int64_t>& input_splits) {
  if (output_splits.size() != 1 || input_splits.size() != 1 || output_splits[0] != input_splits[0])
    throw std::invalid_argument("all_to_all: a group of 1 needs one split, equal for input and output");
  check_same_shape(output, input, "all_to_all");
  if (!output.is_same(input)) output.copy_(input);
}

void SoloGroup::send(const at::Tensor&, int peer, int) {
  throw std::invalid_argument(cat("send: a group of 1 has no peer ", peer));
}

void SoloGroup::recv(at::Tensor&, int peer, int) {
  throw std::invalid_argument(cat("recv: a group of 1 has no peer ", peer));
}

}  // namespace keel
