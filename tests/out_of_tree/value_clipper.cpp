// value_clipper: clamps every gradient element to [-clip_value, clip_value] and reports the
// global L2 norm of the logical gradients before clamping. REPLICA copies are clamped like
// their owners (equal gradients stay equal) and not counted in the norm.
#include <keel/keel.hpp>

#include <span>
#include <string>
#include <vector>

namespace {

const keel::Key<double> kClipValue{"clip_value", 0.01,
                                   "every gradient element is clamped to [-clip_value, clip_value]"};

class ValueClipper {
 public:
  static std::vector<keel::ConfigKey> config_keys() { return {kClipValue}; }

  ValueClipper(keel::Host host, keel::Config& config) : host_(host), clip_value_(config.get(kClipValue)) {
    if (!(clip_value_ > 0)) config.invalid("clip_value", "must be positive");
    host.info("value_clipper: clamping gradients to +-" + std::to_string(clip_value_));
  }

  at::Tensor clip(std::span<const keel::ParamView> params) {
    at::Tensor total_sq;
    for (const keel::ParamView& p : params) {
      at::Tensor grad = p.grad();
      if (!grad.defined()) continue;
      if (!p.replica()) {
        at::Tensor sq = grad.to(at::kFloat).square().sum();
        if (p.expert()) host_.all_reduce(host_.group(KEEL_GROUP_EP), sq);
        total_sq = total_sq.defined() ? total_sq + sq : sq;
      }
      grad.clamp_(-clip_value_, clip_value_);
    }
    if (!total_sq.defined()) total_sq = at::zeros({}, at::kFloat);
    host_.all_reduce(host_.group(KEEL_GROUP_PP), total_sq);
    return total_sq.sqrt();
  }

 private:
  keel::Host host_;
  double clip_value_;
};

}  // namespace

KEEL_PLUGIN("value_clipper", "0.1.0",
            keel::clipper_component<ValueClipper>("value_clipper", "Element-wise gradient value clipping",
                                                  KEEL_HOOK_CLIP_CAPTURE_SAFE))
