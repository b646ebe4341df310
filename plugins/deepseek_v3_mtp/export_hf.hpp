// DeepSeek-V3 as Hugging Face transformers' DeepseekV3ForCausalLM: Keel's canonical FQNs mapped
// to transformers' names (the routed experts' w1 and w3 fused into one gate_up_proj), and the
// config.json that rebuilds the same network. The MTP modules are written as the DeepSeek-V3
// release stores them (README_WEIGHTS.md of deepseek-ai/DeepSeek-V3): depth k is the extra
// decoder layer model.layers.<n_layers + k> with enorm, hnorm, eh_proj, shared_head.norm and
// copies of the embedding (embed_tokens) and head (shared_head.head); transformers' model
// ignores that layer.
#pragma once

#include <keel/keel.hpp>

#include <map>
#include <optional>
#include <string>

#include "args.hpp"

namespace deepseek_v3 {

/// Where a block's tensor lives: the decoder layer's prefix ("model.layers.<L>.") and the FQN's
/// path inside Keel's block ("attention.wo.weight", or "enorm.weight" of an MTP module).
struct HfPlace {
  std::string layer;
  std::string within;
};

/// The place of `fqn` inside a decoder layer (MTP depth k at layer n_layers + k); nullopt for
/// the embedding, the final norm and the head.
std::optional<HfPlace> hf_place(const Args& args, const std::string& fqn);

/// The transformers (or, for MTP modules, released) name of a canonical FQN; "" for tensors
/// without a one-to-one counterpart (the routed experts' w1/w3, fused by export_hf).
std::string hf_name(const Args& args, const std::string& fqn);

/// The release's copy of the shared embedding inside MTP depth `k`'s layer.
std::string hf_mtp_embedding(const Args& args, int64_t k);

/// The release's copy of the shared output head inside MTP depth `k`'s layer.
std::string hf_mtp_head(const Args& args, int64_t k);

/// config.json of DeepseekV3ForCausalLM for `args`, with weights of dtype `dtype`.
std::string hf_config_json(const Args& args, at::ScalarType dtype);

/// Hands every tensor of the consolidated `state` (canonical FQN -> whole tensor) to `sink`
/// under its transformers name, then config.json. Refuses a state that does not match `args`
/// and a model transformers cannot express (softmax routing scores).
void export_hf(const keel::Host& host, const Args& args, const std::map<std::string, at::Tensor>& state,
               keel::ExportSink& sink);

}  // namespace deepseek_v3
