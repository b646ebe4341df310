// keel/attention.hpp — causal self-attention on LibTorch's fused kernels, O(seq) memory.
//
// A materialised attention keeps its [batch, heads, seq, seq] probabilities for backward: 1 GiB
// of fp32 per layer and sample at 4096 positions and 16 heads. LibTorch's fused kernels
// (`at::scaled_dot_product_attention` without a mask) keep only their operands, output and one
// log-sum-exp per row and head, skip the key blocks above the diagonal, and recompute the
// probabilities block by block in backward. keel::causal_attention runs them for query/key and
// value heads of different sizes (MLA: 192 against 128): LibTorch's CPU kernel needs one head
// size, so there the smaller heads (the values) are zero-padded and the output sliced back (the
// padded columns of the output are zeros and take no gradient: the result is the unpadded
// attention's, in the order of the kernel's own sums); on CUDA the memory-efficient and cuDNN
// kernels take both sizes as they are (flash does not, so LibTorch passes it over).
//
// On CPU in fp32, causal_attention runs keel::cpu_causal_attention instead (keel/
// cpu_attention.hpp): blocks of query rows on oneDNN, without the padding, in 0.8 x the time of
// LibTorch's kernel at 1024 and 2048 positions. Below several hundred positions a materialised product is
// faster still on CPU (its scores then stay in cache, and the blocks' per-call work costs more
// than it saves): a model keeps its own materialised path there and asks fused_attention_pays()
// which one to take.
#pragma once

#include <ATen/ATen.h>
#include <ATen/SDPBackend.h>
#include <keel/cpu_attention.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

namespace keel {

/// From this many positions fp32 CPU attention runs fused (keel::cpu_causal_attention).
/// Measured with keel-bench-attention on DeepSeek-V3 debug's layer (16 heads, query/key heads
/// 192, value heads 128; forward and backward; 2 threads of an AMD EPYC, Zen 4, AVX-512,
/// 32 MiB L3; medians of 3 alternating rounds): blocked / materialised time 2.42 at 8 x 64,
/// 4.27 at 1 x 64, 1.49 at 1 x 256, 1.14 at 1 x 384, 1.26 at 1 x 512, 1.00 at 1 x 640, 0.67 at
/// 1 x 768, 0.43 at 1 x 1024, 0.32 at 1 x 2048. The materialised product wins while its
/// [h, s, s] scores stay in the last-level cache; a CPU with a smaller cache crosses over earlier.
inline constexpr int64_t kCpuFusedAttentionFrom = 640;

/// Whether attention over `seq` positions on `device` should take the fused kernel: always
/// on CUDA, from kCpuFusedAttentionFrom positions on CPU.
inline bool fused_attention_pays(const at::Device& device, int64_t seq) {
  return !device.is_cpu() || seq >= kCpuFusedAttentionFrom;
}

/// The backend at::scaled_dot_product_attention picks for causal attention of `heads` query
/// heads of `qk_dim` over `kv_heads` key/value heads (value heads of `v_dim`) on `options`,
/// as causal_attention calls it (padded on CPU). Independent of batch and length.
inline at::SDPBackend causal_attention_backend(const at::TensorOptions& options, int64_t heads, int64_t kv_heads,
                                               int64_t qk_dim, int64_t v_dim) {
  const bool cpu = options.device().is_cpu();
  const int64_t key_dim = cpu ? std::max(qk_dim, v_dim) : qk_dim, value_dim = cpu ? key_dim : v_dim;
  const at::Tensor q = at::zeros({1, heads, 2, key_dim}, options);
  const at::Tensor k = at::zeros({1, kv_heads, 2, key_dim}, options);
  const at::Tensor v = at::zeros({1, kv_heads, 2, value_dim}, options);
  return static_cast<at::SDPBackend>(at::_fused_sdp_choice(q, k, v, /*attn_mask=*/std::nullopt, /*dropout_p=*/0.0,
                                                           /*is_causal=*/true, /*scale=*/std::nullopt,
                                                           /*enable_gqa=*/kv_heads != heads));
}

/// A backend's name as LibTorch's docs give it ("flash", "efficient", "cudnn", "math", ...).
inline const char* attention_backend_name(at::SDPBackend backend) {
  switch (backend) {
    case at::SDPBackend::math:
      return "math";
    case at::SDPBackend::flash_attention:
      return "flash";
    case at::SDPBackend::efficient_attention:
      return "efficient";
    case at::SDPBackend::cudnn_attention:
      return "cudnn";
    case at::SDPBackend::overrideable:
      return "overrideable";
    default:
      return "none";
  }
}

namespace detail {

// at::scaled_dot_product_attention with the smaller heads zero-padded on CPU, whose fused
// kernel needs one head size (zero columns change no dot product and no weighted sum).
inline at::Tensor fused_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const std::optional<at::Tensor>& mask, std::optional<double> scale) {
  const int64_t qk_dim = q.size(-1), v_dim = v.size(-1);
  const bool gqa = k.size(1) != q.size(1), causal = !mask.has_value();
  if (!q.device().is_cpu() || qk_dim == v_dim)
    return at::scaled_dot_product_attention(q, k, v, mask, /*dropout_p=*/0.0, causal, scale, gqa);
  const int64_t dim = std::max(qk_dim, v_dim);
  auto pad = [dim](const at::Tensor& t) {
    return t.size(-1) == dim ? t : at::constant_pad_nd(t, {0, dim - t.size(-1)});
  };
  if (!scale) scale = 1.0 / std::sqrt(static_cast<double>(qk_dim));  // of the unpadded heads
  return at::scaled_dot_product_attention(pad(q), pad(k), pad(v), mask, /*dropout_p=*/0.0, causal, scale, gqa)
      .narrow(-1, 0, v_dim);
}

}  // namespace detail

/// Causal attention, softmax(q k^T scale + causal mask) v: q [b, h, s, d_qk], k [b, h_kv, s,
/// d_qk], v [b, h_kv, s, d_v] (h a multiple of h_kv) gives [b, h, s, d_v], O(s) memory: on
/// keel::cpu_causal_attention where it takes the operands (fp32 CPU) from kCpuFusedAttentionFrom
/// positions, else on LibTorch's fused kernels (see the file comment for head sizes that
/// differ). `scale` defaults to d_qk^-1/2.
inline at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   std::optional<double> scale = std::nullopt) {
  // Below the crossover LibTorch's kernel is at least as fast (keel-bench-attention).
  if (cpu_causal_attention_takes(q, k, v) && q.size(2) >= kCpuFusedAttentionFrom)
    return cpu_causal_attention(q, k, v, scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1)))));
  return detail::fused_sdpa(q, k, v, std::nullopt, scale);
}

/// Documents shorter than this are packed together into runs of at most this many positions
/// for block_causal_attention; longer ones run alone. A packed run computes every pair of its
/// positions and masks those of different documents, so the bound caps that waste (and its
/// mask at 64 KiB) while keeping the calls per microbatch at about seq / 256 for short texts.
inline constexpr int64_t kPackedRunPositions = 256;

/// How block_causal_attention cuts a microbatch: consecutive runs of whole documents over its
/// batch x seq positions in order, each run one kernel call.
struct DocumentRuns {
  std::vector<int64_t> lengths;   ///< positions of each run; they sum to batch x seq
  std::vector<at::Tensor> masks;  ///< per run: undefined for one document (causal), else the
                                  ///< [len, len] bool mask, true where a position may attend
};

/// The runs of `documents` ([batch, seq] int64, the document of each position as
/// keel_forward_inputs gives it): a document of kPackedRunPositions positions or more runs
/// alone, shorter neighbours of one sample pack into runs of up to that many. Reads the
/// tensor on the host once; the masks are built on its device.
inline DocumentRuns document_runs(const at::Tensor& documents) {
  const at::Tensor ids = documents.to(at::kCPU, at::kLong).contiguous();
  const int64_t batch = ids.size(0), seq = ids.size(1);
  const int64_t* id = ids.data_ptr<int64_t>();
  DocumentRuns out;
  auto close = [&](int64_t begin, int64_t end, int64_t docs) {
    if (end == begin) return;
    out.lengths.push_back(end - begin);
    if (docs <= 1) {
      out.masks.emplace_back();
      return;
    }
    const at::Tensor run = ids.flatten().slice(0, begin, end).to(documents.device());
    const at::Tensor causal = at::ones({end - begin, end - begin}, run.options().dtype(at::kBool)).tril();
    out.masks.push_back(run.unsqueeze(1).eq(run.unsqueeze(0)).logical_and(causal));
  };
  for (int64_t sample = 0; sample < batch; ++sample) {
    const int64_t base = sample * seq;
    int64_t run_begin = base, run_docs = 0, doc_begin = base;
    for (int64_t t = base; t <= base + seq; ++t) {
      if (t < base + seq && (t == doc_begin || id[t] == id[t - 1])) continue;
      // A document [doc_begin, t) ends here.
      const int64_t length = t - doc_begin;
      if (length >= kPackedRunPositions) {
        close(run_begin, doc_begin, run_docs);
        close(doc_begin, t, 1);
        run_begin = t;
        run_docs = 0;
      } else {
        if (t - run_begin > kPackedRunPositions) {
          close(run_begin, doc_begin, run_docs);
          run_begin = doc_begin;
          run_docs = 0;
        }
        ++run_docs;
      }
      doc_begin = t;
    }
    close(run_begin, base + seq, run_docs);
  }
  return out;
}

/// Block-causal attention: as causal_attention, each position attending only to the earlier
/// positions of its own document, over the runs document_runs() cut. Memory stays O(seq):
/// every run is one fused call, a packed run's mask at most kPackedRunPositions squared.
inline at::Tensor block_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const DocumentRuns& runs, std::optional<double> scale = std::nullopt) {
  const int64_t batch = q.size(0), seq = q.size(2), heads = q.size(1);
  // [b, h, s, d] -> positions in order, [b s, h, d]: one split (its backward one cat) cuts all runs.
  auto by_position = [](const at::Tensor& t) { return t.transpose(1, 2).reshape({-1, t.size(1), t.size(3)}); };
  const std::vector<at::Tensor> qs = by_position(q).split_with_sizes(runs.lengths),
                                ks = by_position(k).split_with_sizes(runs.lengths),
                                vs = by_position(v).split_with_sizes(runs.lengths);
  auto as_heads = [](const at::Tensor& t) { return t.transpose(0, 1).unsqueeze(0); };  // [1, h, len, d]
  std::vector<at::Tensor> outs;
  outs.reserve(qs.size());
  for (size_t i = 0; i < qs.size(); ++i) {
    const at::Tensor& mask = runs.masks[i];
    at::Tensor out = mask.defined() ? detail::fused_sdpa(as_heads(qs[i]), as_heads(ks[i]), as_heads(vs[i]), mask, scale)
                                    : causal_attention(as_heads(qs[i]), as_heads(ks[i]), as_heads(vs[i]), scale);
    outs.push_back(out.squeeze(0).transpose(0, 1));
  }
  return at::cat(outs).view({batch, seq, heads, v.size(-1)}).transpose(1, 2);
}

}  // namespace keel
