#include "llama3_activations.hpp"

#include <ATen/ATen.h>
#include <ATen/SDPBackend.h>
#include <keel/attention.hpp>

#include <algorithm>
#include <limits>

namespace llama3 {

namespace {

// The CPU generator state keel::recompute keeps per call to replay the random stream.
constexpr double kRecomputeCallBytes = 5056;
constexpr double kFloat = 4, kIndex = 8;

// Counted in doubles: seq^2 terms of hostile sizes overflow int64, and an estimate needs no
// more than double's precision; the result saturates.
class Counter {
 public:
  Counter(const Args& a, int64_t batch, int64_t seq, double element, keel::Recompute mode, bool fused, bool cpu)
      : a_(a),
        batch_(static_cast<double>(batch)),
        seq_(static_cast<double>(seq)),
        tokens_(batch_ * seq_),
        element_(element),
        mode_(mode),
        fused_(fused),
        keel_kernel_(cpu && element == kFloat && seq >= keel::kCpuFusedAttentionFrom) {}

  double tokens() const { return tokens_; }
  double hidden() const { return tokens_ * static_cast<double>(a_.dim) * element_; }

  // A block's input and everything the block keeps (its output is the next block's input).
  double block() const {
    if (mode_ == keel::Recompute::full) return hidden() + kRecomputeCallBytes;
    // Lean: x and h, and a rerun of each sub-layer.
    if (mode_ == keel::Recompute::lean) return 2 * hidden() + 2 * kRecomputeCallBytes;
    return hidden() + norm() + attention() + hidden() /* x + attention, the second norm's input */ + norm() +
           feed_forward();
  }

  // The head's norm and log-softmax's fp32 output, and the labels.
  double head() const { return norm() + tokens_ * static_cast<double>(a_.vocab_size) * kFloat + tokens_ * kIndex; }

 private:
  // RMSNorm keeps the input scaled by its inverse root mean square and that fp32 factor per
  // row; its output is kept by the projections that read it.
  double norm() const { return 2 * hidden() + tokens_ * kFloat; }

  // A fused kernel keeps its roped q and k, v, its output and (LibTorch's) the fp32 log-sum-exp
  // per row and head, which keel::cpu_causal_attention (fp32 on CPU) does without; the math path keeps q and k scaled,
  // k and v repeated to every query head, the probabilities and its output (the output projection's input). Selective
  // recomputation keeps q, k, v (the core's inputs) and the output.
  double attention() const {
    const double head_dim = static_cast<double>(a_.head_dim());
    const double q = tokens_ * static_cast<double>(a_.n_heads) * head_dim * element_;
    const double kv = tokens_ * static_cast<double>(a_.n_kv_heads) * head_dim * element_;
    if (mode_ == keel::Recompute::selective) return q + 2 * kv + q + kRecomputeCallBytes;
    if (fused_) return q + 2 * kv + q + (keel_kernel_ ? 0 : tokens_ * static_cast<double>(a_.n_heads) * kFloat);
    return 3 * q + batch_ * static_cast<double>(a_.n_heads) * seq_ * seq_ * element_ + q;
  }

  // SwiGLU: gate and up, silu(gate) and the product; or (selective) gate, up and the product.
  double feed_forward() const {
    const double width = tokens_ * static_cast<double>(a_.ffn_hidden) * element_;
    return mode_ == keel::Recompute::selective ? 3 * width + kRecomputeCallBytes : 4 * width;
  }

  const Args& a_;
  double batch_, seq_, tokens_, element_;
  keel::Recompute mode_;
  bool fused_;
  bool keel_kernel_;  // the core on keel::cpu_causal_attention
};

}  // namespace

bool fused_attention(const Args& args, const keel_part_spec& spec) {
  at::Device device(at::kCPU);
  if (spec.device_type == KEEL_DEVICE_CUDA) {
    if (!at::hasCUDA()) return false;
    device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(spec.device_index));
  }
  const at::ScalarType dtype = spec.compute_dtype == KEEL_DTYPE_BF16   ? at::kBFloat16
                               : spec.compute_dtype == KEEL_DTYPE_FP16 ? at::kHalf
                                                                       : at::kFloat;
  // The choice depends on the device, dtype, head counts and head size, not on batch or
  // sequence length.
  const at::SDPBackend backend = keel::causal_attention_backend(
      at::TensorOptions().dtype(dtype).device(device), args.n_heads, args.n_kv_heads, args.head_dim(), args.head_dim());
  return backend != at::SDPBackend::math;
}

int64_t activation_bytes(const Args& args, const keel_part_spec& spec, int64_t batch, int64_t seq,
                         keel::Recompute mode) {
  const double element = spec.compute_dtype == KEEL_DTYPE_FP32 ? 4 : 2;
  const Counter count(args, batch, seq, element, mode, fused_attention(args, spec),
                      spec.device_type != KEEL_DEVICE_CUDA);
  const bool first = spec.stage_index == 0, last = spec.stage_index == spec.num_stages - 1;
  double bytes = count.hidden();                // the part's output, kept for its backward
  if (first) bytes += count.tokens() * kIndex;  // the embedding's indices
  bytes += static_cast<double>(spec.num_layers) * count.block();
  if (last) bytes += count.head();
  constexpr double most = static_cast<double>(std::numeric_limits<int64_t>::max());
  return bytes >= most ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(bytes);
}

}  // namespace llama3
