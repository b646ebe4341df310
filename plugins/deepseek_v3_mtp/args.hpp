// DeepSeek-V3 hyper-parameters: named flavors (tiny, debug, 16b, 671b) overridable key by key
// from the [model] table, validated so that impossible shapes are config errors.
#pragma once

#include <keel/recompute_mode.hpp>

#include <keel/keel.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace deepseek_v3 {

struct Args {
  /// What backward recomputes (the host's training.recompute, set before any part is built;
  /// not a key of the model's table).
  keel::Recompute recompute = keel::Recompute::none;
  /// KEEL_ATTENTION_* flags of the host's data.attention and data.reset_positions (set before
  /// any part is built; not keys of the model's table). Forwards then carry the documents.
  uint32_t attention_flags = 0;
  int64_t vocab_size = 0;
  int64_t dim = 0;
  int64_t n_layers = 0;
  int64_t n_dense_layers = 0;
  int64_t n_heads = 0;
  // MLA
  int64_t q_lora_rank = 0;  ///< 0 = a direct query projection
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  /// "auto" (fused from keel::kCpuFusedAttentionFrom positions on CPU, always on CUDA),
  /// "fused" or "materialised" (the [b, h, s, s] probabilities kept: short sequences, tests).
  /// Under document masking (attention_flags) the attention is always fused, one call per run.
  std::string attention_kernel = "auto";
  // feed-forward
  int64_t dense_hidden = 0;
  int64_t moe_hidden = 0;
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 0;
  int64_t top_k = 0;
  std::string score_func = "sigmoid";  ///< "softmax" | "sigmoid"
  int64_t n_expert_groups = 1;
  int64_t n_limited_groups = 1;
  bool route_norm = true;
  double route_scale = 1.0;
  double load_balance_coeff = 1e-3;
  // RoPE with YaRN (factor 1 = plain RoPE)
  double rope_theta = 10000.0;
  double rope_factor = 1.0;
  int64_t original_seq_len = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 1.0;
  double norm_eps = 1e-6;
  // multi-token prediction
  int64_t num_mtp_layers = 1;
  double mtp_loss_scale = 0.3;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  /// Whether global layer `layer` (MTP blocks count as layers n_layers + k) is an MoE layer.
  bool is_moe(int64_t layer) const { return layer >= n_dense_layers; }
};

/// The flavor named in `model.flavor` with every key of the table applied on top.
Args read_args(keel::Config& config);

/// Every key read_args() reads: `flavor` and one per field, each with every flavor's value.
std::vector<keel::ConfigKey> config_keys();

}  // namespace deepseek_v3
