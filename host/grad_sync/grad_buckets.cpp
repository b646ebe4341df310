#include "grad_sync/grad_buckets.hpp"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <map>
#include <tuple>

namespace keel {

// Runs after autograd accumulated a parameter's gradient into its view.
class GradientBuckets::FinalGradientHook : public torch::autograd::PostAccumulateGradHook {
 public:
  FinalGradientHook(GradientBuckets& owner, size_t position) : owner_(owner), position_(position) {}
  void operator()(const torch::autograd::Variable& /*param*/) override { owner_.gradient_final(position_); }
  const GradientBuckets* owner() const { return &owner_; }

 private:
  GradientBuckets& owner_;
  size_t position_;
};

GradientBuckets::GradientBuckets(const std::vector<ParamRef>& params, Mesh& mesh, int64_t bucket_bytes, bool overlap)
    : overlap_(overlap) {
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
  std::vector<std::pair<at::Tensor, size_t>> bucket_of;  // each parameter and its bucket
  for (const Key& key : order) {
    const std::vector<const ParamRef*>& members = by_buffer[key];
    int64_t total = 0;
    for (const ParamRef* p : members) total += p->tensor().numel();
    const at::Tensor& like = members.front()->tensor();
    at::Tensor buffer = at::zeros({total}, like.options().requires_grad(false));
    buffers_.push_back(buffer);
    Group* group = &mesh.group(std::get<0>(key) ? KEEL_GROUP_EDP : KEEL_GROUP_DP);
    const int64_t bucket_elements = std::max<int64_t>(1, bucket_bytes / static_cast<int64_t>(like.element_size()));
    int64_t offset = 0, bucket_start = 0, gradients = 0;
    for (const ParamRef* p : members) {
      const int64_t n = p->tensor().numel();
      p->tensor().mutable_grad() = buffer.narrow(0, offset, n).view(p->tensor().sizes());
      bucket_of.emplace_back(p->tensor(), buckets_.size());
      offset += n;
      ++gradients;
      if (offset - bucket_start >= bucket_elements) {
        buckets_.push_back({buffer.narrow(0, bucket_start, offset - bucket_start), group, gradients});
        bucket_start = offset;
        gradients = 0;
      }
    }
    if (offset > bucket_start)
      buckets_.push_back({buffer.narrow(0, bucket_start, offset - bucket_start), group, gradients});
  }
  // Only groups of several members reduce; their buckets are numbered in reduced_.
  std::map<Group*, int> group_ids;
  std::vector<int> group_of;
  std::vector<int64_t> counts;
  std::vector<size_t> position(buckets_.size(), SIZE_MAX);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b].group->size() <= 1) continue;
    position[b] = reduced_.size();
    reduced_.push_back(b);
    group_of.push_back(group_ids.try_emplace(buckets_[b].group, static_cast<int>(group_ids.size())).first->second);
    counts.push_back(buckets_[b].gradients);
  }
  order_ = std::make_unique<LaunchOrder>(group_of, counts);
  if (!overlap_) return;
  for (const auto& [param, bucket] : bucket_of) {
    if (position[bucket] == SIZE_MAX) continue;
    torch::autograd::impl::set_post_acc_grad_hooks(param, std::make_unique<FinalGradientHook>(*this, position[bucket]));
    hooked_.push_back(param);
  }
}

GradientBuckets::~GradientBuckets() {
  // Only this object's hooks go: a later GradientBuckets over the same parameters keeps its own.
  for (const at::Tensor& param : hooked_) {
    std::unique_ptr<torch::autograd::PostAccumulateGradHook>& hook = torch::autograd::impl::post_acc_grad_hooks(param);
    const auto* mine = dynamic_cast<const FinalGradientHook*>(hook.get());
    if (mine != nullptr && mine->owner() == this) hook.reset();
  }
}

void GradientBuckets::zero() {
  for (at::Tensor& b : buffers_) b.zero_();
}

void GradientBuckets::arm() {
  if (!overlap_ || reduced_.empty()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  order_->reset();
  armed_ = true;
}

void GradientBuckets::gradient_final(size_t bucket) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (armed_) start(order_->gradient_final(bucket));
}

void GradientBuckets::start(const std::vector<size_t>& reduced) {
  for (size_t position : reduced) {
    Bucket& b = buckets_[reduced_[position]];
    pending_.push_back(b.group->all_reduce_async(b.flat, KEEL_REDUCE_SUM));
  }
}

void GradientBuckets::reduce() {
  std::vector<std::unique_ptr<Work>> pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!armed_) order_->reset();
    armed_ = false;
    started_during_backward_ = order_->started_early();
    start(order_->rest());
    pending.swap(pending_);
  }
  for (auto& w : pending)
    if (w) w->wait();
}

size_t GradientBuckets::collectives_per_step() const { return reduced_.size(); }

int64_t GradientBuckets::bytes() const {
  int64_t total = 0;
  for (const at::Tensor& b : buffers_) total += static_cast<int64_t>(b.nbytes());
  return total;
}

}  // namespace keel
