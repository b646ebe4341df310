// The recomputation modes a model may implement (ABI 1.6), apart from keel/recompute.hpp's
// helper, which pulls in LibTorch's autograd headers.
#pragma once

#include <keel/keel.h>

#include <cstdint>

namespace keel {

/// What a model recomputes in backward (training.recompute).
enum class Recompute : int32_t {
  none = KEEL_RECOMPUTE_NONE,            ///< keep every activation
  full = KEEL_RECOMPUTE_FULL,            ///< keep each transformer block's inputs only
  selective = KEEL_RECOMPUTE_SELECTIVE,  ///< keep matrix-product outputs, rerun attention and element-wise parts
};

/// The bit of `mode` in keel_model_recompute_extension.modes.
constexpr uint32_t recompute_bit(Recompute mode) { return 1u << static_cast<uint32_t>(mode); }

}  // namespace keel
