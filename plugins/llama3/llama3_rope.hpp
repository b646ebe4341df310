// Llama's rotary frequencies: plain RoPE (Llama 3) or Llama 3.1+'s scaled frequencies.
#pragma once

#include <ATen/ATen.h>

#include "llama3_args.hpp"

namespace llama3 {

/// The head_dim / 2 inverse frequencies of the rotary embedding, fp32 on `options`' device:
/// theta^(-2i / head_dim), then, for rope_scaling "llama3", scaled as transformers'
/// _compute_llama3_parameters does (same fp32 operations, so the same angles).
at::Tensor rope_frequencies(const Args& args, const at::TensorOptions& options);

}  // namespace llama3
