// DeepSeek-V3 as Hugging Face transformers' DeepseekV3ForCausalLM: Keel's canonical FQNs mapped
// to transformers' names (the routed experts' w1 and w3 fused into one gate_up_proj), and the
// config.json that rebuilds the same network. The MTP modules are not exported:
// DeepseekV3ForCausalLM has none.
#pragma once

#include <keel/keel.hpp>

#include <map>
#include <string>

#include "args.hpp"

namespace deepseek_v3 {

/// The transformers name of a canonical FQN; "" for tensors without a one-to-one counterpart
/// (the routed experts' w1/w3, fused by export_hf, and the MTP modules).
std::string hf_name(const std::string& fqn);

/// config.json of DeepseekV3ForCausalLM for `args`, with weights of dtype `dtype`.
std::string hf_config_json(const Args& args, at::ScalarType dtype);

/// Hands every tensor of the consolidated `state` (canonical FQN -> whole tensor) to `sink`
/// under its transformers name, then config.json. Refuses a state that does not match `args`
/// and a model transformers cannot express (softmax routing scores).
void export_hf(const keel::Host& host, const Args& args, const std::map<std::string, at::Tensor>& state,
               keel::ExportSink& sink);

}  // namespace deepseek_v3
