// Decoupled rotary embedding of MLA's rope dims with YaRN scaling, as the DeepSeek-V3
// reference and Hugging Face compute it: corrected inverse frequencies, an attention factor on
// cos/sin, and mscale applied to the softmax scale.
#pragma once

#include <ATen/ATen.h>

#include "args.hpp"

namespace deepseek_v3 {

/// cos and sin of every (position, pair), [seq, rope_dim / 2] on `options`' device, or
/// [batch, seq, rope_dim / 2] where each sample has positions of its own.
struct RopeTables {
  at::Tensor cos, sin;
};

/// YaRN-corrected inverse frequencies, [rope_dim / 2] fp32 on CPU.
at::Tensor inverse_frequencies(const Args& args);
/// The factor cos/sin are multiplied by (1 unless mscale differs from mscale_all_dim).
double attention_factor(const Args& args);
/// The softmax scale: qk_head_dim^-1/2, times mscale(factor, mscale_all_dim)^2 under YaRN.
double softmax_scale(const Args& args);
/// The tables for positions 0 .. seq-1.
RopeTables rope_tables(const Args& args, int64_t seq, const at::TensorOptions& options);
/// The rows of `tables` ([seq, rope_dim / 2]) at `positions` ([batch, seq] int64).
RopeTables at_positions(const RopeTables& tables, const at::Tensor& positions);
/// Rotates interleaved pairs (x[2i], x[2i+1]) of x's last dim; x is [batch, seq, heads, rope_dim].
at::Tensor apply_rope(const at::Tensor& x, const RopeTables& tables);

}  // namespace deepseek_v3
