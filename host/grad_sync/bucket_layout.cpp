#include "grad_sync/bucket_layout.hpp"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

namespace keel {

BucketLayout plan_buckets(const std::vector<ParamRef>& params, int64_t bucket_bytes) {
  using Key = std::tuple<bool, at::ScalarType, std::string>;
  std::map<Key, std::vector<size_t>> by_buffer;
  std::vector<Key> order;  // buffers in order of their first parameter
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& t = params[i].tensor();
    Key key{params[i].expert(), t.scalar_type(), t.device().str()};
    if (by_buffer.find(key) == by_buffer.end()) order.push_back(key);
    by_buffer[key].push_back(i);
  }
  BucketLayout layout;
  for (const Key& key : order) {
    const std::vector<size_t>& members = by_buffer[key];
    const at::Tensor& like = params[members.front()].tensor();
    const size_t buffer = layout.buffers.size();
    const bool expert = std::get<0>(key);
    const int64_t bucket_elements = std::max<int64_t>(1, bucket_bytes / static_cast<int64_t>(like.element_size()));
    BucketSpan open{buffer, 0, 0, expert, {}};
    int64_t offset = 0;
    for (size_t i : members) {
      const int64_t n = params[i].tensor().numel();
      open.members.push_back({i, offset - open.start, n});
      offset += n;
      open.numel = offset - open.start;
      if (open.numel >= bucket_elements) {
        layout.buckets.push_back(std::move(open));
        open = BucketSpan{buffer, offset, 0, expert, {}};
      }
    }
    if (!open.members.empty()) layout.buckets.push_back(std::move(open));
    layout.buffers.push_back({expert, like.options().requires_grad(false), offset});
  }
  return layout;
}

}  // namespace keel
