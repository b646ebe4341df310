#include "modules.hpp"

#include <ATen/autocast_mode.h>
#include <c10/core/GradMode.h>
#include <keel/attention.hpp>
#include <keel/autograd.hpp>
#include <keel/linear.hpp>
#include <keel/recompute.hpp>

#include <functional>
#include <limits>

namespace deepseek_v3 {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (x.scalar_type() == at::kFloat) return at::rms_norm(x, {x.size(-1)}, weight, eps);  // one fused kernel
  at::Tensor x32 = x.to(at::kFloat);
  at::Tensor normed = x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

// ------------------------------------------------------------------ attention

Attention::Attention(Declare& d, const std::string& p, const Args& a, const keel::init::Rule& residual) : args_(a) {
  const int64_t qk = a.qk_head_dim();
  if (a.q_lora_rank == 0) {
    wq_ = &d.param(p + "wq.weight", {a.n_heads * qk, a.dim}, kProjectionInit);
  } else {
    wq_a_ = &d.param(p + "wq_a.weight", {a.q_lora_rank, a.dim}, kProjectionInit);
    q_norm_ = &d.param(p + "q_norm.weight", {a.q_lora_rank}, kNormInit);
    wq_b_ = &d.param(p + "wq_b.weight", {a.n_heads * qk, a.q_lora_rank}, kProjectionInit);
  }
  wkv_a_ = &d.param(p + "wkv_a.weight", {a.kv_lora_rank + a.qk_rope_head_dim, a.dim}, kProjectionInit);
  kv_norm_ = &d.param(p + "kv_norm.weight", {a.kv_lora_rank}, kNormInit);
  wkv_b_ =
      &d.param(p + "wkv_b.weight", {a.n_heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank}, kProjectionInit);
  wo_ = &d.param(p + "wo.weight", {a.dim, a.n_heads * a.v_head_dim}, residual);
}

at::Tensor Attention::forward(const at::Tensor& x, const SequenceTables& tables) const {
  const Args& a = args_;
  const int64_t b = x.size(0), s = x.size(1), h = a.n_heads;
  at::Tensor q = wq_ != nullptr ? keel::linear(x, *wq_)
                                : keel::linear(rms_norm(keel::linear(x, *wq_a_), *q_norm_, a.norm_eps), *wq_b_);
  q = q.view({b, s, h, a.qk_head_dim()});
  std::vector<at::Tensor> q_parts = q.split({a.qk_nope_head_dim, a.qk_rope_head_dim}, -1);
  std::vector<at::Tensor> kv_parts = keel::linear(x, *wkv_a_).split({a.kv_lora_rank, a.qk_rope_head_dim}, -1);
  at::Tensor k_rope = apply_rope(kv_parts[1].view({b, s, 1, a.qk_rope_head_dim}), tables.rope);
  at::Tensor q_rope = apply_rope(q_parts[1], tables.rope);
  at::Tensor kv = keel::linear(rms_norm(kv_parts[0], *kv_norm_, a.norm_eps), *wkv_b_)
                      .view({b, s, h, a.qk_nope_head_dim + a.v_head_dim});
  std::vector<at::Tensor> k_v = kv.split({a.qk_nope_head_dim, a.v_head_dim}, -1);
  const double scale = softmax_scale(a);
  const std::vector<at::Tensor> parts = {q_parts[0], k_v[0], q_rope, k_rope, k_v[1]};
  std::function<at::Tensor(const std::vector<at::Tensor>&)> core;  // q_nope, k_nope, q_rope, k_rope, v
  if (tables.runs || fused_attention(a, x.device(), s)) {
    // The fused kernel keeps O(s) per head: one query and key of both parts, the rope key
    // copied to every head; under document masking, one call per run of documents.
    const std::optional<keel::DocumentRuns> runs = tables.runs;
    // Concatenated as [b, h, s, d], the layout the CPU kernel reads.
    core = [scale, b, s, h, runs](const std::vector<at::Tensor>& t) {
      at::Tensor query = at::cat({t[0].transpose(1, 2), t[2].transpose(1, 2)}, -1);
      at::Tensor key = at::cat({t[1].transpose(1, 2), t[3].expand({b, s, h, t[3].size(-1)}).transpose(1, 2)}, -1);
      at::Tensor value = t[4].transpose(1, 2);
      return runs ? keel::block_causal_attention(query, key, value, *runs, scale)
                  : keel::causal_attention(query, key, value, scale);
    };
  } else {
    // Short sequences: the scores of the no-rope and rope parts apart, [b, h, s, s]. The rope
    // key is one head that broadcasts over all, so no query or key is concatenated and no key
    // expanded, whose copies and gradient splits cost more than the attention here.
    const at::Tensor future = tables.future;
    core = [scale, future](const std::vector<at::Tensor>& t) {
      at::Tensor scores = at::matmul(t[0].transpose(1, 2), t[1].permute({0, 2, 3, 1})) +
                          at::matmul(t[2].transpose(1, 2), t[3].permute({0, 2, 3, 1}));
      at::Tensor probs =
          at::softmax((scores * scale).masked_fill(future, -std::numeric_limits<double>::infinity()), -1, at::kFloat);
      return at::matmul(probs.to(scores.scalar_type()), t[4].transpose(1, 2));
    };
  }
  // Selective recomputation keeps the projections and reruns the core in backward: on the
  // materialised path its [b, h, s, s] tensors are most of a block's activations.
  at::Tensor out = a.recompute == keel::Recompute::selective ? keel::recompute(core, parts) : core(parts);
  return keel::linear(out.transpose(1, 2).reshape({b, s, h * a.v_head_dim}), *wo_);
}

bool fused_attention(const Args& args, const at::Device& device, int64_t seq) {
  if ((args.attention_flags & KEEL_ATTENTION_BLOCK_CAUSAL) != 0) return true;  // one fused call per run
  if (args.attention_kernel == "auto") return keel::fused_attention_pays(device, seq);
  return args.attention_kernel == "fused";
}

SequenceTables sequence_tables(const Args& args, int64_t seq, const at::TensorOptions& options) {
  SequenceTables out{rope_tables(args, seq, options), {}, std::nullopt};
  if (!fused_attention(args, options.device(), seq))
    out.future = at::ones({seq, seq}, options.dtype(at::kBool)).triu(1);
  return out;
}

// ------------------------------------------------------------------ dense MLP

Mlp::Mlp(Declare& d, const std::string& p, int64_t dim, int64_t hidden, const keel::init::Rule& residual,
         keel::Recompute recompute)
    : recompute_(recompute) {
  w1_ = &d.param(p + "w1.weight", {hidden, dim}, kProjectionInit);
  w2_ = &d.param(p + "w2.weight", {dim, hidden}, residual);
  w3_ = &d.param(p + "w3.weight", {hidden, dim}, residual);
}

namespace {

// The weight `w` as autocast's products read it: cast through autocast's cache, so once a step.
// A product of its transposed view would cast that view afresh each call (autocast caches no
// view), and each microbatch in flight would keep its own copy.
at::Tensor compute_weight(const at::Tensor& w) {
  const at::DeviceType type = w.device().type();
  if (!at::autocast::is_autocast_enabled(type)) return w;
  return at::autocast::cached_cast(at::autocast::get_autocast_dtype(type), w, type);
}

// silu(gate) * up; selective recomputation keeps the two projections only.
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up, keel::Recompute recompute) {
  auto product = [](const std::vector<at::Tensor>& t) { return at::silu(t[0]) * t[1]; };
  return recompute == keel::Recompute::selective ? keel::recompute(product, {gate, up}) : product({gate, up});
}

}  // namespace

at::Tensor Mlp::forward(const at::Tensor& x) const {
  if (recompute_ != keel::Recompute::lean) return products(x);
  // Lean recomputation keeps the input only and reruns all three products.
  return keel::recompute([mlp = this](const std::vector<at::Tensor>& in) { return mlp->products(in[0]); }, {x});
}

at::Tensor Mlp::products(const at::Tensor& x) const {
  const keel::Recompute inner = recompute_ == keel::Recompute::lean ? keel::Recompute::none : recompute_;
  return keel::linear(swiglu(keel::linear(x, *w1_), keel::linear(x, *w3_), inner), *w2_);
}

// ------------------------------------------------------------------ MoE

Moe::Moe(Declare& d, const std::string& p, const Args& a, const ExpertPlacement& placement,
         const keel::init::Rule& residual)
    : args_(a), prefix_(p), placement_(placement) {
  const int64_t e = a.n_routed_experts;
  gate_ = &d.param(p + "router.gate.weight", {e, a.dim}, residual);
  expert_bias_ = &d.buffer(p + "expert_bias", {e}, keel::init::Constant{0.0}, /*persistent=*/true);
  tokens_per_expert_ = &d.buffer(p + "tokens_per_expert", {e}, keel::init::Constant{0.0}, /*persistent=*/false);
  // Each expert is drawn from its own generator (ParamRecord::initialise): any ep draws the same experts.
  const auto experts = keel::ParamOptions::experts(placement.first, e, static_cast<double>(a.top_k) / e);
  const int64_t local = placement.local;
  w1_ = &d.param(p + "experts.w1", {local, a.moe_hidden, a.dim}, kProjectionInit, experts);
  w2_ = &d.param(p + "experts.w2", {local, a.dim, a.moe_hidden}, residual, experts);
  w3_ = &d.param(p + "experts.w3", {local, a.moe_hidden, a.dim}, residual, experts);
  if (a.n_shared_experts > 0)
    shared_.emplace(d, p + "shared_experts.", a.dim, a.moe_hidden * a.n_shared_experts, residual, a.recompute);
}

at::Tensor Moe::forward(const at::Tensor& x) {
  const Args& a = args_;
  const auto shape = x.sizes().vec();
  at::Tensor tokens = x.reshape({-1, a.dim});
  const int64_t n = tokens.size(0), e = a.n_routed_experts;
  auto router = [gate = gate_](const std::vector<at::Tensor>& in) {
    return keel::linear(in[0].to(at::kFloat), gate->to(at::kFloat));
  };
  // Lean recomputation reruns the router's product, whose input the shared experts keep.
  at::Tensor logits = a.recompute == keel::Recompute::lean ? keel::recompute(router, {tokens}) : router({tokens});
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
  if (!keel::recomputing()) {  // a rerun in backward routes the same tokens again: count them once
    c10::NoGradGuard no_grad;
    tokens_per_expert_->add_(at::bincount(indices.flatten(), {}, e).to(at::kFloat));
  }
  at::Tensor out = routed(tokens, indices, weights.to(tokens.scalar_type()));
  if (shared_) out = out + shared_->forward(tokens);
  return out.view(shape);
}

// The (token, expert) pairs sorted by expert — so by the rank holding the expert — go
// through their experts, are weighted there, and come back into their tokens. With ep > 1 the
// sorted rows and their weights travel by differentiable all-to-all: split sizes first (the
// counts each rank sends to each of another's experts), then the rows and weights, then the
// weighted results back with the splits swapped. Weighting beside the experts lets lean
// recomputation rerun it with them, so that no expert output is kept.
at::Tensor Moe::routed(const at::Tensor& x, const at::Tensor& indices, const at::Tensor& weights) const {
  const int64_t k = indices.size(1), e = args_.n_routed_experts;
  at::Tensor flat_expert = indices.flatten();
  at::Tensor order = at::argsort(flat_expert, /*stable=*/true);
  at::Tensor sorted_expert = flat_expert.index_select(0, order);
  at::Tensor sorted_token = at::div(order, k, "floor");  // pair i is (token i / k, choice i % k)
  at::Tensor sorted_weight = weights.flatten().index_select(0, order).unsqueeze(1);
  at::Tensor rows = x.index_select(0, sorted_token);
  // Under autocast the experts' products read their rows in the compute dtype: the rows are
  // cast before they travel and are kept (half the bytes; the products see the same values).
  const at::DeviceType type = x.device().type();
  if (at::autocast::is_autocast_enabled(type)) rows = rows.to(at::autocast::get_autocast_dtype(type));
  at::Tensor weighted;
  if (placement_.ep == 1) {
    weighted = run_experts(rows, sorted_expert, sorted_weight);
  } else {
    const ExpertPlacement& p = placement_;
    keel::Host host(p.host);
    at::Tensor send_counts = at::bincount(sorted_expert, {}, e).view({p.ep, p.local}).contiguous();
    at::Tensor recv_counts = at::empty_like(send_counts);  // [source rank, local expert]
    const std::vector<int64_t> ones(static_cast<size_t>(p.ep), 1);
    host.all_to_all(p.group, recv_counts, send_counts, ones, ones);
    // Split sizes are host numbers: one read of the device per layer and direction.
    at::Tensor send_splits = send_counts.sum(1).cpu(), recv_splits = recv_counts.sum(1).cpu();
    std::vector<int64_t> input_splits(send_splits.data_ptr<int64_t>(), send_splits.data_ptr<int64_t>() + p.ep);
    std::vector<int64_t> output_splits(recv_splits.data_ptr<int64_t>(), recv_splits.data_ptr<int64_t>() + p.ep);
    at::Tensor arrived = keel::autograd::all_to_all(host, p.group, rows, output_splits, input_splits);
    // Rows arrive by source rank, each source's rows sorted by expert.
    at::Tensor local_ids = at::arange(p.local, indices.options()).repeat({p.ep});
    at::Tensor arrived_expert = local_ids.repeat_interleave(recv_counts.flatten());
    at::Tensor arrived_weight = keel::autograd::all_to_all(host, p.group, sorted_weight, output_splits, input_splits);
    at::Tensor computed = run_experts(arrived, arrived_expert, arrived_weight);
    weighted = keel::autograd::all_to_all(host, p.group, computed, input_splits, output_splits);
  }
  // Back in each token's order (pair i is token i / k, choice i % k) and summed over its k
  // choices. An index_add into the tokens would keep every weighted row for its backward
  // (autograd keeps an index_add's source); an index_select keeps its indices only.
  at::Tensor unsorted = at::empty_like(order).scatter_(0, order, at::arange(order.size(0), order.options()));
  return weighted.index_select(0, unsorted).view({x.size(0), k, x.size(1)}).sum(1);
}

// Every row through the SwiGLU of its local expert, times its weight: rows packed into padded
// slots of [local_experts, capacity, dim]. Where keel::linear runs on oneDNN (fp32 on CPU) each
// expert runs its three products over its own slots, the capacity rounded up to
// kOneDnnExpertSlots (faster than the batched BLAS products: BENCHMARKS.md); elsewhere all
// experts run as three batched matmuls. One host read per call (the capacity) replaces any
// read per expert; LibTorch 2.15's CPU _grouped_mm is not used because it needs
// 16-byte-aligned strides and fails in backward on empty groups. An empty input still runs the
// (empty) matmuls, so every expert weight gets a gradient on every rank. Lean recomputation
// keeps each expert's slots and weights only: its products, SwiGLU and weighting rerun.
at::Tensor Moe::run_experts(const at::Tensor& rows, const at::Tensor& expert, const at::Tensor& weight) const {
  const int64_t local = placement_.local, r = rows.size(0), dim = rows.size(1);
  const bool apart = r > 0 && keel::linear_uses_onednn(rows, w1_->select(0, 0));
  at::Tensor counts = at::bincount(expert, {}, local);
  const int64_t busiest = r > 0 ? counts.max().item<int64_t>() : 0;
  const int64_t capacity =
      apart ? (busiest + kOneDnnExpertSlots - 1) / kOneDnnExpertSlots * kOneDnnExpertSlots : busiest;
  at::Tensor order = at::argsort(expert, /*stable=*/true);
  at::Tensor sorted = expert.index_select(0, order);
  at::Tensor starts = counts.cumsum(0) - counts;
  at::Tensor slot_sorted = sorted * capacity + (at::arange(r, expert.options()) - starts.index_select(0, sorted));
  at::Tensor slot = at::empty_like(slot_sorted).scatter_(0, order, slot_sorted);
  // Each slot's row, and for a padding slot a zero row past the end: packed by index_select,
  // which keeps its indices only (an index_add would keep the rows for its backward).
  at::Tensor row_of_slot =
      at::full({local * capacity}, r, expert.options()).scatter_(0, slot, at::arange(r, expert.options()));
  at::Tensor packed =
      at::cat({rows, at::zeros({1, dim}, rows.options())}).index_select(0, row_of_slot).view({local, capacity, dim});
  at::Tensor packed_weight =
      at::cat({weight, at::zeros({1, 1}, weight.options())}).index_select(0, row_of_slot).view({local, capacity, 1});
  const bool lean = args_.recompute == keel::Recompute::lean;
  const keel::Recompute inner = lean ? keel::Recompute::none : args_.recompute;
  at::Tensor result;
  if (apart) {
    const std::vector<at::Tensor> slots = packed.unbind(0), slot_weights = packed_weight.unbind(0);
    std::vector<at::Tensor> outputs;
    outputs.reserve(static_cast<size_t>(local));
    for (size_t i = 0; i < slots.size(); ++i) {
      const int64_t e = static_cast<int64_t>(i);
      auto expert_out = [moe = this, e, inner](const std::vector<at::Tensor>& in) {
        return keel::linear(swiglu(keel::linear(in[0], moe->w1_->select(0, e)),
                                   keel::linear(in[0], moe->w3_->select(0, e)), inner),
                            moe->w2_->select(0, e)) *
               in[1];
      };
      outputs.push_back(lean ? keel::recompute(expert_out, {slots[i], slot_weights[i]})
                             : expert_out({slots[i], slot_weights[i]}));
    }
    result = at::cat(outputs);
  } else {
    auto experts_out = [moe = this, inner, local, capacity, dim](const std::vector<at::Tensor>& in) {
      at::Tensor hidden = swiglu(at::bmm(in[0], compute_weight(*moe->w1_).transpose(1, 2)),
                                 at::bmm(in[0], compute_weight(*moe->w3_).transpose(1, 2)), inner);
      return (at::bmm(hidden, compute_weight(*moe->w2_).transpose(1, 2)) * in[1]).view({local * capacity, dim});
    };
    result = lean ? keel::recompute(experts_out, {packed, packed_weight}) : experts_out({packed, packed_weight});
  }
  return result.index_select(0, slot);
}

// ------------------------------------------------------------------ block

Block::Block(Declare& d, const std::string& p, const Args& a, int64_t layer, const ExpertPlacement& placement)
    : args_(a),
      attention_norm_(&d.param(p + "attention_norm.weight", {a.dim}, kNormInit)),
      ffn_norm_(&d.param(p + "ffn_norm.weight", {a.dim}, kNormInit)),
      attention_(d, p + "attention.", a, residual_init(layer)) {
  if (a.is_moe(layer))
    moe_.emplace(d, p + "moe.", a, placement, residual_init(layer));
  else
    mlp_.emplace(d, p + "feed_forward.", a.dim, a.dense_hidden, residual_init(layer), a.recompute);
}

at::Tensor Block::forward(const at::Tensor& x, const SequenceTables& tables) {
  if (args_.recompute != keel::Recompute::lean) {
    at::Tensor h = x + attention_.forward(rms_norm(x, *attention_norm_, args_.norm_eps), tables);
    at::Tensor normed = rms_norm(h, *ffn_norm_, args_.norm_eps);
    return h + (moe_ ? moe_->forward(normed) : mlp_->forward(normed));
  }
  // Lean recomputation keeps the block's input x and h between the sub-layers and reruns each
  // sub-layer, its norm and residual included, from them; an MoE keeps its norm and normed
  // input and reruns its router and experts (Moe::forward). The residual stays inside a region:
  // x feeds the norm's ops and the residual, and only with all of them in one region do their
  // gradients meet in the order they meet without it, which keeps the run bitwise the kept one.
  // The closure holds its own handles of the tables, which the part's cache may replace.
  auto attention = [block = this, tables](const std::vector<at::Tensor>& in) {
    return in[0] + block->attention_.forward(rms_norm(in[0], *block->attention_norm_, block->args_.norm_eps), tables);
  };
  at::Tensor h = keel::recompute(attention, {x});
  if (moe_) return h + moe_->forward(rms_norm(h, *ffn_norm_, args_.norm_eps));
  auto feed_forward = [block = this](const std::vector<at::Tensor>& in) {
    return in[0] + block->mlp_->products(rms_norm(in[0], *block->ffn_norm_, block->args_.norm_eps));
  };
  return keel::recompute(feed_forward, {h});
}

// ------------------------------------------------------------------ MTP

MtpModule::MtpModule(Declare& d, const std::string& p, const Args& a, int64_t layer, const ExpertPlacement& placement)
    : args_(a),
      enorm_(&d.param(p + "enorm.weight", {a.dim}, kNormInit)),
      hnorm_(&d.param(p + "hnorm.weight", {a.dim}, kNormInit)),
      eh_proj_(&d.param(p + "eh_proj.weight", {a.dim, 2 * a.dim}, kProjectionInit)),
      norm_(&d.param(p + "norm.weight", {a.dim}, kNormInit)),
      block_(d, p + "block.", a, layer, placement) {}

at::Tensor MtpModule::forward(const at::Tensor& previous, const at::Tensor& embedded, const SequenceTables& tables) {
  at::Tensor joined =
      at::cat({rms_norm(embedded, *enorm_, args_.norm_eps), rms_norm(previous, *hnorm_, args_.norm_eps)}, -1);
  return block_.forward(keel::linear(joined, *eh_proj_), tables);
}

}  // namespace deepseek_v3
