#include "grad_sync/grad_buckets.hpp"

#include <map>
#include <tuple>

namespace keel {

GradientBuckets::GradientBuckets(const std::vector<ParamRef>& params, Mesh& mesh, int64_t bucket_bytes) {
  // One buffer per (group, dtype, device), parameters in their listed order: every member of a
  // group lists the same parameters in the same order, so the buckets line up across ranks.
  using Key = std::tuple<bool, at::ScalarType, std::string>;
  std::map<Key, std::vector<const ParamRef*>> by_buffer;
  std::vector<Key> order;
  for (const ParamRef& p : params) {
    Key key{p.expert(), p.tensor().scalar_type(), p.tensor().device().str()};
    if (by_buffer.find(key) == by_buffer.end()) order.push_back(key);
    by_buffer[key].push_back(&p);
  }
  for (const Key& key : order) {
    const std::vector<const ParamRef*>& members = by_buffer[key];
    int64_t total = 0;
    for (const ParamRef* p : members) total += p->tensor().numel();
    const at::Tensor& like = members.front()->tensor();
    at::Tensor buffer = at::zeros({total}, like.options().requires_grad(false));
    buffers_.push_back(buffer);
    Group* group = &mesh.group(std::get<0>(key) ? KEEL_GROUP_EDP : KEEL_GROUP_DP);
    const int64_t bucket_elements = std::max<int64_t>(1, bucket_bytes / static_cast<int64_t>(like.element_size()));
    int64_t offset = 0, bucket_start = 0;
    for (const ParamRef* p : members) {
      const int64_t n = p->tensor().numel();
      p->tensor().mutable_grad() = buffer.narrow(0, offset, n).view(p->tensor().sizes());
      offset += n;
      if (offset - bucket_start >= bucket_elements) {
        buckets_.push_back({buffer.narrow(0, bucket_start, offset - bucket_start), group});
        bucket_start = offset;
      }
    }
    if (offset > bucket_start) buckets_.push_back({buffer.narrow(0, bucket_start, offset - bucket_start), group});
  }
}

void GradientBuckets::zero() {
  for (at::Tensor& b : buffers_) b.zero_();
}

void GradientBuckets::reduce() {
  std::vector<std::unique_ptr<Work>> pending;
  for (Bucket& b : buckets_)
    if (b.group->size() > 1) pending.push_back(b.group->all_reduce_async(b.flat, KEEL_REDUCE_SUM));
  for (auto& w : pending)
    if (w) w->wait();
}

size_t GradientBuckets::collectives_per_step() const {
  size_t n = 0;
  for (const Bucket& b : buckets_) n += b.group->size() > 1 ? 1 : 0;
  return n;
}

int64_t GradientBuckets::bytes() const {
  int64_t total = 0;
  for (const at::Tensor& b : buffers_) total += static_cast<int64_t>(b.nbytes());
  return total;
}

}  // namespace keel
