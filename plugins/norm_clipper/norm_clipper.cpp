// norm_clipper: the default gradient clipper. The total norm counts every logical parameter
// once (REPLICA copies excluded): the expert part is summed over ep, the whole over pp (dense
// gradients are identical across dp after the reduction). Every gradient, replicas included,
// is scaled by the same device-tensor coefficient min(1, max_norm / (total + 1e-6)). With no
// replicas this is torch.nn.utils.clip_grad_norm_. No host synchronisation: capture-safe.
// State (checkpointed under the clipper's name): how many steps it clipped and saw, device
// counters updated without a host read (on a step the host skips, the host puts them back).
#include <keel/keel.hpp>

#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

namespace {

class NormClipper {
 public:
  static std::unique_ptr<NormClipper> create(keel::Host host, keel::Config& config) {
    double max_norm = config.real("max_norm", 1.0);
    if (!(max_norm > 0) || !std::isfinite(max_norm)) config.invalid("max_norm", "must be a positive number");
    std::string norm_type = config.string("norm_type", "2");
    if (norm_type != "2" && norm_type != "inf")
      config.invalid("norm_type", "must be \"2\" or \"inf\", got \"" + norm_type + "\"");
    return std::unique_ptr<NormClipper>(new NormClipper(host, max_norm, norm_type == "inf"));
  }

  keel::Host host() const { return host_; }

  // Sorts the parameters once into static lists, so clip() does no per-step classification.
  void bind_model_parts(const keel_param_info* const* params, size_t count) {
    dense_.clear();
    expert_.clear();
    all_.clear();
    for (size_t i = 0; i < count; ++i) {
      const keel_param_info& p = keel::param(params[i]);
      at::Tensor* t = &keel::tensor(p.tensor);
      all_.push_back(t);
      if ((p.flags & KEEL_PARAM_REPLICA) != 0) continue;
      ((p.flags & KEEL_PARAM_EXPERT) != 0 ? expert_ : dense_).push_back(t);
    }
    if (count > 0) device_ = keel::tensor(params[0]->tensor).device();
    steps_ = steps_.to(device_);
    clipped_steps_ = clipped_steps_.to(device_);
    bound_ = true;
  }

  std::pair<const keel_named_tensor* const*, size_t> state() {
    named_[0] = {sizeof(keel_named_tensor), "steps", keel::handle(steps_)};
    named_[1] = {sizeof(keel_named_tensor), "clipped_steps", keel::handle(clipped_steps_)};
    state_view_ = {&named_[0], &named_[1]};
    return {state_view_.data(), state_view_.size()};
  }

  at::Tensor clip(const keel_param_info* const* params, size_t count) {
    if (!bound_) bind_model_parts(params, count);
    at::Tensor dense = partial(dense_);
    at::Tensor expert = partial(expert_);
    if (inf_) {
      host_.all_reduce(host_.group(KEEL_GROUP_EP), expert, KEEL_REDUCE_MAX);
      at::Tensor total = at::maximum(dense, expert);
      host_.all_reduce(host_.group(KEEL_GROUP_PP), total, KEEL_REDUCE_MAX);
      scale(total);
      return total;
    }
    host_.all_reduce(host_.group(KEEL_GROUP_EP), expert, KEEL_REDUCE_SUM);
    at::Tensor total_sq = dense + expert;
    host_.all_reduce(host_.group(KEEL_GROUP_PP), total_sq, KEEL_REDUCE_SUM);
    at::Tensor total = total_sq.sqrt();
    scale(total);
    return total;
  }

 private:
  NormClipper(keel::Host host, double max_norm, bool inf) : host_(host), max_norm_(max_norm), inf_(inf) {}

  static std::vector<at::Tensor> grads_of(const std::vector<at::Tensor*>& params) {
    std::vector<at::Tensor> grads;
    grads.reserve(params.size());
    for (at::Tensor* p : params)
      if (p->grad().defined()) grads.push_back(p->grad());
    return grads;
  }

  // Sum of squares (or max of abs) of this rank's gradients in `params`, in fp32; a zero on
  // the parameters' device when there are none.
  at::Tensor partial(const std::vector<at::Tensor*>& params) const {
    std::vector<at::Tensor> grads = grads_of(params);
    if (grads.empty()) return at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device_));
    std::vector<at::Tensor> norms = at::_foreach_norm(grads, inf_ ? std::numeric_limits<double>::infinity() : 2.0);
    at::Tensor stacked = at::stack(norms).to(at::kFloat);
    if (!inf_) return stacked.square().sum();
    // A MAX all-reduce may keep a finite value over a NaN (Gloo does): a NaN goes in as +inf,
    // which every maximum keeps, so the total is non-finite on every rank.
    const double inf = std::numeric_limits<double>::infinity();
    return at::nan_to_num(stacked.max(), inf, inf, -inf);
  }

  void scale(const at::Tensor& total) {
    at::Tensor coef = (max_norm_ / (total + 1e-6)).clamp_max(1.0);
    steps_.add_(1.0);
    clipped_steps_.add_(coef.lt(1.0).to(at::kFloat));
    std::vector<at::Tensor> grads = grads_of(all_);
    if (!grads.empty()) at::_foreach_mul_(grads, coef);
  }

  keel::Host host_;
  double max_norm_;
  bool inf_;
  bool bound_ = false;
  at::Device device_{at::kCPU};
  std::vector<at::Tensor*> dense_, expert_, all_;
  at::Tensor steps_ = at::zeros({}, at::kFloat), clipped_steps_ = at::zeros({}, at::kFloat);
  std::array<keel_named_tensor, 2> named_{};
  std::array<const keel_named_tensor*, 2> state_view_{};
};

}  // namespace

KEEL_PLUGIN("norm_clipper", "1.0.0",
            keel::clipper_component<NormClipper>("norm_clipper",
                                                 "Global-norm gradient clipping over logical parameters "
                                                 "(REPLICA-aware, expert part over ep, all over pp)",
                                                 KEEL_HOOK_CLIP_CAPTURE_SAFE))
