#include "args.hpp"

#include <keel/fields.hpp>

#include <cmath>
#include <vector>

namespace deepseek_v3 {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// Every [model] key: the member it sets and, for integers, the least value it may take.
const std::vector<keel::Field<Args>>& fields() {
  static const std::vector<keel::Field<Args>> table = {
      {"vocab_size", &Args::vocab_size, 1},
      {"dim", &Args::dim, 1},
      {"n_layers", &Args::n_layers, 1},
      {"n_dense_layers", &Args::n_dense_layers, 0},
      {"n_heads", &Args::n_heads, 1},
      {"q_lora_rank", &Args::q_lora_rank, 0},
      {"kv_lora_rank", &Args::kv_lora_rank, 1},
      {"qk_nope_head_dim", &Args::qk_nope_head_dim, 0},
      {"qk_rope_head_dim", &Args::qk_rope_head_dim, 2},
      {"v_head_dim", &Args::v_head_dim, 1},
      {"attention_kernel", &Args::attention_kernel},
      {"dense_hidden", &Args::dense_hidden, 1},
      {"moe_hidden", &Args::moe_hidden, 1},
      {"n_routed_experts", &Args::n_routed_experts, 1},
      {"n_shared_experts", &Args::n_shared_experts, 0},
      {"top_k", &Args::top_k, 1},
      {"score_func", &Args::score_func},
      {"n_expert_groups", &Args::n_expert_groups, 1},
      {"n_limited_groups", &Args::n_limited_groups, 1},
      {"route_norm", &Args::route_norm},
      {"route_scale", &Args::route_scale},
      {"load_balance_coeff", &Args::load_balance_coeff},
      {"rope_theta", &Args::rope_theta},
      {"rope_factor", &Args::rope_factor},
      {"original_seq_len", &Args::original_seq_len, 1},
      {"beta_fast", &Args::beta_fast},
      {"beta_slow", &Args::beta_slow},
      {"mscale", &Args::mscale},
      {"mscale_all_dim", &Args::mscale_all_dim},
      {"norm_eps", &Args::norm_eps},
      {"num_mtp_layers", &Args::num_mtp_layers, 0},
      {"mtp_loss_scale", &Args::mtp_loss_scale},
  };
  return table;
}

// The named sizes, one per paragraph; a member a row leaves out keeps its default in Args.
const std::vector<keel::Flavor<Args>>& flavors() {
  // clang-format off
  static const std::vector<keel::Flavor<Args>> table = {
      {"tiny", {.vocab_size = 256, .dim = 64, .n_layers = 3, .n_dense_layers = 1, .n_heads = 4,
                .q_lora_rank = 32, .kv_lora_rank = 32, .qk_nope_head_dim = 16, .qk_rope_head_dim = 8, .v_head_dim = 16,
                .dense_hidden = 128, .moe_hidden = 32, .n_routed_experts = 8, .n_shared_experts = 1, .top_k = 2,
                .score_func = "sigmoid", .n_expert_groups = 4, .n_limited_groups = 2, .route_norm = true,
                .route_scale = 2.5, .rope_factor = 4.0, .original_seq_len = 16, .num_mtp_layers = 1}},
      {"debug", {.vocab_size = 2048, .dim = 256, .n_layers = 6, .n_dense_layers = 1, .n_heads = 16,
                 .q_lora_rank = 0, .kv_lora_rank = 512, .qk_nope_head_dim = 128, .qk_rope_head_dim = 64,
                 .v_head_dim = 128, .dense_hidden = 1024, .moe_hidden = 256, .n_routed_experts = 8,
                 .n_shared_experts = 2, .top_k = 3, .score_func = "sigmoid", .route_norm = true, .route_scale = 1.0,
                 .num_mtp_layers = 1}},
      // DeepSeek-V2-Lite's shape (published: 15.7 B total, 2.4 B activated; no MTP).
      {"16b", {.vocab_size = 102400, .dim = 2048, .n_layers = 27, .n_dense_layers = 1, .n_heads = 16,
               .q_lora_rank = 0, .kv_lora_rank = 512, .qk_nope_head_dim = 128, .qk_rope_head_dim = 64,
               .v_head_dim = 128, .dense_hidden = 10944, .moe_hidden = 1408, .n_routed_experts = 64,
               .n_shared_experts = 2, .top_k = 6, .score_func = "softmax", .route_norm = false, .route_scale = 1.0,
               .rope_factor = 40.0, .original_seq_len = 4096, .mscale = 0.707, .mscale_all_dim = 0.707,
               .num_mtp_layers = 0}},
      // The published DeepSeek-V3 config (671 B main model, 37 B activated, 1 MTP layer).
      {"671b", {.vocab_size = 129280, .dim = 7168, .n_layers = 61, .n_dense_layers = 3, .n_heads = 128,
                .q_lora_rank = 1536, .kv_lora_rank = 512, .qk_nope_head_dim = 128, .qk_rope_head_dim = 64,
                .v_head_dim = 128, .dense_hidden = 18432, .moe_hidden = 2048, .n_routed_experts = 256,
                .n_shared_experts = 1, .top_k = 8, .score_func = "sigmoid", .n_expert_groups = 8,
                .n_limited_groups = 4, .route_norm = true, .route_scale = 2.5, .rope_factor = 40.0,
                .original_seq_len = 4096, .mscale = 1.0, .mscale_all_dim = 1.0, .num_mtp_layers = 1}},
  };
  // clang-format on
  return table;
}

}  // namespace

std::vector<keel::ConfigKey> config_keys() { return keel::field_keys(flavors(), fields(), "debug"); }

Args read_args(keel::Config& c) {
  Args a = keel::read_fields(c, flavors(), fields(), "debug");
  if (a.qk_rope_head_dim % 2 != 0)
    c.invalid("qk_rope_head_dim", "must be even (rotary pairs), got " + str(a.qk_rope_head_dim));
  if (a.n_dense_layers > a.n_layers)
    c.invalid("n_dense_layers", "exceeds n_layers (" + str(a.n_layers) + "), got " + str(a.n_dense_layers));
  if (a.score_func != "softmax" && a.score_func != "sigmoid")
    c.invalid("score_func", "must be \"softmax\" or \"sigmoid\", got \"" + a.score_func + "\"");
  if (a.top_k > a.n_routed_experts)
    c.invalid("top_k", "exceeds n_routed_experts (" + str(a.n_routed_experts) + "), got " + str(a.top_k));
  if (a.n_routed_experts % a.n_expert_groups != 0)
    c.invalid("n_expert_groups",
              "must divide n_routed_experts (" + str(a.n_routed_experts) + "), got " + str(a.n_expert_groups));
  if (a.n_limited_groups > a.n_expert_groups)
    c.invalid("n_limited_groups",
              "exceeds n_expert_groups (" + str(a.n_expert_groups) + "), got " + str(a.n_limited_groups));
  if (a.top_k > a.n_limited_groups * (a.n_routed_experts / a.n_expert_groups))
    c.invalid("top_k", "exceeds the experts of the n_limited_groups groups a token may use (" +
                           str(a.n_limited_groups * (a.n_routed_experts / a.n_expert_groups)) + ")");
  if (a.attention_kernel != "auto" && a.attention_kernel != "fused" && a.attention_kernel != "materialised")
    c.invalid("attention_kernel",
              "must be \"auto\", \"fused\" or \"materialised\", got \"" + a.attention_kernel + "\"");
  if (!(a.route_scale > 0)) c.invalid("route_scale", "must be positive");
  if (!(a.load_balance_coeff >= 0)) c.invalid("load_balance_coeff", "must be non-negative");
  if (!(a.rope_theta > 0)) c.invalid("rope_theta", "must be positive");
  if (!(a.rope_factor >= 1)) c.invalid("rope_factor", "must be at least 1 (1 = no YaRN)");
  if (!(a.beta_fast > a.beta_slow) || !(a.beta_slow > 0))
    c.invalid("beta_fast", "YaRN needs beta_fast > beta_slow > 0");
  if (!(a.norm_eps > 0)) c.invalid("norm_eps", "must be positive");
  if (!(a.mtp_loss_scale >= 0)) c.invalid("mtp_loss_scale", "must be non-negative");
  return a;
}

}  // namespace deepseek_v3
