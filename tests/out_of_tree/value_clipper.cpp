// value_clipper: clamps every gradient element to [-clip_value, clip_value] and reports the
// global L2 norm of the logical gradients before clamping. REPLICA copies are clamped like
// their owners (equal gradients stay equal) and not counted in the norm.
#include <keel/keel.hpp>

#include <memory>
#include <vector>

namespace {

class ValueClipper {
 public:
  static std::unique_ptr<ValueClipper> create(keel::Host host, keel::Config& config) {
    double clip_value = config.real("clip_value", 0.01);
    if (!(clip_value > 0)) config.invalid("clip_value", "must be positive");
    host.info("value_clipper: clamping gradients to +-" + std::to_string(clip_value));
    return std::unique_ptr<ValueClipper>(new ValueClipper(host, clip_value));
  }
  keel::Host host() const { return host_; }

  at::Tensor clip(const keel_param_info* const* params, size_t count) {
    at::Tensor total_sq;
    for (size_t i = 0; i < count; ++i) {
      const keel_param_info& p = keel::param(params[i]);
      at::Tensor grad = keel::tensor(p.tensor).grad();
      if (!grad.defined()) continue;
      if ((p.flags & KEEL_PARAM_REPLICA) == 0) {
        at::Tensor sq = grad.to(at::kFloat).square().sum();
        if ((p.flags & KEEL_PARAM_EXPERT) != 0) host_.all_reduce(host_.group(KEEL_GROUP_EP), sq);
        total_sq = total_sq.defined() ? total_sq + sq : sq;
      }
      grad.clamp_(-clip_value_, clip_value_);
    }
    if (!total_sq.defined()) total_sq = at::zeros({}, at::kFloat);
    host_.all_reduce(host_.group(KEEL_GROUP_PP), total_sq);
    return total_sq.sqrt();
  }

 private:
  ValueClipper(keel::Host host, double clip_value) : host_(host), clip_value_(clip_value) {}
  keel::Host host_;
  double clip_value_;
};

}  // namespace

KEEL_PLUGIN("value_clipper", "0.1.0",
            keel::clipper_component<ValueClipper>("value_clipper", "Element-wise gradient value clipping",
                                                  KEEL_HOOK_CLIP_CAPTURE_SAFE))
