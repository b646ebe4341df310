#include "mesh/group.hpp"

#include <algorithm>
#include <cstring>
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

std::unique_ptr<Work> SoloGroup::isend(const at::Tensor& tensor, int peer, int tag) {
  send(tensor, peer, tag);
  return nullptr;
}

std::unique_ptr<Work> SoloGroup::irecv(at::Tensor& tensor, int peer, int tag) {
  recv(tensor, peer, tag);
  return nullptr;
}

void check_scatter_cuts(const at::Tensor& flat, const std::vector<int64_t>& cuts, int members) {
  if (flat.dim() != 1 || !flat.is_contiguous())
    throw std::invalid_argument(
        cat("reduce_scatter_async: the tensor must be 1-D and contiguous, got shape ", flat.sizes()));
  if (cuts.size() != static_cast<size_t>(members) + 1 || cuts.front() != 0 || cuts.back() != flat.numel() ||
      !std::is_sorted(cuts.begin(), cuts.end()))
    throw std::invalid_argument(cat("reduce_scatter_async: want ", members + 1, " ascending cuts from 0 to ",
                                    flat.numel(), ", got ", cuts.size(), " cut(s)"));
}

std::vector<std::string> all_gather_bytes(Group& group, const std::string& bytes) {
  if (group.size() == 1) return {bytes};
  // Gloo gathers equal sizes only: agree on the longest, pad to it, cut by the gathered lengths.
  const auto n = static_cast<size_t>(group.size());
  at::Tensor length = at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong);
  at::Tensor lengths = at::empty({group.size()}, at::kLong);
  group.all_gather(lengths, length);
  int64_t longest = lengths.max().item<int64_t>();
  at::Tensor mine = at::zeros({std::max<int64_t>(longest, 1)}, at::kByte);
  std::memcpy(mine.data_ptr(), bytes.data(), bytes.size());
  at::Tensor all = at::empty({static_cast<int64_t>(n) * mine.size(0)}, at::kByte);
  group.all_gather(all, mine);
  std::vector<std::string> out(n);
  const char* base = static_cast<const char*>(all.data_ptr());
  for (size_t i = 0; i < n; ++i)
    out[i].assign(base + static_cast<int64_t>(i) * mine.size(0),
                  static_cast<size_t>(lengths[static_cast<int64_t>(i)].item<int64_t>()));
  return out;
}

}  // namespace keel
