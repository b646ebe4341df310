#include "modules.hpp"

#include <c10/core/GradMode.h>

#include <limits>

namespace deepseek_v3 {

at::Tensor& Declare::param(const std::string& fqn, std::vector<int64_t> shape, uint32_t flags, double active,
                           int64_t shard_offset, int64_t global_dim) {
  keel::ParamDecl decl;
  decl.fqn = fqn;
  decl.tensor = at::empty(shape, options).requires_grad_(true);
  decl.flags = flags;
  decl.active_fraction = active;
  decl.module_group = module_group;
  if ((flags & KEEL_PARAM_EXPERT) != 0) {
    decl.shard_dim = 0;
    decl.shard_offset = shard_offset;
    decl.global_dim_size = global_dim;
  }
  return params.add(std::move(decl));
}

at::Tensor& Declare::buffer(const std::string& fqn, std::vector<int64_t> shape, bool persistent) {
  keel::ParamDecl decl;
  decl.fqn = fqn;
  decl.tensor = at::zeros(shape, options.dtype(at::kFloat));
  decl.flags = persistent ? KEEL_PARAM_PERSISTENT : 0;
  decl.module_group = module_group;
  return buffers.add(std::move(decl));
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (x.scalar_type() == at::kFloat) return at::rms_norm(x, {x.size(-1)}, weight, eps);  // one fused kernel
  at::Tensor x32 = x.to(at::kFloat);
  at::Tensor normed = x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

// ------------------------------------------------------------------ attention

Attention::Attention(Declare& d, const std::string& p, const Args& a) : args_(a) {
  const int64_t qk = a.qk_head_dim();
  if (a.q_lora_rank == 0) {
    wq_ = &d.param(p + "wq.weight", {a.n_heads * qk, a.dim});
  } else {
    wq_a_ = &d.param(p + "wq_a.weight", {a.q_lora_rank, a.dim});
    q_norm_ = &d.param(p + "q_norm.weight", {a.q_lora_rank});
    wq_b_ = &d.param(p + "wq_b.weight", {a.n_heads * qk, a.q_lora_rank});
  }
  wkv_a_ = &d.param(p + "wkv_a.weight", {a.kv_lora_rank + a.qk_rope_head_dim, a.dim});
  kv_norm_ = &d.param(p + "kv_norm.weight", {a.kv_lora_rank});
  wkv_b_ = &d.param(p + "wkv_b.weight", {a.n_heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank});
  wo_ = &d.param(p + "wo.weight", {a.dim, a.n_heads * a.v_head_dim});
}

at::Tensor Attention::forward(const at::Tensor& x, const RopeTables& rope) const {
  const Args& a = args_;
  const int64_t b = x.size(0), s = x.size(1), h = a.n_heads;
  at::Tensor q =
      wq_ != nullptr ? at::linear(x, *wq_) : at::linear(rms_norm(at::linear(x, *wq_a_), *q_norm_, a.norm_eps), *wq_b_);
  q = q.view({b, s, h, a.qk_head_dim()});
  std::vector<at::Tensor> q_parts = q.split({a.qk_nope_head_dim, a.qk_rope_head_dim}, -1);
  std::vector<at::Tensor> kv_parts = at::linear(x, *wkv_a_).split({a.kv_lora_rank, a.qk_rope_head_dim}, -1);
  at::Tensor k_rope = apply_rope(kv_parts[1].view({b, s, 1, a.qk_rope_head_dim}), rope);
  at::Tensor q_rope = apply_rope(q_parts[1], rope);
  at::Tensor kv = at::linear(rms_norm(kv_parts[0], *kv_norm_, a.norm_eps), *wkv_b_)
                      .view({b, s, h, a.qk_nope_head_dim + a.v_head_dim});
  std::vector<at::Tensor> k_v = kv.split({a.qk_nope_head_dim, a.v_head_dim}, -1);
  at::Tensor query = at::cat({q_parts[0], q_rope}, -1).transpose(1, 2);
  at::Tensor key = at::cat({k_v[0], k_rope.expand({b, s, h, a.qk_rope_head_dim})}, -1).transpose(1, 2);
  at::Tensor value = k_v[1].transpose(1, 2);
  at::Tensor out =
      at::scaled_dot_product_attention(query, key, value, std::nullopt, 0.0, /*is_causal=*/true, softmax_scale(a));
  return at::linear(out.transpose(1, 2).reshape({b, s, h * a.v_head_dim}), *wo_);
}

// ------------------------------------------------------------------ dense MLP

Mlp::Mlp(Declare& d, const std::string& p, int64_t dim, int64_t hidden) {
  w1_ = &d.param(p + "w1.weight", {hidden, dim});
  w2_ = &d.param(p + "w2.weight", {dim, hidden});
  w3_ = &d.param(p + "w3.weight", {hidden, dim});
}

at::Tensor Mlp::forward(const at::Tensor& x) const {
  return at::linear(at::silu(at::linear(x, *w1_)) * at::linear(x, *w3_), *w2_);
}

// ------------------------------------------------------------------ MoE

Moe::Moe(Declare& d, const std::string& p, const Args& a, int64_t first_expert, int64_t local_experts)
    : args_(a), prefix_(p), first_expert_(first_expert), local_experts_(local_experts) {
  const int64_t e = a.n_routed_experts;
  gate_ = &d.param(p + "router.gate.weight", {e, a.dim});
  expert_bias_ = &d.buffer(p + "expert_bias", {e}, /*persistent=*/true);
  tokens_per_expert_ = &d.buffer(p + "tokens_per_expert", {e}, /*persistent=*/false);
  const double active = static_cast<double>(a.top_k) / static_cast<double>(e);
  const uint32_t expert = KEEL_PARAM_EXPERT;
  w1_ = &d.param(p + "experts.w1", {local_experts, a.moe_hidden, a.dim}, expert, active, first_expert, e);
  w2_ = &d.param(p + "experts.w2", {local_experts, a.dim, a.moe_hidden}, expert, active, first_expert, e);
  w3_ = &d.param(p + "experts.w3", {local_experts, a.moe_hidden, a.dim}, expert, active, first_expert, e);
  if (a.n_shared_experts > 0) shared_.emplace(d, p + "shared_experts.", a.dim, a.moe_hidden * a.n_shared_experts);
}

at::Tensor Moe::forward(const at::Tensor& x) {
  const Args& a = args_;
  const auto shape = x.sizes().vec();
  at::Tensor tokens = x.reshape({-1, a.dim});
  const int64_t n = tokens.size(0), e = a.n_routed_experts;
  at::Tensor logits = at::linear(tokens.to(at::kFloat), gate_->to(at::kFloat));
  at::Tensor scores = a.score_func == "softmax" ? logits.softmax(-1) : logits.sigmoid();
  // The bias steers which experts are chosen, never the weights they get.
  at::Tensor choice = scores.detach() + *expert_bias_;
  if (a.n_expert_groups > 1) {
    const int64_t per_group = e / a.n_expert_groups;
    at::Tensor grouped = choice.view({n, a.n_expert_groups, per_group});
    at::Tensor group_scores = per_group >= 2 ? std::get<0>(grouped.topk(2, -1)).sum(-1) : grouped.amax(-1);
    at::Tensor keep = std::get<1>(group_scores.topk(a.n_limited_groups, -1, /*largest=*/true, /*sorted=*/false));
    at::Tensor mask = at::zeros_like(group_scores, at::kBool).scatter_(1, keep, true);
    choice =
        choice.masked_fill(mask.unsqueeze(-1).expand({n, a.n_expert_groups, per_group}).reshape({n, e}).logical_not(),
                           -std::numeric_limits<float>::infinity());
  }
  at::Tensor indices = std::get<1>(choice.topk(a.top_k, -1, /*largest=*/true, /*sorted=*/false));
  at::Tensor weights = scores.gather(1, indices);
  if (a.route_norm) weights = weights / (weights.sum(-1, /*keepdim=*/true) + 1e-20);
  weights = weights * a.route_scale;
  {
    c10::NoGradGuard no_grad;
    tokens_per_expert_->add_(at::bincount(indices.flatten(), {}, e).to(at::kFloat));
  }
  at::Tensor out = routed(tokens, indices, weights.to(tokens.scalar_type()));
  if (shared_) out = out + shared_->forward(tokens);
  return out.view(shape);
}

// Sorts the (token, expert) pairs by expert, packs each expert's tokens into a padded slot
// of [local_experts, capacity, dim] and runs all experts as three batched matmuls. One host
// read per layer (the capacity) replaces any per-expert loop; LibTorch 2.15's CPU
// _grouped_mm is not used because it needs 16-byte-aligned strides and fails in backward on
// empty groups.
at::Tensor Moe::routed(const at::Tensor& x, const at::Tensor& indices, const at::Tensor& weights) const {
  const int64_t n = x.size(0), k = indices.size(1);
  at::Tensor flat_expert = indices.flatten() - first_expert_;
  at::Tensor flat_token = at::arange(n, indices.options()).repeat_interleave(k);
  at::Tensor flat_weight = weights.flatten();
  // Only pairs whose expert lives on this rank (all of them at ep = 1).
  at::Tensor local = (flat_expert >= 0).logical_and(flat_expert < local_experts_);
  if (local_experts_ != args_.n_routed_experts) {
    flat_expert = flat_expert.masked_select(local);
    flat_token = flat_token.masked_select(local);
    flat_weight = flat_weight.masked_select(local);
  }
  at::Tensor order = at::argsort(flat_expert, /*stable=*/true);
  at::Tensor sorted_expert = flat_expert.index_select(0, order);
  at::Tensor sorted_token = flat_token.index_select(0, order);
  at::Tensor counts = at::bincount(sorted_expert, {}, local_experts_);
  const int64_t capacity = counts.numel() > 0 ? counts.max().item<int64_t>() : 0;
  at::Tensor out = at::zeros_like(x);
  if (capacity == 0) return out;
  at::Tensor starts = counts.cumsum(0) - counts;
  at::Tensor rank_in_expert =
      at::arange(sorted_expert.size(0), sorted_expert.options()) - starts.index_select(0, sorted_expert);
  at::Tensor slot = sorted_expert * capacity + rank_in_expert;
  at::Tensor packed = at::zeros({local_experts_ * capacity, x.size(1)}, x.options())
                          .index_add(0, slot, x.index_select(0, sorted_token))
                          .view({local_experts_, capacity, x.size(1)});
  at::Tensor hidden = at::silu(at::bmm(packed, w1_->transpose(1, 2))) * at::bmm(packed, w3_->transpose(1, 2));
  at::Tensor result = at::bmm(hidden, w2_->transpose(1, 2)).view({local_experts_ * capacity, x.size(1)});
  at::Tensor per_pair = result.index_select(0, slot) * flat_weight.index_select(0, order).unsqueeze(1);
  return out.index_add(0, sorted_token, per_pair);
}

// ------------------------------------------------------------------ block

Block::Block(Declare& d, const std::string& p, const Args& a, bool moe, int64_t first_expert, int64_t local_experts)
    : args_(a),
      attention_norm_(&d.param(p + "attention_norm.weight", {a.dim})),
      ffn_norm_(&d.param(p + "ffn_norm.weight", {a.dim})),
      attention_(d, p + "attention.", a) {
  if (moe)
    moe_.emplace(d, p + "moe.", a, first_expert, local_experts);
  else
    mlp_.emplace(d, p + "feed_forward.", a.dim, a.dense_hidden);
}

at::Tensor Block::forward(const at::Tensor& x, const RopeTables& rope) {
  at::Tensor h = x + attention_.forward(rms_norm(x, *attention_norm_, args_.norm_eps), rope);
  at::Tensor normed = rms_norm(h, *ffn_norm_, args_.norm_eps);
  return h + (moe_ ? moe_->forward(normed) : mlp_->forward(normed));
}

// ------------------------------------------------------------------ MTP

MtpModule::MtpModule(Declare& d, const std::string& p, const Args& a, int64_t layer, int64_t first_expert,
                     int64_t local_experts)
    : args_(a),
      enorm_(&d.param(p + "enorm.weight", {a.dim})),
      hnorm_(&d.param(p + "hnorm.weight", {a.dim})),
      eh_proj_(&d.param(p + "eh_proj.weight", {a.dim, 2 * a.dim})),
      norm_(&d.param(p + "norm.weight", {a.dim})),
      block_(d, p + "block.", a, a.is_moe(layer), first_expert, local_experts) {}

at::Tensor MtpModule::forward(const at::Tensor& previous, const at::Tensor& embedded, const RopeTables& rope) {
  at::Tensor joined =
      at::cat({rms_norm(embedded, *enorm_, args_.norm_eps), rms_norm(previous, *hnorm_, args_.norm_eps)}, -1);
  return block_.forward(at::linear(joined, *eh_proj_), rope);
}

}  // namespace deepseek_v3
