// The activation memory of a DeepSeek-V3 part, for the host's memory plan: what one forward
// keeps until its backward, counted tensor by tensor from modules.cpp and part.cpp.
#pragma once

#include <keel/keel.h>
#include <keel/recompute_mode.hpp>

#include <cstdint>

#include "args.hpp"

namespace deepseek_v3 {

/// Bytes one forward of the part `spec` keeps for backward on a [batch, seq] microbatch under
/// `mode`, with the routed experts spread over `ep` ranks: each tensor autograd saves, counted
/// once per storage, and the part's output. An estimate only where routing decides sizes: each
/// expert's rows are padded to the busiest expert's, taken as the mean plus the spread of a
/// maximum of Poisson loads (rounded up to kOneDnnExpertSlots where the experts run apart on
/// oneDNN: fp32 on CPU, with LibTorch's oneDNN switch as it is when called).
int64_t activation_bytes(const Args& args, const keel_part_spec& spec, int64_t batch, int64_t seq, keel::Recompute mode,
                         int64_t ep);

}  // namespace deepseek_v3
