// Clippers that fail on purpose, written with the C++ helpers: one reports an error from
// create, one throws from create, one raises a LibTorch error from clip at run time, one reads
// a config key it does not declare; and one that works but reads the device on the host, so
// it does not declare clip() capture-safe.
#include <keel/keel.hpp>

#include <memory>
#include <span>
#include <stdexcept>
#include <vector>

namespace {

class ReturnsError {
 public:
  static std::unique_ptr<ReturnsError> create(keel::Host, keel::Config&) {
    throw keel::Error(KEEL_ERROR_RUNTIME, "returns_error: refusing to start (test)");
  }
  at::Tensor clip(std::span<const keel::ParamView>) { return {}; }
};

class Throws {
 public:
  static std::unique_ptr<Throws> create(keel::Host, keel::Config&) {
    throw std::out_of_range("vector index 7 >= 3 (test)");
  }
  at::Tensor clip(std::span<const keel::ParamView>) { return {}; }
};

class ThrowsInClip {
 public:
  static std::unique_ptr<ThrowsInClip> create(keel::Host host, keel::Config&) {
    return std::unique_ptr<ThrowsInClip>(new ThrowsInClip(host));
  }
  at::Tensor clip(std::span<const keel::ParamView>) {
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
  HostSyncClipper(keel::Host, keel::Config& config) : max_norm_(config.real("max_norm", 1.0)) {}
  at::Tensor clip(std::span<const keel::ParamView> params) {
    at::Tensor total = at::zeros({}, at::kFloat);
    for (const keel::ParamView& p : params)
      if (p.grad().defined() && !p.replica())
        total = total.to(p.grad().device()) + p.grad().to(at::kFloat).square().sum();
    const double norm = total.sqrt().item<double>();
    if (norm > max_norm_)
      for (const keel::ParamView& p : params)
        if (p.grad().defined()) p.grad().mul_(max_norm_ / (norm + 1e-6));
    return total.sqrt();
  }

 private:
  double max_norm_;
};

}  // namespace

// Declares `limit` but reads `limt` too: the host refuses the undeclared read.
class ReadsUndeclared {
 public:
  static std::vector<keel::ConfigKey> config_keys() { return {keel::Key<double>{"limit", 1.0, "declared"}}; }
  ReadsUndeclared(keel::Host, keel::Config& config) { config.real("limt", 1.0); }
  at::Tensor clip(std::span<const keel::ParamView>) { return {}; }
};

// Reads `limt` without declaring it and swallows the failed status: the host must not pass it.
class SwallowsUndeclared {
 public:
  static std::vector<keel::ConfigKey> config_keys() { return {keel::Key<double>{"limit", 1.0, "declared"}}; }
  SwallowsUndeclared(keel::Host, keel::Config& config) {
    try {
      config.real("limt", 1.0);
    } catch (const keel::HostReported&) {
    }
  }
  at::Tensor clip(std::span<const keel::ParamView>) { return {}; }
};

KEEL_PLUGIN("faulty", "0.0.1", keel::clipper_component<ReturnsError>("returns_error", "create reports an error"),
            keel::clipper_component<Throws>("throws", "create throws std::out_of_range"),
            keel::clipper_component<ThrowsInClip>("throws_in_clip", "clip raises a c10::Error"),
            keel::clipper_component<HostSyncClipper>("host_sync", "norm clipping with a host read: not capture-safe"),
            keel::clipper_component<ReadsUndeclared>("reads_undeclared", "reads a config key it does not declare"),
            keel::clipper_component<SwallowsUndeclared>("swallows_undeclared",
                                                        "reads an undeclared key and ignores the failure"))
