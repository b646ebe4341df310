// One pipeline part of DeepSeek-V3 with MTP: the token embedding on the first stage, a run of
// blocks, and on the last stage the final norm, the output head and the MTP modules. A last
// stage that is not also the first holds a REPLICA of tok_embeddings.weight (MTP embeds the
// tokens ahead with it) under the same FQN.
#pragma once

#include <keel/keel.hpp>

#include <memory>
#include <vector>

#include "args.hpp"
#include "modules.hpp"

namespace deepseek_v3 {

class Part final : public keel::Part {
 public:
  /// Builds the part of `spec` holding the routed experts of `placement`.
  Part(keel_host* host, const Args& args, const keel_part_spec& spec, const ExpertPlacement& placement);

  void forward(const keel_forward_inputs& inputs, keel_forward_outputs& outputs) override;

  /// Everything one microbatch computes (the logits and per-depth losses are for tests).
  struct Outputs {
    at::Tensor activation;  ///< non-last stages
    at::Tensor logits;      ///< last stage: main logits [batch, seq, vocab]
    at::Tensor main_loss_sum, loss_sum;
    at::Tensor main_tokens;  ///< labelled positions (a device scalar: no host read)
    std::vector<at::Tensor> mtp_logits, mtp_loss_sums;
    std::vector<at::Tensor> mtp_tokens;
  };
  /// Runs one microbatch; `documents` and `positions` as keel_forward_inputs gives them
  /// (nullptr: causal attention over the whole sample, positions 0 .. seq-1).
  Outputs compute(const at::Tensor& tokens, const at::Tensor& labels, const at::Tensor* activation,
                  const at::Tensor* documents = nullptr, const at::Tensor* positions = nullptr);

  /// The part's MoE layers (blocks and MTP blocks).
  std::vector<Moe*> moes();
  /// The part's token embedding (owner or replica), or nullptr.
  at::Tensor* embedding() { return embedding_; }
  /// Whether the embedding held here is a REPLICA.
  bool embedding_is_replica() const { return embedding_replica_; }
  /// The spec the part was built from.
  const keel_part_spec& spec() const { return spec_; }

 private:
  const SequenceTables& tables(int64_t seq);
  at::Tensor run_block(Block& block, const at::Tensor& h, const SequenceTables& tables);
  at::Tensor run_mtp(MtpModule& module, const at::Tensor& previous, const at::Tensor& embedded,
                     const SequenceTables& tables);

  const Args& args_;
  keel_part_spec spec_;
  at::Tensor* embedding_ = nullptr;
  bool embedding_replica_ = false;
  at::Tensor *norm_ = nullptr, *output_ = nullptr;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::vector<std::unique_ptr<MtpModule>> mtp_;
  int64_t tables_seq_ = -1;
  SequenceTables tables_;
};

}  // namespace deepseek_v3
