#include "import_hf.hpp"

#include "export_hf.hpp"
#include "part.hpp"

namespace deepseek_v3 {

namespace {

const std::string kArchitecture = "DeepseekV3ForCausalLM";

int64_t required(const keel::ImportSource& source, const std::string& field) {
  return keel::import_size(source, field, kArchitecture);
}

double required_real(const keel::ImportSource& source, const std::string& field) {
  std::optional<double> v = source.real(field);
  if (!v) throw keel::unsupported_config(field, "missing (" + kArchitecture + " needs it)");
  return *v;
}

// Only the release's FP8 scheme is dequantized: e4m3 weights, one scale per 128x128 block.
void check_quantization(const keel::ImportSource& source) {
  std::optional<std::string> method = source.string("quantization_config.quant_method");
  if (!method) return;
  if (*method != "fp8")
    throw keel::unsupported_config("quantization_config.quant_method",
                                   "'" + *method + "'; Keel dequantizes only the release's \"fp8\"");
  const std::string fmt = source.string("quantization_config.fmt").value_or("e4m3");
  if (fmt != "e4m3")
    throw keel::unsupported_config("quantization_config.fmt", "'" + fmt + "'; Keel dequantizes float8 e4m3 only");
  const std::optional<int64_t> rows = source.integer("quantization_config.weight_block_size.0"),
                               cols = source.integer("quantization_config.weight_block_size.1"),
                               more = source.integer("quantization_config.weight_block_size.2");
  if (rows != 128 || cols != 128 || more)
    throw keel::unsupported_config("quantization_config.weight_block_size",
                                   "Keel dequantizes 128x128 blocks only (weight_block_size [128, 128])");
}

// RoPE: transformers 5 writes rope_parameters; the release writes rope_theta and rope_scaling.
void import_rope(const keel::ImportSource& source, keel::ImportedConfig& out) {
  std::string prefix = "rope_parameters.";
  std::optional<std::string> type = source.string("rope_parameters.rope_type");
  if (!type) {
    prefix = "rope_scaling.";
    type = source.string("rope_scaling.rope_type");
    if (!type) type = source.string("rope_scaling.type");
  }
  std::optional<double> theta = source.real("rope_parameters.rope_theta");
  if (!theta) theta = source.real("rope_theta");
  out.set("rope_theta", theta.value_or(10000.0));
  if (source.boolean("rope_interleave") == false)
    throw keel::unsupported_config("rope_interleave", "false; Keel's DeepSeek-V3 rotates interleaved pairs");
  const std::string kind = type.value_or("default");
  if (kind == "default") {
    out.set("rope_factor", 1.0);
    if (std::optional<int64_t> context = source.integer("max_position_embeddings"))
      out.set("original_seq_len", *context);
    return;
  }
  if (kind != "yarn")
    throw keel::unsupported_config(prefix + (source.string(prefix + "rope_type") ? "rope_type" : "type"),
                                   "'" + kind + "'; Keel's DeepSeek-V3 has plain RoPE or YaRN");
  // transformers' YaRN takes an explicit attention factor over the one mscale gives; Keel
  // derives it from mscale and mscale_all_dim only.
  if (source.real(prefix + "attention_factor"))
    throw keel::unsupported_config(prefix + "attention_factor",
                                   "set; Keel's YaRN derives the attention factor from mscale and mscale_all_dim");
  out.set("rope_factor", required_real(source, prefix + "factor"));
  out.set("original_seq_len", required(source, prefix + "original_max_position_embeddings"));
  out.set("beta_fast", source.real(prefix + "beta_fast").value_or(32.0));
  out.set("beta_slow", source.real(prefix + "beta_slow").value_or(1.0));
  // Absent mscales are 0, as transformers reads them (its default attention factor).
  out.set("mscale", source.real(prefix + "mscale").value_or(0.0));
  out.set("mscale_all_dim", source.real(prefix + "mscale_all_dim").value_or(0.0));
}

// The MTP depth the folder holds: each depth is one layer after the main ones.
int64_t mtp_depth(const keel::Host& host, const keel::ImportSource& source, int64_t n_layers) {
  std::optional<int64_t> declared = source.integer("num_nextn_predict_layers");
  if (!declared) declared = source.integer("num_mtp_layers");
  const int64_t depth = declared.value_or(0);
  if (depth < 0) throw keel::unsupported_config("num_nextn_predict_layers", "negative");
  // Counted up to the first layer absent: a declared depth of 10^18 costs one lookup.
  int64_t present = 0;
  while (present < depth && source.has("model.layers." + std::to_string(n_layers + present) + ".eh_proj.weight"))
    ++present;
  if (present == depth) return depth;
  if (present == 0) {
    host.info("import hf: config.json declares " + std::to_string(depth) +
              " MTP layer(s) but the folder holds none (transformers saves none): imported without MTP");
    return 0;
  }
  throw keel::unsupported_config("num_nextn_predict_layers",
                                 std::to_string(depth) + ", but only " + std::to_string(present) +
                                     " of the MTP layers (model.layers." + std::to_string(n_layers) +
                                     " on, with eh_proj.weight) are in the folder");
}

// One expert tensor of a block ("w1", "w2" or "w3" of Keel, [experts, rows, cols]) from the
// fused transformers tensors or the release's one tensor per expert.
at::Tensor import_experts(const keel::ImportSource& source, const std::string& layer, const std::string& which,
                          at::IntArrayRef shape) {
  const int64_t experts = shape[0], rows = shape[1], cols = shape[2];
  const std::string fused = layer + (which == "w2" ? "mlp.experts.down_proj" : "mlp.experts.gate_up_proj");
  if (source.has(fused)) {
    if (which == "w2") return keel::import_weight(source, fused, shape);
    // [experts, 2 * moe_hidden, dim]: gate rows first, then up rows (as export_hf fuses them).
    at::Tensor both = keel::import_weight(source, fused, {experts, 2 * rows, cols});
    return (which == "w1" ? both.slice(1, 0, rows) : both.slice(1, rows, 2 * rows)).contiguous();
  }
  const std::string projection = which == "w1" ? "gate_proj" : which == "w3" ? "up_proj" : "down_proj";
  at::Tensor stacked = at::empty({experts, rows, cols}, at::kFloat);
  for (int64_t j = 0; j < experts; ++j)
    stacked[j].copy_(keel::import_weight(
        source, layer + "mlp.experts." + std::to_string(j) + "." + projection + ".weight", {rows, cols}));
  return stacked;
}

// The release stores the shared embedding and head again in each MTP layer; Keel shares them.
void check_mtp_copies(const Args& args, const keel::ImportSource& source) {
  for (int64_t k = 0; k < args.num_mtp_layers; ++k) {
    for (const auto& [copy, main] : {std::pair{hf_mtp_embedding(args, k), std::string("model.embed_tokens.weight")},
                                     std::pair{hf_mtp_head(args, k), std::string("lm_head.weight")}}) {
      if (!source.has(copy)) continue;
      // Compared as stored when both are stored alike (no fp32 copies of two vocab-sized tables);
      // otherwise in fp32, which also refuses a misshapen one naming it.
      const std::vector<int64_t> shape = {args.vocab_size, args.dim};
      const at::Tensor &stored_copy = source.tensor(copy), &stored_main = source.tensor(main);
      const bool alike = stored_copy.scalar_type() == stored_main.scalar_type() &&
                         stored_copy.scalar_type() != at::kFloat8_e4m3fn && stored_copy.sizes() == shape &&
                         stored_main.sizes() == shape;
      const bool same =
          alike ? at::equal(stored_copy, stored_main)
                : at::equal(keel::import_weight(source, copy, shape), keel::import_weight(source, main, shape));
      if (!same)
        throw keel::Error(KEEL_ERROR_INVALID_ARGUMENT, "import: " + source.where(copy) + " differs from " +
                                                           source.where(main) +
                                                           "; Keel's MTP modules share the main embedding and head");
    }
  }
}

}  // namespace

void import_hf_config(const keel::Host& host, const keel::ImportSource& source, keel::ImportedConfig& out) {
  const std::string architecture = source.string("architectures.0").value_or("");
  if (architecture != kArchitecture)
    throw keel::unsupported_config("architectures",
                                   "'" + architecture + "', the deepseek_v3_mtp model imports " + kArchitecture);
  const int64_t heads = required(source, "num_attention_heads");
  if (std::optional<int64_t> kv = source.integer("num_key_value_heads"); kv && *kv != heads)
    throw keel::unsupported_config("num_key_value_heads", std::to_string(*kv) +
                                                              "; Keel's MLA has one latent per head "
                                                              "(num_key_value_heads = num_attention_heads = " +
                                                              std::to_string(heads) + ")");
  const std::string act = source.string("hidden_act").value_or("silu");
  if (act != "silu") throw keel::unsupported_config("hidden_act", "'" + act + "', Keel's DeepSeek-V3 uses silu");
  if (source.boolean("attention_bias").value_or(false))
    throw keel::unsupported_config("attention_bias", "true; Keel's DeepSeek-V3 has no attention biases");
  if (source.boolean("tie_word_embeddings").value_or(false))
    throw keel::unsupported_config("tie_word_embeddings", "true; Keel's DeepSeek-V3 has its own output head");
  if (std::optional<int64_t> every = source.integer("moe_layer_freq"); every && *every != 1)
    throw keel::unsupported_config("moe_layer_freq", std::to_string(*every) +
                                                         "; Keel's DeepSeek-V3 makes every layer after "
                                                         "first_k_dense_replace an MoE layer");
  const std::string score = source.string("scoring_func").value_or("sigmoid");
  if (score != "sigmoid" && score != "softmax")
    throw keel::unsupported_config("scoring_func", "'" + score + "'; Keel scores experts with sigmoid or softmax");
  const int64_t groups = source.integer("n_group").value_or(1), limited = source.integer("topk_group").value_or(1);
  // noaux_tc is DeepSeek-V3's group-limited choice; greedy has no groups, the same when all count.
  const std::string method = source.string("topk_method").value_or("noaux_tc");
  if (method != "noaux_tc" && !(method == "greedy" && limited == groups))
    throw keel::unsupported_config("topk_method", "'" + method +
                                                      "'; Keel routes as noaux_tc (greedy only with topk_group "
                                                      "= n_group)");
  check_quantization(source);

  const int64_t n_layers = keel::import_layer_count(source, "num_hidden_layers", "input_layernorm.weight");
  // q_lora_rank null means a direct query projection; its tensors tell a null from a missing one.
  std::optional<int64_t> q_lora_rank = source.integer("q_lora_rank");
  if (!q_lora_rank && !source.has("model.layers.0.self_attn.q_proj.weight"))
    throw keel::unsupported_config("q_lora_rank", "missing, and the folder has no model.layers.0.self_attn.q_proj");
  out.set("vocab_size", required(source, "vocab_size"));
  out.set("dim", required(source, "hidden_size"));
  out.set("n_layers", n_layers);
  out.set("n_dense_layers", required(source, "first_k_dense_replace"));
  out.set("n_heads", heads);
  out.set("q_lora_rank", q_lora_rank.value_or(0));
  out.set("kv_lora_rank", required(source, "kv_lora_rank"));
  out.set("qk_nope_head_dim", required(source, "qk_nope_head_dim"));
  out.set("qk_rope_head_dim", required(source, "qk_rope_head_dim"));
  out.set("v_head_dim", required(source, "v_head_dim"));
  out.set("dense_hidden", required(source, "intermediate_size"));
  out.set("moe_hidden", required(source, "moe_intermediate_size"));
  out.set("n_routed_experts", required(source, "n_routed_experts"));
  out.set("n_shared_experts", source.integer("n_shared_experts").value_or(0));
  out.set("top_k", required(source, "num_experts_per_tok"));
  out.set("score_func", score);
  out.set("n_expert_groups", groups);
  out.set("n_limited_groups", limited);
  out.set("route_norm", source.boolean("norm_topk_prob").value_or(true));
  out.set("route_scale", required_real(source, "routed_scaling_factor"));
  out.set("norm_eps", source.real("rms_norm_eps").value_or(1e-6));
  import_rope(source, out);
  out.set("num_mtp_layers", mtp_depth(host, source, n_layers));
}

void import_hf(const keel::Host& host, const Args& args, const keel::ImportSource& source, keel::ExportSink& sink) {
  const keel_part_spec spec = keel::whole_model_on_meta(args.n_layers);
  ExpertPlacement placement;
  placement.local = args.n_routed_experts;
  Part whole(host.raw(), args, spec, placement);
  check_mtp_copies(args, source);
  auto hand = [&](const std::string& fqn, at::IntArrayRef shape) {
    if (std::optional<HfPlace> place = hf_place(args, fqn); place && place->within.starts_with("moe.experts.w")) {
      sink.tensor(fqn, import_experts(source, place->layer, place->within.substr(12), shape));
      return;
    }
    const std::string name = hf_name(args, fqn);
    if (name.empty()) throw keel::Error(KEEL_ERROR_INTERNAL, "import hf: no Hugging Face name for '" + fqn + "'");
    sink.tensor(fqn, keel::import_weight(source, name, shape));
  };
  for (const auto& record : whole.parameters().records()) hand(record->fqn(), record->tensor().sizes());
  for (const auto& record : whole.buffers().records())
    if (record->persistent()) hand(record->fqn(), record->tensor().sizes());
}

}  // namespace deepseek_v3
