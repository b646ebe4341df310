#include "llama3_part.hpp"

#include <keel/attention.hpp>
#include <keel/init.hpp>
#include <keel/linear.hpp>
#include <keel/recompute.hpp>

#include <cmath>

#include "llama3_rope.hpp"

namespace llama3 {

namespace {

// Rotates interleaved pairs (x[2i], x[2i+1]) of the last dim by the position's angles.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  auto sizes = x.sizes().vec();
  sizes.back() /= 2;
  sizes.push_back(2);
  at::Tensor pairs = x.reshape(sizes);
  at::Tensor even = pairs.select(-1, 0), odd = pairs.select(-1, 1);
  at::Tensor rotated = at::stack({even * cos - odd * sin, even * sin + odd * cos}, -1);
  return rotated.flatten(-2);
}

}  // namespace

// torchtitan's Llama 3 init, each rule at its declaration: N(0, 1) embeddings, N(0, 0.02)
// input projections, depth-scaled output projections (wo, w2, w3), unit norms, and a dim^-1/2
// truncated normal head.
//
// A tied table is both ends at once, drawn as Hugging Face's Llama draws it (the tied Llama 3.2
// checkpoints were trained from it): a 0.02 truncated normal. The head then sees, at init,
// an input token's own logit of about 0.02 dim (5 at debug width) and the first loss stays
// near ln(vocab) (7.68 against 7.62 on llama3_debug.toml). Smaller tables starve the blocks:
// at 1/dim the token's row drowns in the blocks' outputs and 80 steps of llama3_debug.toml
// end at 6.68 (0.02: 1.89; untied: 1.67); an untied model whose input embedding is drawn at
// 1/dim stalls alike (6.30). The head's dim^-1/2 overshoots the other way (first loss 14.9).
// The draw is keyed by the FQN, so a REPLICA starts with the owner's bits.
Part::Part(keel_host* host, const Args& args, const keel_part_spec& spec)
    : keel::Part(host, keel::part_options(spec)), args_(args), spec_(spec), first_(spec.stage_index == 0) {
  using keel::init::Constant, keel::init::Normal, keel::init::TruncatedNormal;
  const int64_t d = args.dim, hd = args.head_dim();
  const bool last = spec.stage_index == spec.num_stages - 1;
  const double dim = static_cast<double>(d);
  const TruncatedNormal projection{0.02}, depth_scaled{0.02 / std::sqrt(2.0 * static_cast<double>(args.n_layers))};
  const Constant unit{1.0};
  if (first_ || (last && args.tie_embeddings)) {
    // A token reads one row of the table: 1 / vocab of it is "activated"; a tied head reads
    // all of it.
    const keel::init::Rule rule = args.tie_embeddings ? keel::init::Rule{projection} : Normal{1.0};
    const keel::ParamOptions options{
        .flags = first_ ? 0u : uint32_t{KEEL_PARAM_REPLICA},
        .active_fraction = args.tie_embeddings ? 1.0 : 1.0 / static_cast<double>(args.vocab_size)};
    tok_embeddings_ = &param("tok_embeddings.weight", {args.vocab_size, d}, rule, options);
  }
  for (int i = spec.first_layer; i < spec.first_layer + spec.num_layers; ++i) {
    std::string p = "layers." + std::to_string(i) + ".";
    Block b{};
    b.attention_norm = &param(p + "attention_norm.weight", {d}, unit);
    b.wq = &param(p + "attention.wq.weight", {args.n_heads * hd, d}, projection);
    b.wk = &param(p + "attention.wk.weight", {args.n_kv_heads * hd, d}, projection);
    b.wv = &param(p + "attention.wv.weight", {args.n_kv_heads * hd, d}, projection);
    b.wo = &param(p + "attention.wo.weight", {d, args.n_heads * hd}, depth_scaled);
    b.ffn_norm = &param(p + "ffn_norm.weight", {d}, unit);
    b.w1 = &param(p + "feed_forward.w1.weight", {args.ffn_hidden, d}, projection);
    b.w2 = &param(p + "feed_forward.w2.weight", {d, args.ffn_hidden}, depth_scaled);
    b.w3 = &param(p + "feed_forward.w3.weight", {args.ffn_hidden, d}, depth_scaled);
    blocks_.push_back(b);
  }
  if (last) {
    norm_ = &param("norm.weight", {d}, unit);
    output_ = args.tie_embeddings
                  ? tok_embeddings_
                  : &param("output.weight", {args.vocab_size, d}, TruncatedNormal{1.0 / std::sqrt(dim)});
  }
}

at::Tensor Part::attention(const Block& b, const at::Tensor& x, const Sequence& sequence) const {
  const at::Tensor &cos = sequence.cos, &sin = sequence.sin;
  const int64_t batch = x.size(0), seq = x.size(1), hd = args_.head_dim();
  at::Tensor q = keel::linear(x, *b.wq).view({batch, seq, args_.n_heads, hd});
  at::Tensor k = keel::linear(x, *b.wk).view({batch, seq, args_.n_kv_heads, hd});
  at::Tensor v = keel::linear(x, *b.wv).view({batch, seq, args_.n_kv_heads, hd});
  q = apply_rope(q, cos, sin).transpose(1, 2);
  k = apply_rope(k, cos, sin).transpose(1, 2);
  v = v.transpose(1, 2);
  // Held by value: selective recomputation reruns the core in backward, after trunk returned.
  auto core = [runs = sequence.runs](const std::vector<at::Tensor>& t) {
    return runs ? keel::block_causal_attention(t[0], t[1], t[2], *runs) : keel::causal_attention(t[0], t[1], t[2]);
  };
  // Selective recomputation keeps q, k, v and reruns the attention itself in backward.
  at::Tensor out = args_.recompute == keel::Recompute::selective ? keel::recompute(core, {q, k, v}) : core({q, k, v});
  return keel::linear(out.transpose(1, 2).reshape({batch, seq, args_.n_heads * hd}), *b.wo);
}

at::Tensor Part::feed_forward(const Block& b, const at::Tensor& x) const {
  auto product = [](const std::vector<at::Tensor>& t) { return at::silu(t[0]) * t[1]; };
  const std::vector<at::Tensor> gate_up = {keel::linear(x, *b.w1), keel::linear(x, *b.w3)};
  // Selective recomputation keeps the two projections and reruns the SwiGLU product.
  at::Tensor hidden =
      args_.recompute == keel::Recompute::selective ? keel::recompute(product, gate_up) : product(gate_up);
  return keel::linear(hidden, *b.w2);
}

at::Tensor Part::block(const Block& b, const at::Tensor& x, const Sequence& sequence) const {
  if (args_.recompute != keel::Recompute::lean) {
    at::Tensor h = x + attention(b, at::rms_norm(x, {args_.dim}, *b.attention_norm, args_.norm_eps), sequence);
    return h + feed_forward(b, at::rms_norm(h, {args_.dim}, *b.ffn_norm, args_.norm_eps));
  }
  // Lean recomputation keeps x and h between the sub-layers and reruns each sub-layer, its norm
  // and residual included, from them. The residual stays inside: x feeds the norm's ops and the
  // residual, and only with all of them in one region do their gradients meet in the order they
  // meet without it, which keeps the run bitwise the kept one.
  auto attend = [this, &b, sequence](const std::vector<at::Tensor>& in) {
    return in[0] + attention(b, at::rms_norm(in[0], {args_.dim}, *b.attention_norm, args_.norm_eps), sequence);
  };
  at::Tensor h = keel::recompute(attend, {x});
  auto feed = [this, &b](const std::vector<at::Tensor>& in) {
    return in[0] + feed_forward(b, at::rms_norm(in[0], {args_.dim}, *b.ffn_norm, args_.norm_eps));
  };
  return keel::recompute(feed, {h});
}

at::Tensor Part::trunk(const at::Tensor& tokens, const at::Tensor* activation, const at::Tensor* documents,
                       const at::Tensor* positions) const {
  at::Tensor h = first_ ? at::embedding(*tok_embeddings_, tokens) : *activation;
  const int64_t batch = h.size(0), seq = h.size(1), half = args_.head_dim() / 2;
  const at::Tensor freqs = rope_frequencies(args_, h.options());
  // Per sample where positions restart at each document, else one row of positions for all.
  const at::Tensor angles =
      positions != nullptr ? (positions->to(at::kFloat).unsqueeze(-1) * freqs).view({batch, seq, 1, half})
                           : at::outer(at::arange(seq, h.options().dtype(at::kFloat)), freqs).view({1, seq, 1, half});
  Sequence sequence{angles.cos(), angles.sin(), std::nullopt};
  if (documents != nullptr) sequence.runs = keel::document_runs(*documents);
  for (const Block& b : blocks_) {
    if (args_.recompute != keel::Recompute::full) {
      h = block(b, h, sequence);
      continue;
    }
    // Full recomputation keeps the block's input and reruns the block in backward.
    h = keel::recompute([this, &b, sequence](const std::vector<at::Tensor>& in) { return block(b, in[0], sequence); },
                        {h});
  }
  return h;
}

at::Tensor Part::head(const at::Tensor& h) const {
  return keel::linear(at::rms_norm(h, {args_.dim}, *norm_, args_.norm_eps), *output_);
}

at::Tensor Part::logits(const at::Tensor& tokens) {
  if (!first_ || output_ == nullptr)
    throw keel::Error(KEEL_ERROR_INVALID_ARGUMENT, "llama3: logits() needs a part holding the whole model");
  return head(trunk(tokens, nullptr, nullptr, nullptr));
}

void Part::forward(const keel_forward_inputs& inputs, keel_forward_outputs& outputs) {
  const at::Tensor* activation = inputs.activation != nullptr ? &keel::tensor(inputs.activation) : nullptr;
  const bool masked = inputs.struct_size >= KEEL_FORWARD_INPUTS_SIZE_1_9;
  const at::Tensor* documents = masked && inputs.documents != nullptr ? &keel::tensor(inputs.documents) : nullptr;
  const at::Tensor* positions = masked && inputs.positions != nullptr ? &keel::tensor(inputs.positions) : nullptr;
  at::Tensor h = trunk(keel::tensor(inputs.tokens), activation, documents, positions);
  if (output_ == nullptr) {
    keel::tensor(outputs.activation) = h;
    return;
  }
  at::Tensor logits = head(h);
  const at::Tensor& labels = keel::tensor(inputs.labels);
  keel::tensor(outputs.loss_sum) =
      at::cross_entropy_loss(logits.reshape({-1, args_.vocab_size}).to(at::kFloat), labels.reshape({-1}),
                             /*weight=*/std::nullopt, at::Reduction::Sum, KEEL_IGNORE_INDEX);
}

}  // namespace llama3
