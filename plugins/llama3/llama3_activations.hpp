// The activation memory of a Llama 3 part, for the host's memory plan: what one forward keeps
// until its backward, counted tensor by tensor from llama3_part.cpp.
#pragma once

#include <keel/keel.h>
#include <keel/recompute_mode.hpp>

#include <cstdint>

#include "llama3_args.hpp"

namespace llama3 {

/// Whether scaled-dot-product attention takes a fused kernel (it keeps its output and the
/// row log-sum-exp) rather than the math path (it keeps the [batch, heads, seq, seq]
/// probabilities) for this model on the device of `spec`; LibTorch decides, and is asked. A
/// CUDA part on a machine without a GPU is counted on the math path: the most it can keep.
bool fused_attention(const Args& args, const keel_part_spec& spec);

/// Bytes one forward of the part `spec` keeps for backward on a [batch, seq] microbatch under
/// `mode`: each tensor autograd saves, counted once per storage, and the part's output.
int64_t activation_bytes(const Args& args, const keel_part_spec& spec, int64_t batch, int64_t seq,
                         keel::Recompute mode);

}  // namespace llama3
