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
        mode_(mode),
        ep_(static_cast<double>(ep)),
        experts_apart_(experts_apart),
        fused_(fused),
        cpu_(cpu) {}

  double tokens() const { return tokens_; }
  double hidden() const { return tokens_ * static_cast<double>(a_.dim) * element_; }

  // A block's input and everything the block keeps (its output is the next block's input).
  double block(int64_t layer) const {
    if (mode_ == keel::Recompute::full) return hidden() + kRecomputeCallBytes;
    return hidden() + attention() + 2 * hidden() /* h and its norm, the feed-forward input */ + norms(1) +
           (a_.is_moe(layer) ? moe() : swiglu(static_cast<double>(a_.dense_hidden)));
  }

  // The head's norm, its normed output and log-softmax's fp32 output, and the labels.
  double head() const {
    return hidden() + norms(1) + tokens_ * static_cast<double>(a_.vocab_size) * kFloat + tokens_ * kIndex;
  }

  // One MTP depth: the embedded tokens ahead, the module (a block behind two norms and a
  // projection of their concatenation), its output and its head.
  double mtp_depth(int64_t layer) const {
    const double embedded = hidden() + tokens_ * kIndex;
    const double module = mode_ == keel::Recompute::full
                              ? kRecomputeCallBytes
                              : norms(2) + 2 * hidden() /* the concatenation */ + block(layer);
    return embedded + module + hidden() /* the module's output */ + head();
  }

 private:
  // What RMSNorm keeps over rows of `width` (the model's dim by default) besides its input and
  // output: its fp32 inverse root mean square per row and the fp32 input scaled by it (fp32:
  // at::rms_norm's intermediate; bf16: the input cast to fp32, which its products read).
  double norms(int count, double width = -1) const {
    if (width < 0) width = static_cast<double>(a_.dim);
    return count * tokens_ * (1 + width) * kFloat;
  }
  double heads() const { return static_cast<double>(a_.n_heads); }

  // The query and key-value projections keep their inputs; the attention core keeps
  // (selective) only its operands; materialised, copies of its operands as batched matrix
  // products lay them out and the fp32 probabilities; fused, the kernel's concatenated query
  // and key, its values and its output (both zero-padded to the query's head size on CPU) and
  // an fp32 log-sum-exp per row and head. The output projection keeps its input. The causal
  // mask is the part's, built once per length.
  double attention() const {
    const double t = tokens_, e = element_, h = heads();
    const double nope = static_cast<double>(a_.qk_nope_head_dim), rope = static_cast<double>(a_.qk_rope_head_dim);
    const double v = static_cast<double>(a_.v_head_dim), kv_rank = static_cast<double>(a_.kv_lora_rank);
    double bytes = hidden() /* the normed input */ + norms(1) + norms(1, kv_rank);
    if (a_.q_lora_rank > 0) {
      const double q_rank = static_cast<double>(a_.q_lora_rank);
      bytes += 2 * t * q_rank * e + norms(1, q_rank);
    }
    bytes += t * (kv_rank + rope) * e /* the kv down-projection */ + t * kv_rank * e /* its norm */;
    if (mode_ == keel::Recompute::selective) {
      bytes += t * h * (nope + rope) * e /* q */ + t * h * (nope + v) * e /* kv */ + t * h * rope * e /* roped q */ +
               t * rope * e /* roped k */ + kRecomputeCallBytes;
    } else if (fused_) {
      const double qk = nope + rope, value = cpu_ ? std::max(qk, v) : v;
      bytes += 2 * t * h * qk * e /* query, key */ + 2 * t * h * value * e /* v, output */ + t * h * kFloat /* lse */;
    } else {
      bytes += t * h * (2 * nope + 2 * rope + v) * e + batch_ * h * seq_ * seq_ * kFloat;
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

  // Router scores and choices; the rows each expert runs, packed into slots of the busiest
  // local expert's load; the results and their weights; the shared experts.
  double moe() const {
    const double t = tokens_, k = static_cast<double>(a_.top_k), e = static_cast<double>(a_.n_routed_experts);
    const double local = e / ep_, rows = t * k;  // rows arriving: each rank's tokens, spread evenly
    const double mean = rows / local;
    const double busiest = std::min(rows, mean + std::sqrt(2 * mean * std::log(std::max(local, 1.0))));
    double per_expert = std::ceil(busiest);
    if (experts_apart_) per_expert = std::ceil(per_expert / kOneDnnExpertSlots) * kOneDnnExpertSlots;
    const double slots = local * per_expert;
    double bytes = t * e * kFloat /* scores */ + rows * kIndex /* choices */ + (rows + t) * kFloat /* weights */;
    bytes += 3 * rows * kIndex /* order, token of each row, slot of each row */;
    bytes += slots * static_cast<double>(a_.dim) * element_ + swiglu(static_cast<double>(a_.moe_hidden), slots);
    // Experts run apart wrap their SwiGLUs in one recomputation each.
    if (experts_apart_ && mode_ == keel::Recompute::selective) bytes += (local - 1) * kRecomputeCallBytes;
    bytes += rows * static_cast<double>(a_.dim) * element_ + rows * element_;
    if (a_.n_shared_experts > 0) bytes += swiglu(static_cast<double>(a_.moe_hidden * a_.n_shared_experts));
    return bytes;
  }

  const Args& a_;
  double batch_, seq_, tokens_, element_;
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
  double bytes = count.hidden();                // the part's output, kept for its backward
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
