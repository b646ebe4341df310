// The modules of a DeepSeek-V3 part: MLA attention, the dense SwiGLU MLP, DeepSeekMoE with
// aux-loss-free routing, the transformer block and the multi-token-prediction module. Each
// declares its parameters (canonical FQNs) through a Declare and holds pointers to them.
#pragma once

#include <keel/attention.hpp>
#include <keel/keel.hpp>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "args.hpp"
#include "rope.hpp"

namespace deepseek_v3 {

/// Declares a part's parameters and buffers under one module group ("main" or "mtp", for
/// parameter reports).
struct Declare {
  keel::Part& part;
  std::string module_group = "main";

  /// A trainable parameter drawn by `init`.
  at::Tensor& param(std::string fqn, std::vector<int64_t> shape, keel::init::Rule init,
                    keel::ParamOptions options = {}) {
    options.module_group = module_group;
    return part.param(std::move(fqn), std::move(shape), init, options);
  }
  /// An fp32 buffer set by `init`; persistent buffers are checkpointed.
  at::Tensor& buffer(std::string fqn, std::vector<int64_t> shape, keel::init::Rule init, bool persistent) {
    return part.buffer(std::move(fqn), std::move(shape), init, persistent, module_group);
  }
};

// torchtitan's DeepSeek-V3 init: unit norms, 0.02 for the projections into a block, and for
// block `layer` (MTP blocks count as n_layers + k) 0.02 / sqrt(2 (layer + 1)) for the router
// and the projections back into the residual stream (wo, w2, w3).
inline const keel::init::Rule kNormInit = keel::init::Constant{1.0};
inline const keel::init::Rule kProjectionInit = keel::init::TruncatedNormal{0.02};
/// The depth-scaled rule of block `layer`.
inline keel::init::Rule residual_init(int64_t layer) {
  return keel::init::TruncatedNormal{0.02 / std::sqrt(2.0 * static_cast<double>(layer + 1))};
}

/// Where this rank's routed experts sit and how tokens reach the others: experts
/// [first, first + local) of every MoE layer live here; the ep group's member i holds
/// experts [i * local, (i + 1) * local).
struct ExpertPlacement {
  int64_t first = 0;
  int64_t local = 0;
  int32_t ep = 1;               ///< expert-parallel ranks (1: every expert is here)
  keel_host* host = nullptr;    ///< for the dispatch collectives (ep > 1)
  keel_group* group = nullptr;  ///< the ep group (ep > 1)
};

/// What every attention layer of one forward over `seq` positions shares, built once per length.
struct SequenceTables {
  RopeTables rope;
  /// [seq, seq] bool, true above the diagonal (the future each position may not see); built
  /// only where the attention is materialised (fused_attention is false).
  at::Tensor future;
  /// The microbatch's document runs under block-causal attention (keel_forward_inputs
  /// documents); absent: causal attention over each whole sample.
  std::optional<keel::DocumentRuns> runs;
};

/// Whether attention over `seq` positions on `device` runs fused (Args::attention_kernel).
bool fused_attention(const Args& args, const at::Device& device, int64_t seq);

/// The tables for `seq` positions on `options`' device.
SequenceTables sequence_tables(const Args& args, int64_t seq, const at::TensorOptions& options);

/// RMSNorm in fp32, as the reference computes it.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

/// Multi-head latent attention.
class Attention {
 public:
  /// Projections into the block drawn by kProjectionInit, wo by `residual`.
  Attention(Declare& d, const std::string& prefix, const Args& args, const keel::init::Rule& residual);
  /// The attention of the normed input `x`, [b, s, dim].
  at::Tensor forward(const at::Tensor& x, const SequenceTables& tables) const;

 private:
  const Args& args_;
  at::Tensor *wq_ = nullptr, *wq_a_ = nullptr, *q_norm_ = nullptr, *wq_b_ = nullptr;
  at::Tensor *wkv_a_, *kv_norm_, *wkv_b_, *wo_;
};

/// SwiGLU feed-forward: w2(silu(w1 x) * w3 x).
class Mlp {
 public:
  /// w1 drawn by kProjectionInit, w2 and w3 by `residual`; `recompute` selective reruns the
  /// SwiGLU product in backward, lean the whole feed-forward.
  Mlp(Declare& d, const std::string& prefix, int64_t dim, int64_t hidden, const keel::init::Rule& residual,
      keel::Recompute recompute);
  at::Tensor forward(const at::Tensor& x) const;
  /// The three products of `x`, the SwiGLU recomputed as selective asks: forward without the
  /// lean region (for a caller whose own region holds it).
  at::Tensor products(const at::Tensor& x) const;

 private:
  at::Tensor *w1_, *w2_, *w3_;
  keel::Recompute recompute_;
};

/// On oneDNN each routed expert runs over its slots apart, their count rounded up to a multiple
/// of this: oneDNN builds a kernel for each shape it meets, and the busiest expert's load, which
/// sets the slots, changes every step.
constexpr int64_t kOneDnnExpertSlots = 64;

/// DeepSeekMoE: shared experts plus top-k routed experts chosen with a bias that only steers
/// the choice (aux-loss-free balancing). Under expert parallelism each routed (token, expert)
/// pair travels to the rank holding its expert and back by differentiable all-to-all.
class Moe {
 public:
  /// w1 drawn by kProjectionInit; the router, w2 and w3 by `residual`.
  Moe(Declare& d, const std::string& prefix, const Args& args, const ExpertPlacement& placement,
      const keel::init::Rule& residual);
  at::Tensor forward(const at::Tensor& x);
  /// Tokens routed to each expert since the last bias update, fp32 [n_routed_experts].
  at::Tensor& tokens_per_expert() { return *tokens_per_expert_; }
  /// The routing bias, fp32 [n_routed_experts].
  at::Tensor& expert_bias() { return *expert_bias_; }
  /// The layer's FQN prefix.
  const std::string& prefix() const { return prefix_; }

 private:
  at::Tensor routed(const at::Tensor& x, const at::Tensor& indices, const at::Tensor& weights) const;
  at::Tensor run_experts(const at::Tensor& rows, const at::Tensor& expert, const at::Tensor& weight) const;

  const Args& args_;
  std::string prefix_;
  ExpertPlacement placement_;
  at::Tensor *gate_, *expert_bias_, *tokens_per_expert_;
  at::Tensor *w1_, *w2_, *w3_;
  std::optional<Mlp> shared_;
};

/// Pre-norm transformer block: x + attn(norm(x)), then + ffn(norm(x)). Lean recomputation
/// keeps x and h between the sub-layers and reruns the rest from them (the routed experts from
/// their rows).
class Block {
 public:
  /// Global block `layer` (MTP blocks count as n_layers + k): MoE or dense by Args::is_moe.
  Block(Declare& d, const std::string& prefix, const Args& args, int64_t layer, const ExpertPlacement& placement);
  at::Tensor forward(const at::Tensor& x, const SequenceTables& tables);
  /// The MoE of this block, or nullptr for a dense block.
  Moe* moe() { return moe_ ? &*moe_ : nullptr; }

 private:
  const Args& args_;
  at::Tensor *attention_norm_, *ffn_norm_;
  Attention attention_;
  std::optional<Mlp> mlp_;
  std::optional<Moe> moe_;
};

/// One MTP depth: eh_proj([enorm(embedding of the token k ahead); hnorm(previous hidden)]),
/// one block, and a final norm before the shared output head.
class MtpModule {
 public:
  MtpModule(Declare& d, const std::string& prefix, const Args& args, int64_t layer, const ExpertPlacement& placement);
  /// The depth's hidden state from the previous one and the embeddings of the shifted tokens.
  at::Tensor forward(const at::Tensor& previous, const at::Tensor& embedded, const SequenceTables& tables);
  /// The final norm's weight.
  const at::Tensor& norm() const { return *norm_; }
  /// The block (for its MoE).
  Block& block() { return block_; }

 private:
  const Args& args_;
  at::Tensor *enorm_, *hnorm_, *eh_proj_, *norm_;
  Block block_;
};

}  // namespace deepseek_v3
