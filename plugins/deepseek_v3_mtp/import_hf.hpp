// DeepSeek-V3 from Hugging Face: config.json to the [model] table and the checkpoint's tensors to
// Keel's canonical FQNs, the inverse of export_hf. Two layouts are read, layer by layer:
// transformers 5's DeepseekV3ForCausalLM (routed experts fused: mlp.experts.gate_up_proj and
// mlp.experts.down_proj) and the DeepSeek-V3 release (deepseek-ai/DeepSeek-V3, README_WEIGHTS.md
// and inference/convert.py): one tensor per expert, model.layers.L.mlp.experts.J.{gate,up,
// down}_proj.weight, float8_e4m3fn weights with weight_scale_inv 128x128 block scales, and MTP
// depth k as the extra layer model.layers.<n_layers + k> holding enorm, hnorm, eh_proj,
// shared_head.norm, a decoder block, and copies of the embedding (embed_tokens) and head
// (shared_head.head).
#pragma once

#include <keel/keel.hpp>

#include "args.hpp"

namespace deepseek_v3 {

/// The [model] keys config.json determines; refuses (naming the field) what Keel's DeepSeek-V3
/// cannot represent. The MTP depth is num_nextn_predict_layers when the folder holds those
/// layers, 0 when it holds none (transformers saves the field without the weights).
void import_hf_config(const keel::Host& host, const keel::ImportSource& source, keel::ImportedConfig& out);

/// Hands every parameter and persistent buffer of the model `args` describes to `sink` under
/// its canonical FQN (fp32; FP8 block-scaled weights dequantized), one expert stack at a time.
/// Refuses a missing or misshapen tensor naming it, and MTP copies of the embedding or head that
/// differ from the main ones (Keel shares them).
void import_hf(const keel::Host& host, const Args& args, const keel::ImportSource& source, keel::ExportSink& sink);

}  // namespace deepseek_v3
