// One pipeline part of a Llama 3 model: the embedding on the first stage, a run of
// transformer blocks (RMSNorm, RoPE, grouped-query attention, SwiGLU), and the final norm and
// output head on the last stage. FQNs follow torchtitan's Llama 3.
//
// With tie_embeddings the head is the embedding (logits = h E^T, no output.weight): a single
// stage uses one tensor twice; under pipeline parallelism a last stage that is not also the
// first holds a REPLICA of tok_embeddings.weight, kept exact by the model (keel::StageReplicas).
#pragma once

#include <keel/attention.hpp>
#include <keel/keel.hpp>

#include <optional>
#include <vector>

#include "llama3_args.hpp"

namespace llama3 {

class Part final : public keel::Part {
 public:
  Part(keel_host* host, const Args& args, const keel_part_spec& spec);
  void forward(const keel_forward_inputs& inputs, keel_forward_outputs& outputs) override;
  /// The logits ([batch, seq, vocab]) of `tokens`; for a part holding the whole model.
  at::Tensor logits(const at::Tensor& tokens);
  /// The token embedding this part holds (the owner, or the tied head's REPLICA), or nullptr.
  at::Tensor* tok_embeddings() { return tok_embeddings_; }

 private:
  struct Block {
    at::Tensor *attention_norm, *wq, *wk, *wv, *wo, *ffn_norm, *w1, *w2, *w3;
  };
  // What every block of one forward shares: RoPE's cos and sin ([1 or batch, seq, 1,
  // head_dim / 2]) and, under document masking, the microbatch's document runs.
  struct Sequence {
    at::Tensor cos, sin;
    std::optional<keel::DocumentRuns> runs;
  };
  at::Tensor attention(const Block& b, const at::Tensor& x, const Sequence& sequence) const;
  at::Tensor feed_forward(const Block& b, const at::Tensor& x) const;
  /// One transformer block: attention and feed-forward, each around a residual.
  at::Tensor block(const Block& b, const at::Tensor& x, const Sequence& sequence) const;
  // The embedding (first stage) or the previous stage's activation through this part's blocks;
  // `documents` and `positions` as keel_forward_inputs gives them, or nullptr.
  at::Tensor trunk(const at::Tensor& tokens, const at::Tensor* activation, const at::Tensor* documents,
                   const at::Tensor* positions) const;
  // The final norm and the output head (last stage).
  at::Tensor head(const at::Tensor& h) const;

  Args args_;
  keel_part_spec spec_;
  bool first_ = false;                    // embeds the tokens
  at::Tensor* tok_embeddings_ = nullptr;  // first stage, and a tied last stage
  at::Tensor* norm_ = nullptr;
  at::Tensor* output_ = nullptr;  // the head's weight (tok_embeddings_ when tied), last stage
  std::vector<Block> blocks_;
};

}  // namespace llama3
