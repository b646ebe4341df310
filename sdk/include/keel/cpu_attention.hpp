// keel/cpu_attention.hpp — causal attention on CPU in blocks of query rows, O(seq) memory.
//
// LibTorch's fused CPU kernel runs its block products on MKL's sgemm (the AVX2 kernels on AMD's
// AVX-512 cores), needs one head size (MLA's 128-wide values padded to 192) and spends its
// backward in small tiles. keel::cpu_causal_attention cuts the queries into blocks of
// kCpuAttentionRows rows instead: a block's scores against the keys up to its last row are one
// [rows, keys] product on oneDNN (as keel::linear runs its products), small enough to stay in
// cache while each row's whole softmax is taken at once, and then multiply the values. It keeps
// only q, k and v: backward recomputes each block's scores and softmax, bitwise the forward's.
// Every head is one task of at::parallel_for with its products single-threaded: at 2048
// positions of DeepSeek-V3 debug's layer, all heads in each product with two threads took
// 0.64 s forward and backward, one head per task 0.58 s. Written here rather than taken from a
// library because none that LibTorch carries runs attention with value heads of another size
// on oneDNN.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <keel/linear.hpp>

#include <cstdint>
#include <limits>
#include <optional>

namespace keel {

/// Query rows per block of cpu_causal_attention: a block's [rows, keys] fp32 scores are 2 MiB
/// at 2048 keys, within a core's share of the last-level cache.
inline constexpr int64_t kCpuAttentionRows = 256;

namespace detail {

// x [m, k] times w [n, k] transposed (w any strided view), on oneDNN when `onednn`.
inline at::Tensor block_product(const at::Tensor& x, const at::Tensor& w, bool onednn) {
  return onednn ? onednn_product(x, w) : at::mm(x, w.t());
}

// True above the diagonal of a block of kCpuAttentionRows rows: the keys after each query row.
inline const at::Tensor& future_in_block() {
  static const at::Tensor mask =
      at::ones({kCpuAttentionRows, kCpuAttentionRows}, at::TensorOptions().dtype(at::kBool)).triu(1);
  return mask;
}

// The scores of query rows [first, first + n) of one head against keys [0, first + n), their
// later keys at -inf: [n, first + n]. `scaled_q` holds the n rows, already times the scale.
inline at::Tensor block_scores(const at::Tensor& scaled_q, const at::Tensor& key, int64_t first, bool onednn) {
  const int64_t n = scaled_q.size(0);
  at::Tensor scores = block_product(scaled_q, key.narrow(0, 0, first + n), onednn);
  scores.narrow(1, first, n)
      .masked_fill_(future_in_block().narrow(0, 0, n).narrow(1, 0, n), -std::numeric_limits<float>::infinity());
  return scores;
}

// The softmax of block_scores for query rows [first, first + n) of one head: forward's and
// backward's recomputation both call this, so the two are bitwise the same.
inline at::Tensor block_probs(const at::Tensor& scaled_q, const at::Tensor& key, int64_t first, bool onednn) {
  return at::_softmax(block_scores(scaled_q, key, first, onednn), 1, /*half_to_float=*/false);
}

struct CpuCausalAttention : public torch::autograd::Function<CpuCausalAttention> {
  // q [b, h, s, d_qk], k [b, h_kv, s, d_qk], v [b, h_kv, s, d_v], fp32 on CPU.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                            const at::Tensor& v_in, double scale) {
    const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
    const int64_t batch = q.size(0), heads = q.size(1), seq = q.size(2), group = heads / k.size(1);
    const bool onednn = onednn_linear_enabled();
    // Laid out [b, s, h, d_v]: the output projection reads it as [b, s, h d_v] without a copy.
    at::Tensor out = at::empty({batch, seq, heads, v.size(3)}, q.options()).transpose(1, 2);
    at::parallel_for(0, batch * heads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / heads, h = task % heads;
        const at::Tensor key = k[b][h / group], value = v[b][h / group];
        for (int64_t first = 0; first < seq; first += kCpuAttentionRows) {
          const int64_t n = std::min(kCpuAttentionRows, seq - first);
          const at::Tensor probs = block_probs(q[b][h].narrow(0, first, n).mul(scale), key, first, onednn);
          out[b][h].narrow(0, first, n).copy_(block_product(probs, value.narrow(0, 0, first + n).t(), onednn));
        }
      }
    });
    ctx->save_for_backward({q, k, v});
    ctx->saved_data["scale"] = scale;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2];
    const double scale = ctx->saved_data["scale"].toDouble();
    const at::Tensor grad_out = grads[0].contiguous();
    const int64_t batch = q.size(0), heads = q.size(1), seq = q.size(2), group = heads / k.size(1);
    const bool onednn = onednn_linear_enabled();
    // Per query head; heads sharing a key/value head sum theirs below, in head order.
    at::Tensor grad_q = at::empty_like(q), grad_k = at::empty({batch, heads, seq, k.size(3)}, k.options()),
               grad_v = at::empty({batch, heads, seq, v.size(3)}, v.options());
    at::parallel_for(0, batch * heads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / heads, h = task % heads;
        const at::Tensor key = k[b][h / group], value = v[b][h / group], dout = grad_out[b][h];
        // Transposed, so that each block adds its [d, keys] product into a prefix of columns.
        at::Tensor grad_key_t = at::zeros({k.size(3), seq}, k.options());
        at::Tensor grad_value_t = at::zeros({v.size(3), seq}, v.options());
        for (int64_t first = 0; first < seq; first += kCpuAttentionRows) {
          const int64_t n = std::min(kCpuAttentionRows, seq - first), keys = first + n;
          const at::Tensor scaled_q = q[b][h].narrow(0, first, n).mul(scale);
          const at::Tensor probs = block_probs(scaled_q, key, first, onednn);
          const at::Tensor dout_rows = dout.narrow(0, first, n);
          grad_value_t.narrow(1, 0, keys).add_(block_product(dout_rows.t().contiguous(), probs.t(), onednn));
          const at::Tensor grad_scores = at::_softmax_backward_data(
              block_product(dout_rows, value.narrow(0, 0, keys), onednn), probs, 1, at::kFloat);
          grad_q[b][h]
              .narrow(0, first, n)
              .copy_(block_product(grad_scores, key.narrow(0, 0, keys).t(), onednn).mul_(scale));
          grad_key_t.narrow(1, 0, keys).add_(block_product(scaled_q.t().contiguous(), grad_scores.t(), onednn));
        }
        grad_k[b][h].copy_(grad_key_t.t());
        grad_v[b][h].copy_(grad_value_t.t());
      }
    });
    if (group > 1) {
      grad_k = grad_k.view({batch, k.size(1), group, seq, k.size(3)}).sum(2);
      grad_v = grad_v.view({batch, v.size(1), group, seq, v.size(3)}).sum(2);
    }
    return {grad_q, grad_k, grad_v, at::Tensor()};
  }
};

}  // namespace detail

/// Whether cpu_causal_attention takes these operands: fp32 CPU tensors of one batch, outside
/// CPU autocast, every key/value head shared by the same number of query heads.
inline bool cpu_causal_attention_takes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return q.device().is_cpu() && q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
         v.scalar_type() == at::kFloat && q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.size(1) > 0 &&
         q.size(1) % k.size(1) == 0 && q.size(2) > 0 && !at::autocast::is_autocast_enabled(at::kCPU);
}

/// Causal attention softmax(q k^T scale + causal mask) v on CPU, in blocks of query rows (see
/// the file comment): q [b, h, s, d_qk], k [b, h_kv, s, d_qk], v [b, h_kv, s, d_v] gives
/// [b, h, s, d_v], differentiable in all three. Requires cpu_causal_attention_takes().
inline at::Tensor cpu_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  return detail::CpuCausalAttention::apply(q, k, v, scale);
}

}  // namespace keel
