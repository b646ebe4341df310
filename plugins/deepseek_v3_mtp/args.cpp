#include "args.hpp"

#include <cmath>
#include <map>

namespace deepseek_v3 {

namespace {

Args tiny() {
  Args a;
  a.vocab_size = 256, a.dim = 64, a.n_layers = 3, a.n_dense_layers = 1, a.n_heads = 4;
  a.q_lora_rank = 32, a.kv_lora_rank = 32, a.qk_nope_head_dim = 16, a.qk_rope_head_dim = 8, a.v_head_dim = 16;
  a.dense_hidden = 128, a.moe_hidden = 32, a.n_routed_experts = 8, a.n_shared_experts = 1, a.top_k = 2;
  a.score_func = "sigmoid", a.n_expert_groups = 4, a.n_limited_groups = 2, a.route_norm = true, a.route_scale = 2.5;
  a.rope_factor = 4.0, a.original_seq_len = 16;
  a.num_mtp_layers = 1;
  return a;
}

Args debug() {
  Args a;
  a.vocab_size = 2048, a.dim = 256, a.n_layers = 6, a.n_dense_layers = 1, a.n_heads = 16;
  a.q_lora_rank = 0, a.kv_lora_rank = 512, a.qk_nope_head_dim = 128, a.qk_rope_head_dim = 64, a.v_head_dim = 128;
  a.dense_hidden = 1024, a.moe_hidden = 256, a.n_routed_experts = 8, a.n_shared_experts = 2, a.top_k = 3;
  a.score_func = "sigmoid", a.route_norm = true, a.route_scale = 1.0;
  a.num_mtp_layers = 1;
  return a;
}

// DeepSeek-V2-Lite's shape (published: 15.7 B total, 2.4 B activated; no MTP).
Args v2_lite() {
  Args a;
  a.vocab_size = 102400, a.dim = 2048, a.n_layers = 27, a.n_dense_layers = 1, a.n_heads = 16;
  a.q_lora_rank = 0, a.kv_lora_rank = 512, a.qk_nope_head_dim = 128, a.qk_rope_head_dim = 64, a.v_head_dim = 128;
  a.dense_hidden = 10944, a.moe_hidden = 1408, a.n_routed_experts = 64, a.n_shared_experts = 2, a.top_k = 6;
  a.score_func = "softmax", a.route_norm = false, a.route_scale = 1.0;
  a.rope_factor = 40.0, a.original_seq_len = 4096, a.mscale = 0.707, a.mscale_all_dim = 0.707;
  a.num_mtp_layers = 0;
  return a;
}

// The published DeepSeek-V3 config (671 B main model, 37 B activated, 1 MTP layer).
Args v3() {
  Args a;
  a.vocab_size = 129280, a.dim = 7168, a.n_layers = 61, a.n_dense_layers = 3, a.n_heads = 128;
  a.q_lora_rank = 1536, a.kv_lora_rank = 512, a.qk_nope_head_dim = 128, a.qk_rope_head_dim = 64, a.v_head_dim = 128;
  a.dense_hidden = 18432, a.moe_hidden = 2048, a.n_routed_experts = 256, a.n_shared_experts = 1, a.top_k = 8;
  a.score_func = "sigmoid", a.n_expert_groups = 8, a.n_limited_groups = 4, a.route_norm = true, a.route_scale = 2.5;
  a.rope_factor = 40.0, a.original_seq_len = 4096, a.mscale = 1.0, a.mscale_all_dim = 1.0;
  a.num_mtp_layers = 1;
  return a;
}

const std::map<std::string, Args>& flavors() {
  static const std::map<std::string, Args> table = {
      {"tiny", tiny()}, {"debug", debug()}, {"16b", v2_lite()}, {"671b", v3()}};
  return table;
}

std::string str(int64_t v) { return std::to_string(v); }

}  // namespace

Args read_args(keel::Config& c) {
  std::string flavor = c.string("flavor", "debug");
  auto it = flavors().find(flavor);
  if (it == flavors().end()) c.invalid("flavor", "unknown flavor '" + flavor + "'; known: tiny, debug, 16b, 671b");
  Args a = it->second;
  c.update("vocab_size", a.vocab_size);
  c.update("dim", a.dim);
  c.update("n_layers", a.n_layers);
  c.update("n_dense_layers", a.n_dense_layers);
  c.update("n_heads", a.n_heads);
  c.update("q_lora_rank", a.q_lora_rank);
  c.update("kv_lora_rank", a.kv_lora_rank);
  c.update("qk_nope_head_dim", a.qk_nope_head_dim);
  c.update("qk_rope_head_dim", a.qk_rope_head_dim);
  c.update("v_head_dim", a.v_head_dim);
  c.update("dense_hidden", a.dense_hidden);
  c.update("moe_hidden", a.moe_hidden);
  c.update("n_routed_experts", a.n_routed_experts);
  c.update("n_shared_experts", a.n_shared_experts);
  c.update("top_k", a.top_k);
  c.update("score_func", a.score_func);
  c.update("n_expert_groups", a.n_expert_groups);
  c.update("n_limited_groups", a.n_limited_groups);
  c.update("route_norm", a.route_norm);
  c.update("route_scale", a.route_scale);
  c.update("load_balance_coeff", a.load_balance_coeff);
  c.update("rope_theta", a.rope_theta);
  c.update("rope_factor", a.rope_factor);
  c.update("original_seq_len", a.original_seq_len);
  c.update("beta_fast", a.beta_fast);
  c.update("beta_slow", a.beta_slow);
  c.update("mscale", a.mscale);
  c.update("mscale_all_dim", a.mscale_all_dim);
  c.update("norm_eps", a.norm_eps);
  c.update("num_mtp_layers", a.num_mtp_layers);
  c.update("mtp_loss_scale", a.mtp_loss_scale);

  auto at_least = [&](const char* key, int64_t v, int64_t lo) {
    if (v < lo) c.invalid(key, "must be at least " + str(lo) + ", got " + str(v));
  };
  at_least("vocab_size", a.vocab_size, 1);
  at_least("dim", a.dim, 1);
  at_least("n_layers", a.n_layers, 1);
  at_least("n_dense_layers", a.n_dense_layers, 0);
  at_least("n_heads", a.n_heads, 1);
  at_least("q_lora_rank", a.q_lora_rank, 0);
  at_least("kv_lora_rank", a.kv_lora_rank, 1);
  at_least("qk_nope_head_dim", a.qk_nope_head_dim, 0);
  at_least("qk_rope_head_dim", a.qk_rope_head_dim, 2);
  at_least("v_head_dim", a.v_head_dim, 1);
  at_least("dense_hidden", a.dense_hidden, 1);
  at_least("moe_hidden", a.moe_hidden, 1);
  at_least("n_routed_experts", a.n_routed_experts, 1);
  at_least("n_shared_experts", a.n_shared_experts, 0);
  at_least("top_k", a.top_k, 1);
  at_least("n_expert_groups", a.n_expert_groups, 1);
  at_least("n_limited_groups", a.n_limited_groups, 1);
  at_least("original_seq_len", a.original_seq_len, 1);
  at_least("num_mtp_layers", a.num_mtp_layers, 0);
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
