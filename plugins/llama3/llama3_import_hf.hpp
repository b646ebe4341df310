// Llama 3 from Hugging Face transformers' LlamaForCausalLM: config.json to the [model] table
// and transformers' tensors to Keel's canonical FQNs, the inverse of llama3_export_hf.
#pragma once

#include <keel/keel.hpp>

#include "llama3_args.hpp"

namespace llama3 {

/// The [model] keys config.json gives; refuses (naming the field) what Keel's Llama 3 cannot
/// represent: another architecture, RoPE scaling, biases, an activation other than SiLU.
void import_hf_config(const keel::ImportSource& source, keel::ImportedConfig& out);

/// `weight` with each head's rows put back from rotate-half order to interleaved pairs (the
/// inverse of interleaved_to_half).
at::Tensor half_to_interleaved(const at::Tensor& weight, int64_t heads);

/// Hands every parameter of the model `args` describes to `sink` under its canonical FQN, read
/// from `source` (fp32; FP8 block-scaled weights dequantized); refuses a missing or misshapen
/// tensor naming it. A tied model takes its head from the embedding.
void import_hf(keel_host* host, const Args& args, const keel::ImportSource& source, keel::ExportSink& sink);

}  // namespace llama3
