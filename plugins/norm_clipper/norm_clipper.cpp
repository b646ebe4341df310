// norm_clipper: the default gradient clipper. The total norm counts every logical parameter
// once (REPLICA copies excluded): the expert part is summed over ep, the whole over pp (dense
// gradients are identical across dp after the reduction). Every gradient, replicas included,
// is scaled by the same device-tensor coefficient min(1, max_norm / (total + 1e-6)). With no
// replicas this is torch.nn.utils.clip_grad_norm_. No host synchronisation: capture-safe.
// With reduce-scattered gradients (bind_gradient_shards) each rank holds reduced only the rows
// its optimizer steps, and no row is any other rank's: the norm is the sum over the world of
// every rank's owned non-REPLICA rows (each element counted once across dp, edp, ep and pp),
// and only owned rows are scaled.
// State (checkpointed under the clipper's name): how many steps it clipped and saw, device
// counters updated without a host read (on a step the host skips, the host puts them back).
#include <keel/keel.hpp>

#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

const keel::Key<double> kMaxNorm{"max_norm", 1.0, "the largest total gradient norm; larger ones are scaled down to it"};
const keel::Key<std::string> kNormType{"norm_type", "2", "\"2\" (L2 norm) or \"inf\" (largest absolute value)"};

class NormClipper {
 public:
  static std::vector<keel::ConfigKey> config_keys() { return {kMaxNorm, kNormType}; }

  NormClipper(keel::Host host, keel::Config& config) : host_(host), max_norm_(config.get(kMaxNorm)) {
    if (!(max_norm_ > 0) || !std::isfinite(max_norm_)) config.invalid("max_norm", "must be a positive number");
    std::string norm_type = config.get(kNormType);
    if (norm_type != "2" && norm_type != "inf")
      config.invalid("norm_type", "must be \"2\" or \"inf\", got \"" + norm_type + "\"");
    inf_ = norm_type == "inf";
  }

  // Sorts the parameters once into static lists, so clip() does no per-step classification.
  void bind(std::span<const keel::ParamView> params) {
    dense_.clear();
    expert_.clear();
    all_.clear();
    for (const keel::ParamView& p : params) {
      all_.push_back(&p.tensor());
      if (!p.replica()) (p.expert() ? expert_ : dense_).push_back(&p.tensor());
    }
    if (!params.empty()) device_ = params.front().tensor().device();
    steps_ = steps_.to(device_);
    clipped_steps_ = clipped_steps_.to(device_);
  }

  // From now on only these rows are clipped (the host reduce-scatters gradients).
  void bind_gradient_shards(std::span<const keel::GradientShard> shards) {
    sharded_ = true;
    owned_.clear();
    owned_counted_.clear();
    for (const keel::GradientShard& shard : shards) {
      owned_.push_back(*shard.rows);
      if (!shard.param.replica()) owned_counted_.push_back(*shard.rows);
    }
  }

  keel::StateList state() { return {{"steps", &steps_}, {"clipped_steps", &clipped_steps_}}; }

  at::Tensor clip(std::span<const keel::ParamView>) {
    const keel_reduce_op op = inf_ ? KEEL_REDUCE_MAX : KEEL_REDUCE_SUM;
    if (sharded_) {
      at::Tensor total = partial(owned_counted_);
      host_.all_reduce(host_.group(KEEL_GROUP_WORLD), total, op);
      if (!inf_) total = total.sqrt();
      scale(total, owned_);
      return total;
    }
    at::Tensor dense = partial(grads_of(dense_));
    at::Tensor expert = partial(grads_of(expert_));
    host_.all_reduce(host_.group(KEEL_GROUP_EP), expert, op);
    at::Tensor total = inf_ ? at::maximum(dense, expert) : dense + expert;  // a sum of squares for L2
    host_.all_reduce(host_.group(KEEL_GROUP_PP), total, op);
    if (!inf_) total = total.sqrt();
    scale(total, grads_of(all_));
    return total;
  }

 private:
  static std::vector<at::Tensor> grads_of(const std::vector<at::Tensor*>& params) {
    std::vector<at::Tensor> grads;
    grads.reserve(params.size());
    for (at::Tensor* p : params)
      if (p->grad().defined()) grads.push_back(p->grad());
    return grads;
  }

  // Sum of squares (or max of abs) of `grads`, in fp32; a zero on the parameters' device when
  // there are none.
  at::Tensor partial(const std::vector<at::Tensor>& grads) const {
    if (grads.empty()) return at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device_));
    at::Tensor stacked =
        at::stack(inf_ && device_.is_cpu() ? max_abs_cpu(grads) : at::_foreach_norm(grads, inf_ ? kInf : 2.0))
            .to(at::kFloat);
    if (!inf_) return stacked.square().sum();
    // A MAX all-reduce may keep a finite value over a NaN (Gloo does): a NaN goes in as +inf,
    // which every maximum keeps, so the total is non-finite on every rank.
    return at::nan_to_num(stacked.max(), kInf, kInf, -kInf);
  }

  // max |g| of each gradient, exact and NaN-propagating like _foreach_norm(grads, inf), which
  // has no vectorised path on CPU: with aminmax the step program of debug takes 37-38 ms
  // instead of 84-89 ms (keel-bench-step, norm_type "inf"), about what the L2 norm takes.
  static std::vector<at::Tensor> max_abs_cpu(const std::vector<at::Tensor>& grads) {
    std::vector<at::Tensor> out;
    for (const at::Tensor& g : grads) {
      if (g.numel() == 0) {  // aminmax refuses an empty tensor; its norm is 0
        out.push_back(at::zeros({}, g.options()));
        continue;
      }
      auto [low, high] = at::aminmax(g);
      out.push_back(at::maximum(high, low.neg()));
    }
    return out;
  }

  void scale(const at::Tensor& total, std::vector<at::Tensor> grads) {
    at::Tensor coef = (max_norm_ / (total + 1e-6)).clamp_max(1.0);
    steps_.add_(1.0);
    clipped_steps_.add_(coef.lt(1.0).to(at::kFloat));
    if (!grads.empty()) at::_foreach_mul_(grads, coef);
  }

  keel::Host host_;
  double max_norm_;
  bool inf_ = false;
  at::Device device_{at::kCPU};
  std::vector<at::Tensor*> dense_, expert_, all_;
  bool sharded_ = false;
  std::vector<at::Tensor> owned_, owned_counted_;  ///< owned rows; those of non-REPLICA parameters
  at::Tensor steps_ = at::zeros({}, at::kFloat), clipped_steps_ = at::zeros({}, at::kFloat);
};

}  // namespace

KEEL_PLUGIN("norm_clipper", "1.2.1",
            keel::clipper_component<NormClipper>(
                "norm_clipper",
                "Global-norm gradient clipping over logical parameters "
                "(REPLICA-aware, expert part over ep, all over pp; clips reduce-scattered rows)",
                KEEL_HOOK_CLIP_CAPTURE_SAFE))
