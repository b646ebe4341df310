#include "part.hpp"

#include <keel/attention.hpp>
#include <keel/linear.hpp>
#include <keel/recompute.hpp>

#include <cmath>
#include <string>

namespace deepseek_v3 {

namespace {

// Token-summed cross-entropy in fp32 over labelled positions.
at::Tensor loss_sum(const at::Tensor& logits, const at::Tensor& labels) {
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(at::kFloat), labels.reshape({-1}),
                                std::nullopt, at::Reduction::Sum, KEEL_IGNORE_INDEX);
}

}  // namespace

Part::Part(keel_host* host, const Args& a, const keel_part_spec& spec, const ExpertPlacement& placement)
    : keel::Part(host, keel::part_options(spec)), args_(a), spec_(spec) {
  const bool first = spec.stage_index == 0, last = spec.stage_index == spec.num_stages - 1;
  Declare main{*this, "main"};
  const bool needs_embedding = first || (last && a.num_mtp_layers > 0);
  if (needs_embedding) {
    embedding_replica_ = !first;
    // A token reads one row of the table: 1 / vocab of it is "activated". The replica draws
    // the owner's bits (same FQN, same generator).
    embedding_ = &main.param("tok_embeddings.weight", {a.vocab_size, a.dim}, keel::init::Normal{1.0},
                             {.flags = embedding_replica_ ? uint32_t{KEEL_PARAM_REPLICA} : 0u,
                              .active_fraction = 1.0 / static_cast<double>(a.vocab_size)});
  }
  for (int64_t i = spec.first_layer; i < spec.first_layer + spec.num_layers; ++i)
    blocks_.push_back(std::make_unique<Block>(main, "layers." + std::to_string(i) + ".", a, i, placement));
  if (last) {
    // torchtitan's head: a dim^-1/2 truncated normal.
    norm_ = &main.param("norm.weight", {a.dim}, kNormInit);
    output_ = &main.param("output.weight", {a.vocab_size, a.dim},
                          keel::init::TruncatedNormal{1.0 / std::sqrt(static_cast<double>(a.dim))});
    Declare mtp{*this, "mtp"};
    for (int64_t k = 0; k < a.num_mtp_layers; ++k)
      mtp_.push_back(std::make_unique<MtpModule>(mtp, "mtp." + std::to_string(k) + ".", a, a.n_layers + k, placement));
  }
}

std::vector<Moe*> Part::moes() {
  std::vector<Moe*> out;
  for (auto& b : blocks_)
    if (b->moe() != nullptr) out.push_back(b->moe());
  for (auto& m : mtp_)
    if (m->block().moe() != nullptr) out.push_back(m->block().moe());
  return out;
}

const SequenceTables& Part::tables(int64_t seq) {
  if (seq != tables_seq_) {
    tables_ = sequence_tables(args_, seq, options().dtype(at::kFloat));
    tables_seq_ = seq;
  }
  return tables_;
}

// Full recomputation keeps a block's inputs and reruns the block in backward. The closure
// holds its own handles of the tables: the part's cache may change before the rerun.
at::Tensor Part::run_block(Block& block, const at::Tensor& h, const SequenceTables& tables) {
  if (args_.recompute != keel::Recompute::full) return block.forward(h, tables);
  return keel::recompute([&block, tables](const std::vector<at::Tensor>& in) { return block.forward(in[0], tables); },
                         {h});
}

at::Tensor Part::run_mtp(MtpModule& module, const at::Tensor& previous, const at::Tensor& embedded,
                         const SequenceTables& tables) {
  if (args_.recompute != keel::Recompute::full) return module.forward(previous, embedded, tables);
  return keel::recompute(
      [&module, tables](const std::vector<at::Tensor>& in) { return module.forward(in[0], in[1], tables); },
      {previous, embedded});
}

Part::Outputs Part::compute(const at::Tensor& tokens, const at::Tensor& labels, const at::Tensor* activation,
                            const at::Tensor* documents, const at::Tensor* positions) {
  Outputs out;
  const bool first = spec_.stage_index == 0;
  at::Tensor h = first ? at::embedding(*embedding_, tokens) : *activation;
  // The length's tables, and this microbatch's document runs and positions.
  SequenceTables tables = this->tables(h.size(1));
  if (documents != nullptr) tables.runs = keel::document_runs(*documents);
  if (positions != nullptr) tables.rope = at_positions(tables.rope, *positions);
  for (auto& block : blocks_) h = run_block(*block, h, tables);
  if (output_ == nullptr) {
    out.activation = h;
    return out;
  }
  out.logits = keel::linear(rms_norm(h, *norm_, args_.norm_eps), *output_);
  out.main_loss_sum = loss_sum(out.logits, labels);
  out.main_tokens = labels.ne(KEEL_IGNORE_INDEX).sum();
  out.loss_sum = out.main_loss_sum;
  if (mtp_.empty()) return out;

  // Depth k at position i embeds token i+k and predicts token i+k+1 (labels[i+k]). The
  // prediction is ignored past the sequence and when any of labels[i .. i+k] is: an ignored
  // label breaks the chain of next tokens (a document ends there), so token i+k+1 is not of
  // token i's document. The tokens embedded ahead are the real tokens t_0 .. t_S (the inputs
  // and the last label), never a placeholder for an ignored label.
  const int64_t batch = tokens.size(0), seq = tokens.size(1);
  const at::Tensor ignored = labels.eq(KEEL_IGNORE_INDEX);
  const at::Tensor last = labels.slice(1, seq - 1, seq);
  const at::Tensor sequence = at::cat({tokens, last.masked_fill(last.eq(KEEL_IGNORE_INDEX), 0)}, 1);
  at::Tensor chain_broken = ignored;  // depth 0: labels[i] alone
  at::Tensor previous = h;
  at::Tensor mtp_total = at::zeros({}, out.main_loss_sum.options());
  for (size_t d = 0; d < mtp_.size(); ++d) {
    const int64_t k = static_cast<int64_t>(d) + 1;
    at::Tensor ahead = at::cat({sequence.slice(1, k, seq + 1), at::zeros({batch, k - 1}, tokens.options())}, 1);
    chain_broken =
        chain_broken.logical_or(at::cat({ignored.slice(1, k, seq), at::ones({batch, k}, ignored.options())}, 1));
    at::Tensor targets = at::cat({labels.slice(1, k, seq), at::zeros({batch, k}, labels.options())}, 1)
                             .masked_fill(chain_broken, KEEL_IGNORE_INDEX);
    previous = run_mtp(*mtp_[d], previous, at::embedding(*embedding_, ahead), tables);
    at::Tensor logits = keel::linear(rms_norm(previous, mtp_[d]->norm(), args_.norm_eps), *output_);
    at::Tensor sum = loss_sum(logits, targets);
    out.mtp_logits.push_back(logits);
    out.mtp_loss_sums.push_back(sum);
    out.mtp_tokens.push_back(targets.ne(KEEL_IGNORE_INDEX).sum());
    mtp_total = mtp_total + sum;
  }
  out.loss_sum = out.main_loss_sum + mtp_total * (args_.mtp_loss_scale / static_cast<double>(mtp_.size()));
  return out;
}

void Part::forward(const keel_forward_inputs& in, keel_forward_outputs& outputs) {
  const at::Tensor* activation = in.activation != nullptr ? &keel::tensor(in.activation) : nullptr;
  const bool masked = in.struct_size >= KEEL_FORWARD_INPUTS_SIZE_1_9;
  const at::Tensor* documents = masked && in.documents != nullptr ? &keel::tensor(in.documents) : nullptr;
  const at::Tensor* positions = masked && in.positions != nullptr ? &keel::tensor(in.positions) : nullptr;
  Outputs out = compute(keel::tensor(in.tokens), keel::tensor(in.labels), activation, documents, positions);
  if (out.loss_sum.defined()) {
    keel::Host host(this->host());
    // Ratios of sums, so that each figure is weighted by its own labelled tokens over every
    // microbatch and data-parallel rank (depth k loses the last k positions of a sequence).
    host.metric_ratio("lm_loss", out.main_loss_sum.detach(), out.main_tokens.to(at::kDouble));
    if (!out.mtp_loss_sums.empty()) {
      at::Tensor sums = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(out.main_loss_sum.device()));
      at::Tensor tokens = sums.clone();
      for (size_t d = 0; d < out.mtp_loss_sums.size(); ++d) {
        const at::Tensor depth_sum = out.mtp_loss_sums[d].detach(), depth_tokens = out.mtp_tokens[d].to(at::kDouble);
        host.metric_ratio(("mtp_loss." + std::to_string(d + 1)).c_str(), depth_sum, depth_tokens);
        sums = sums + depth_sum;
        tokens = tokens + depth_tokens;
      }
      host.metric_ratio("mtp_loss", sums, tokens);  // every depth's tokens pooled
    }
    keel::tensor(outputs.loss_sum) = out.loss_sum;
  } else {
    keel::tensor(outputs.activation) = out.activation;
  }
}

}  // namespace deepseek_v3
