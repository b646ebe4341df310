#include "grad_sync/grad_buckets.hpp"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <set>

#include "common/trace_scope.hpp"
#include "optim/optimizer_shards.hpp"

namespace keel {

// Runs after autograd accumulated a parameter's gradient into its view.
class GradientBuckets::FinalGradientHook : public torch::autograd::PostAccumulateGradHook {
 public:
  FinalGradientHook(GradientBuckets& owner, size_t position, size_t param)
      : owner_(owner), position_(position), param_(param) {}
  void operator()(const torch::autograd::Variable& /*param*/) override { owner_.gradient_final(position_, param_); }
  const GradientBuckets* owner() const { return &owner_; }

 private:
  GradientBuckets& owner_;
  size_t position_, param_;
};

GradientBuckets::GradientBuckets(const std::vector<ParamRef>& params, Mesh& mesh, int64_t bucket_bytes, bool overlap)
    : layout_(plan_buckets(params, bucket_bytes)), overlap_(overlap), param_armed_(params.size(), false) {
  for (const BufferSpan& b : layout_.buffers) buffers_.push_back(at::zeros({b.numel}, b.options));
  for (const BucketSpan& span : layout_.buckets) {
    at::Tensor flat = buffers_[span.buffer].narrow(0, span.start, span.numel);
    for (const BucketMember& m : span.members) {
      const at::Tensor& param = params[m.param].tensor();
      param.mutable_grad() = flat.narrow(0, m.offset, m.numel).view(param.sizes());
    }
    buckets_.push_back({flat,
                        &mesh.group(span.expert ? KEEL_GROUP_EDP : KEEL_GROUP_DP),
                        static_cast<int64_t>(span.members.size()),
                        {}});
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
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (position[b] == SIZE_MAX) continue;
    for (const BucketMember& m : layout_.buckets[b].members) {
      const at::Tensor& param = params[m.param].tensor();
      torch::autograd::impl::set_post_acc_grad_hooks(param,
                                                     std::make_unique<FinalGradientHook>(*this, position[b], m.param));
      hooked_.push_back(param);
    }
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

void GradientBuckets::arm(size_t first, size_t end) {
  if (!overlap_ || reduced_.empty()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_) {  // the step's first: a new backward pass
    order_->reset();
    std::fill(param_armed_.begin(), param_armed_.end(), false);
    armed_ = true;
  }
  std::fill(param_armed_.begin() + static_cast<std::ptrdiff_t>(std::min(first, param_armed_.size())),
            param_armed_.begin() + static_cast<std::ptrdiff_t>(std::min(end, param_armed_.size())), true);
}

void GradientBuckets::gradient_final(size_t bucket, size_t param) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (armed_ && param_armed_[param]) start(order_->gradient_final(bucket));
}

size_t GradientBuckets::scatter(const std::vector<ParamRef>& params, const std::vector<size_t>& keep_whole) {
  const std::set<size_t> whole(keep_whole.begin(), keep_whole.end());
  scattered_ = 0;
  for (size_t b : reduced_) {
    const BucketSpan& span = layout_.buckets[b];
    const bool holds_whole = std::any_of(span.members.begin(), span.members.end(),
                                         [&](const BucketMember& m) { return whole.count(m.param) > 0; });
    buckets_[b].cuts.clear();
    if (holds_whole) continue;
    buckets_[b].cuts = shard_cuts(span, params, buckets_[b].group->size());
    ++scattered_;
  }
  return scattered_;
}

void GradientBuckets::start(const std::vector<size_t>& reduced) {
  KEEL_TRACE_SCOPE("keel::dp_reduce_launch");
  for (size_t position : reduced) {
    Bucket& b = buckets_[reduced_[position]];
    pending_.push_back(b.cuts.empty() ? b.group->all_reduce_async(b.flat, KEEL_REDUCE_SUM)
                                      : b.group->reduce_scatter_async(b.flat, b.cuts, KEEL_REDUCE_SUM));
  }
}

void GradientBuckets::reduce() {
  KEEL_TRACE_SCOPE("keel::dp_reduce");
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
