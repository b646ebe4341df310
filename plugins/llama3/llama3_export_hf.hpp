// Llama 3 as Hugging Face transformers' LlamaForCausalLM: Keel's canonical FQNs mapped to
// transformers' names, and config.json. Keel rotates interleaved pairs (x[2i], x[2i+1]) where
// transformers rotates halves (x[i], x[i + head_dim/2]), so the rows of wq and wk are permuted
// per head as Meta's-to-transformers conversion does; attention scores are unchanged.
#pragma once

#include <keel/keel.hpp>

#include <map>
#include <string>

#include "llama3_args.hpp"

namespace llama3 {

/// The transformers name of a canonical FQN, or "" when there is none.
std::string hf_name(const std::string& fqn);

/// `weight` ([heads * head_dim, dim]) with each head's rows reordered from interleaved rotary
/// pairs to rotate-half order: row 2i + j of a head becomes row j * head_dim/2 + i.
at::Tensor interleaved_to_half(const at::Tensor& weight, int64_t heads);

/// config.json of LlamaForCausalLM for `args`, with weights of dtype `dtype`.
std::string hf_config_json(const Args& args, at::ScalarType dtype);

/// Hands every tensor of the consolidated `state` (canonical FQN -> whole tensor) to `sink`
/// under its transformers name, then config.json; refuses a state that does not match `args`.
/// A tied model has no output.weight, so no lm_head.weight, and says tie_word_embeddings.
void export_hf(keel_host* host, const Args& args, const std::map<std::string, at::Tensor>& state,
               keel::ExportSink& sink);

}  // namespace llama3
