// Mixed precision by LibTorch's autocast: inside a scope, matrix products and attention run
// in the compute dtype (bf16) while parameters stay fp32 master weights; autograd casts the
// gradients back, so gradients, their reduction and the optimizer stay fp32.
#pragma once

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

namespace keel {

/// Enables autocast to `dtype` on `device`'s type for its lifetime (a no-op for fp32).
class AutocastScope {
 public:
  AutocastScope(const at::Device& device, at::ScalarType dtype)
      : type_(device.type()), active_(dtype != at::kFloat && !device.is_meta()) {
    if (!active_) return;
    previous_enabled_ = at::autocast::is_autocast_enabled(type_);
    previous_dtype_ = at::autocast::get_autocast_dtype(type_);
    at::autocast::set_autocast_enabled(type_, true);
    at::autocast::set_autocast_dtype(type_, dtype);
    at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (!active_) return;
    // Cached casts of the weights are dropped when the outermost scope closes (they would go
    // stale after the optimizer step).
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(type_, previous_enabled_);
    at::autocast::set_autocast_dtype(type_, previous_dtype_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  at::DeviceType type_;
  bool active_;
  bool previous_enabled_ = false;
  at::ScalarType previous_dtype_ = at::kFloat;
};

/// Keeps autocast's cache of cast weights from one AutocastScope to the next for its lifetime
/// (one training step, `active` when the step computes below fp32): each weight is cast once a
/// step and every microbatch's graph shares that copy, where a scope per forward would have each
/// microbatch in flight keep its own. Autocast stays off between the scopes, so backward runs as
/// without it. The weights must not change while it lives (the optimizer steps after it).
class AutocastCache {
 public:
  explicit AutocastCache(bool active) : active_(active) {
    if (active_) at::autocast::increment_nesting();
  }
  ~AutocastCache() {
    if (active_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  }
  AutocastCache(const AutocastCache&) = delete;
  AutocastCache& operator=(const AutocastCache&) = delete;

 private:
  bool active_;
};

}  // namespace keel
