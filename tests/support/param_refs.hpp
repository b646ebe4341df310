// Host parameter records for unit tests, built as the host builds them from a model's entry.
#pragma once

#include <ATen/ATen.h>

#include <keel/keel.h>

#include <string>

#include "plugins/components.hpp"

namespace keel::test {

/// The host's record of `tensor` declared under `fqn` with `flags` (whole, not sharded).
inline ParamRef param_ref(const std::string& fqn, at::Tensor& tensor, uint32_t flags = 0) {
  keel_param_info entry{
      sizeof(keel_param_info), fqn.c_str(), reinterpret_cast<keel_tensor*>(&tensor), flags, -1, 0, 0, 1.0, nullptr};
  return ParamRef(entry);
}

}  // namespace keel::test
