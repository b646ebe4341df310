#include "grad_sync/launch_order.hpp"

#include <stdexcept>

namespace keel {

LaunchOrder::LaunchOrder(const std::vector<int>& group_of, std::vector<int64_t> gradients)
    : group_of_(group_of), gradients_(std::move(gradients)) {
  if (group_of_.size() != gradients_.size()) throw std::logic_error("LaunchOrder: one group and count per bucket");
  for (size_t b = group_of_.size(); b-- > 0;) {
    const auto g = static_cast<size_t>(group_of_[b]);
    if (g >= order_.size()) order_.resize(g + 1);
    order_[g].push_back(b);
  }
  reset();
}

void LaunchOrder::reset() {
  remaining_ = gradients_;
  cursor_.assign(order_.size(), 0);
  started_early_ = 0;
}

std::vector<size_t> LaunchOrder::advance(int group) {
  std::vector<size_t> start;
  const auto g = static_cast<size_t>(group);
  while (cursor_[g] < order_[g].size() && remaining_[order_[g][cursor_[g]]] == 0)
    start.push_back(order_[g][cursor_[g]++]);
  return start;
}

std::vector<size_t> LaunchOrder::gradient_final(size_t b) {
  if (remaining_[b] == 0) return {};  // already counted final (a second accumulation changes nothing started)
  if (--remaining_[b] > 0) return {};
  std::vector<size_t> start = advance(group_of_[b]);
  started_early_ += start.size();
  return start;
}

std::vector<size_t> LaunchOrder::rest() {
  std::vector<size_t> start;
  for (size_t g = 0; g < order_.size(); ++g)
    for (; cursor_[g] < order_[g].size(); ++cursor_[g]) start.push_back(order_[g][cursor_[g]]);
  return start;
}

}  // namespace keel
