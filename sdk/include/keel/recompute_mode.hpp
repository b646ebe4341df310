// The recomputation modes a model may implement (ABI 1.6), apart from keel/recompute.hpp's
// helper, which pulls in LibTorch's autograd headers.
#pragma once

#include <keel/keel.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace keel {

/// What a model recomputes in backward (training.recompute).
enum class Recompute : int32_t {
  none = KEEL_RECOMPUTE_NONE,            ///< keep every activation
  full = KEEL_RECOMPUTE_FULL,            ///< keep each transformer block's inputs only
  selective = KEEL_RECOMPUTE_SELECTIVE,  ///< keep matrix-product outputs, rerun attention and element-wise parts
  lean = KEEL_RECOMPUTE_LEAN,            ///< keep block inputs and the stream between sub-layers, rerun each
};

/// The bit of `mode` in keel_model_recompute_extension.modes.
constexpr uint32_t recompute_bit(Recompute mode) { return 1u << static_cast<uint32_t>(mode); }

/// A mode and its name in training.recompute.
struct RecomputeName {
  Recompute mode;
  std::string_view name;
};

/// Every mode by name, from what keeps the most to what keeps the least.
inline constexpr std::array<RecomputeName, 4> kRecomputeNames = {{{Recompute::none, "none"},
                                                                  {Recompute::selective, "selective"},
                                                                  {Recompute::lean, "lean"},
                                                                  {Recompute::full, "full"}}};

/// The mode named `name`, or nullopt for a name no mode has.
constexpr std::optional<Recompute> recompute_named(std::string_view name) {
  for (const RecomputeName& n : kRecomputeNames)
    if (n.name == name) return n.mode;
  return std::nullopt;
}

/// The name of `mode` in training.recompute ("?" for a number no mode has).
constexpr std::string_view recompute_name(Recompute mode) {
  for (const RecomputeName& n : kRecomputeNames)
    if (n.mode == mode) return n.name;
  return "?";
}

}  // namespace keel
