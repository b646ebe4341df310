// Clippers that fail on purpose, written with the C++ helpers: one reports an error from
// create, one throws from create, one raises a LibTorch error from clip at run time; and one
// that works but reads the device on the host, so it does not declare clip() capture-safe.
#include <keel/keel.hpp>

#include <memory>
#include <stdexcept>

namespace {

class ReturnsError {
 public:
  static std::unique_ptr<ReturnsError> create(keel::Host, keel::Config&) {
    throw keel::Error(KEEL_ERROR_RUNTIME, "returns_error: refusing to start (test)");
  }
  keel::Host host() const { return keel::Host(nullptr); }
  at::Tensor clip(const keel_param_info* const*, size_t) { return {}; }
};

class Throws {
 public:
  static std::unique_ptr<Throws> create(keel::Host, keel::Config&) {
    throw std::out_of_range("vector index 7 >= 3 (test)");
  }
  keel::Host host() const { return keel::Host(nullptr); }
  at::Tensor clip(const keel_param_info* const*, size_t) { return {}; }
};

class ThrowsInClip {
 public:
  static std::unique_ptr<ThrowsInClip> create(keel::Host host, keel::Config&) {
    return std::unique_ptr<ThrowsInClip>(new ThrowsInClip(host));
  }
  keel::Host host() const { return host_; }
  at::Tensor clip(const keel_param_info* const*, size_t) {
    // A real LibTorch error: shapes that cannot be multiplied.
    return at::matmul(at::ones({2, 3}), at::ones({2, 3}));
  }

 private:
  explicit ThrowsInClip(keel::Host host) : host_(host) {}
  keel::Host host_;
};

// Clips every gradient by the norm computed on the host (a .item() per step; single-rank jobs
// only): correct, but not capture-safe, and it says so by leaving KEEL_HOOK_CLIP_CAPTURE_SAFE out.
class HostSyncClipper {
 public:
  static std::unique_ptr<HostSyncClipper> create(keel::Host host, keel::Config& config) {
    return std::unique_ptr<HostSyncClipper>(new HostSyncClipper(host, config.real("max_norm", 1.0)));
  }
  keel::Host host() const { return host_; }
  at::Tensor clip(const keel_param_info* const* params, size_t count) {
    at::Tensor total = at::zeros({}, at::kFloat);
    for (size_t i = 0; i < count; ++i) {
      const keel_param_info& p = keel::param(params[i]);
      at::Tensor g = keel::tensor(p.tensor).grad();
      if (g.defined() && (p.flags & KEEL_PARAM_REPLICA) == 0)
        total = total.to(g.device()) + g.to(at::kFloat).square().sum();
    }
    const double norm = total.sqrt().item<double>();
    if (norm > max_norm_)
      for (size_t i = 0; i < count; ++i) {
        at::Tensor g = keel::tensor(keel::param(params[i]).tensor).grad();
        if (g.defined()) g.mul_(max_norm_ / (norm + 1e-6));
      }
    return total.sqrt();
  }

 private:
  HostSyncClipper(keel::Host host, double max_norm) : host_(host), max_norm_(max_norm) {}
  keel::Host host_;
  double max_norm_;
};

}  // namespace

KEEL_PLUGIN("faulty", "0.0.1", keel::clipper_component<ReturnsError>("returns_error", "create reports an error"),
            keel::clipper_component<Throws>("throws", "create throws std::out_of_range"),
            keel::clipper_component<ThrowsInClip>("throws_in_clip", "clip raises a c10::Error"),
            keel::clipper_component<HostSyncClipper>("host_sync", "norm clipping with a host read: not capture-safe"))
