// Clippers that fail on purpose, written with the C++ helpers: one reports an error from
// create, one throws from create, one raises a LibTorch error from clip at run time.
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

}  // namespace

KEEL_PLUGIN("faulty", "0.0.1", keel::clipper_component<ReturnsError>("returns_error", "create reports an error"),
            keel::clipper_component<Throws>("throws", "create throws std::out_of_range"),
            keel::clipper_component<ThrowsInClip>("throws_in_clip", "clip raises a c10::Error"))
