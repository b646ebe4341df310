#include "activations.hpp"

#include <keel/linear.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

#include "modules.hpp"

namespace deepseek_v3 {

namespace {

// The CPU generator state keel::recompute keeps per call to replay the random stream.
constexpr double kRecomputeCallBytes = 5056;
constexpr double kFloat = 4, kIndex = 8;

// Counted in doubles: seq^2 terms of hostile sizes overflow int64, and an estimate needs no
// more than double's precision; the result saturates.
class Counter {
 public:
  Counter(const Args& a, int64_t batch, int64_t seq, double element, keel::Recompute mode, int64_t ep,
          bool experts_apart, bool fused, bool cpu)
      : a_(a),
        batch_(static_cast<double>(batch)),
        seq_(static_cast<double>(seq)),
        tokens_(batch_ * seq_),
        element_(element),
        cast_(element < kFloat),
        mode_(mode),
        ep_(static_cast<double>(ep)),
        experts_apart_(experts_apart),
        fused_(fused),
        cpu_(cpu) {}

  double tokens() const { return tokens_; }
  /// A [tokens, dim] tensor of the residual stream: fp32 whatever the compute dtype (autocast
  /// runs element-wise ops on fp32 inputs in fp32, and the parameters are fp32).
  double stream() const { return tokens_ * static_cast<double>(a_.dim) * kFloat; }

  // A block's input and everything the block keeps (its output is the next block's input).
  double block(int64_t layer) const {
    if (mode_ == keel::Recompute::full) return stream() + kRecomputeCallBytes;
    const bool moe = a_.is_moe(layer);
    double bytes = stream() /* x */ + stream() /* h */;
    if (mode_ == keel::Recompute::lean) {
      // Each sub-layer reruns from its input, but an MoE keeps its norm and the normed input
      // of its rerun router and shared experts.
      bytes += kRecomputeCallBytes;
      return moe ? bytes + norms(1) + stream() + moe_lean() : bytes + kRecomputeCallBytes;
    }
    bytes += norms(1); /* the feed-forward's norm */
    // The normed feed-forward input, read by the router and the shared experts' two products,
    // or the dense feed-forward's two.
    const bool shared = moe && a_.n_shared_experts > 0;
    bytes += product_input(a_.dim, moe ? 1 + (shared ? 2 : 0) : 2);
    return bytes + attention() + (moe ? this->moe() : swiglu(static_cast<double>(a_.dense_hidden)));
  }

  /// The part's output, fp32 between stages.
  double output() const { return stream(); }

  // The head's norm (its intermediate, and the normed output its product reads; its input is
  // the last block's output), log-softmax's fp32 output, and the labels.
  double head() const {
    return norms(1) + product_input(a_.dim, 1) + tokens_ * static_cast<double>(a_.vocab_size) * kFloat +
           tokens_ * kIndex;
  }

  // One MTP depth: the embedded tokens ahead, the module (a block behind two norms and a
  // projection of their concatenation), its output and its head.
  double mtp_depth(int64_t layer) const {
    const double embedded = stream() + tokens_ * kIndex;
    const double module = mode_ == keel::Recompute::full
                              ? kRecomputeCallBytes
                              : norms(2) + product_input(2 * a_.dim, 1) /* the concatenation */ + block(layer);
    return embedded + module + stream() /* the module's output */ + head();
  }

 private:
  // What RMSNorm keeps over rows of `width` (the model's dim by default) besides its input and
  // output: its fp32 inverse root mean square per row and the fp32 input scaled by it (fp32:
  // at::rms_norm's intermediate; bf16: the input cast to fp32, which its products read).
  double norms(int count, double width = -1) const {
    if (width < 0) width = static_cast<double>(a_.dim);
    return count * tokens_ * (1 + width) * kFloat;
  }
  // What `consumers` products keep of an fp32 [tokens, width] input: the input itself in fp32;
  // below fp32, each product's own cast copy (autocast caches casts of weights only).
  double product_input(int64_t width, int consumers) const {
    const double bytes = tokens_ * static_cast<double>(width);
    return cast_ ? consumers * bytes * element_ : bytes * kFloat;
  }
  double heads() const { return static_cast<double>(a_.n_heads); }

  // The query and key-value projections keep their (normed) input; the attention core keeps
  // (selective) only its operands; materialised, copies of its operands as batched matrix
  // products lay them out and the fp32 probabilities (and their cast copy below fp32); fused,
  // the kernel's concatenated query and key, its values and its output (on LibTorch's kernels
  // both zero-padded to the query's head size on CPU, and an fp32 log-sum-exp per row and head;
  // keel::cpu_causal_attention, fp32 on CPU, keeps no more than the operands). The output projection
  // keeps its input. The rope parts are fp32 (the tables are). The causal mask is the part's,
  // built once per length.
  double attention() const {
    const double t = tokens_, e = element_, h = heads();
    const double nope = static_cast<double>(a_.qk_nope_head_dim), rope = static_cast<double>(a_.qk_rope_head_dim);
    const double v = static_cast<double>(a_.v_head_dim), kv_rank = static_cast<double>(a_.kv_lora_rank);
    double bytes = product_input(a_.dim, 2) + norms(1) + norms(1, kv_rank);
    if (a_.q_lora_rank > 0) {
      const double q_rank = static_cast<double>(a_.q_lora_rank);
      bytes += 2 * t * q_rank * e + norms(1, q_rank);
    }
    bytes += t * (kv_rank + rope) * e /* the kv down-projection */ + t * kv_rank * e /* its norm */;
    if (mode_ == keel::Recompute::selective) {
      bytes += t * h * (nope + rope) * e /* q */ + t * h * (nope + v) * e /* kv */ +
               t * h * rope * kFloat /* roped q */ + t * rope * kFloat /* roped k */ + kRecomputeCallBytes;
    } else if (fused_ && cpu_ && !cast_ && seq_ >= static_cast<double>(keel::kCpuFusedAttentionFrom)) {
      // keel::cpu_causal_attention: its query, key and values; its output is the output
      // projection's input.
      bytes += 2 * t * h * (nope + rope) * e + t * h * v * e;
      return bytes + t * h * v * e;
    } else if (fused_) {
      const double qk = nope + rope, value = cpu_ ? std::max(qk, v) : v;
      bytes += 2 * t * h * qk * e /* query, key */ + 2 * t * h * value * e /* v, output */ + t * h * kFloat /* lse */;
    } else {
      const double square = batch_ * h * seq_ * seq_;
      bytes += t * h * (2 * nope + 2 * rope + v) * e + square * kFloat + (cast_ ? square * e : 0);
    }
    return bytes + t * h * v * e /* the output projection's input */;
  }

  // SwiGLU over `rows` rows of `width`: gate and up, silu(gate) and the product, or
  // (selective) gate, up and the product.
  double swiglu(double width, double rows = -1) const {
    if (rows < 0) rows = tokens_;
    if (mode_ == keel::Recompute::selective) return 3 * rows * width * element_ + kRecomputeCallBytes;
    return 4 * rows * width * element_;
  }

  // The slots of this rank's experts: each expert's rows padded to the busiest local expert's.
  double slots() const {
    const double k = static_cast<double>(a_.top_k), e = static_cast<double>(a_.n_routed_experts);
    const double local = e / ep_, rows = tokens_ * k;  // rows arriving: each rank's tokens, spread evenly
    const double mean = rows / local;
    const double busiest = std::min(rows, mean + std::sqrt(2 * mean * std::log(std::max(local, 1.0))));
    double per_expert = std::ceil(busiest);
    if (experts_apart_) per_expert = std::ceil(per_expert / kOneDnnExpertSlots) * kOneDnnExpertSlots;
    return local * per_expert;
  }
  double local_experts() const { return static_cast<double>(a_.n_routed_experts) / ep_; }

  // Router scores and choices, and the bookkeeping of the rows: order, token of each row and
  // slot of each row; the weights, and each slot's weight; the slots (in the compute dtype).
  double routing() const {
    const double t = tokens_, rows = t * static_cast<double>(a_.top_k);
    double bytes = t * static_cast<double>(a_.n_routed_experts) * kFloat /* scores */ + rows * kIndex /* choices */ +
                   (rows + t) * kFloat /* weights */ + 3 * rows * kIndex;
    return bytes + slots() * kFloat + slots() * static_cast<double>(a_.dim) * element_;
  }

  // The routed experts' SwiGLUs over their slots and the weighted results; the shared experts.
  double moe() const {
    double bytes = routing() + swiglu(static_cast<double>(a_.moe_hidden), slots());
    // Experts run apart wrap their SwiGLUs in one recomputation each.
    if (experts_apart_ && mode_ == keel::Recompute::selective) bytes += (local_experts() - 1) * kRecomputeCallBytes;
    bytes += slots() * static_cast<double>(a_.dim) * element_ /* the results, read by their weighting */;
    if (a_.n_shared_experts > 0) bytes += swiglu(static_cast<double>(a_.moe_hidden * a_.n_shared_experts));
    return bytes;
  }

  // Lean: the slots and their weights only; each expert (apart) or all of them (batched) and
  // the shared experts rerun in backward.
  double moe_lean() const {
    const double calls =
        1 /* the router */ + (experts_apart_ ? local_experts() : 1) + (a_.n_shared_experts > 0 ? 1 : 0);
    return routing() + calls * kRecomputeCallBytes;
  }

  const Args& a_;
  double batch_, seq_, tokens_, element_;
  bool cast_;  // products compute below fp32, under autocast
  keel::Recompute mode_;
  double ep_;
  bool experts_apart_;  // each routed expert's products apart, on oneDNN (Moe::run_experts)
  bool fused_;          // the attention core on LibTorch's fused kernel (fused_attention)
  bool cpu_;
};

}  // namespace

int64_t activation_bytes(const Args& args, const keel_part_spec& spec, int64_t batch, int64_t seq, keel::Recompute mode,
                         int64_t ep) {
  const double element = spec.compute_dtype == KEEL_DTYPE_FP32 ? 4 : 2;
  // What Moe::run_experts will do on the spec's device: fp32 CPU products on oneDNN run the
  // experts apart, over slots rounded up to kOneDnnExpertSlots.
  const bool experts_apart =
      spec.device_type == KEEL_DEVICE_CPU && spec.compute_dtype == KEEL_DTYPE_FP32 && keel::onednn_linear_enabled();
  const bool cpu = spec.device_type != KEEL_DEVICE_CUDA;
  const bool fused = fused_attention(args, cpu ? at::Device(at::kCPU) : at::Device(at::kCUDA), seq);
  const Counter count(args, batch, seq, element, mode, std::max<int64_t>(ep, 1), experts_apart, fused, cpu);
  const bool first = spec.stage_index == 0, last = spec.stage_index == spec.num_stages - 1;
  double bytes = count.output();                // the part's output, kept for its backward
  if (first) bytes += count.tokens() * kIndex;  // the embedding's indices
  for (int64_t layer = spec.first_layer; layer < spec.first_layer + spec.num_layers; ++layer)
    bytes += count.block(layer);
  if (last) {
    bytes += count.head();
    for (int64_t k = 0; k < args.num_mtp_layers; ++k) bytes += count.mtp_depth(args.n_layers + k);
  }
  constexpr double most = static_cast<double>(std::numeric_limits<int64_t>::max());
  return bytes >= most ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(bytes);
}

}  // namespace deepseek_v3
