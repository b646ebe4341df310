#include "llama3_import_hf.hpp"

#include "llama3_export_hf.hpp"
#include "llama3_part.hpp"

namespace llama3 {

namespace {

int64_t required(const keel::ImportSource& source, const std::string& field) {
  return keel::import_size(source, field, "LlamaForCausalLM");
}

void refuse_true(const keel::ImportSource& source, const std::string& field, const std::string& why) {
  if (source.boolean(field).value_or(false)) throw keel::unsupported_config(field, why);
}

// Llama 3.1's rope_type "llama3" fields of `table` (rope_parameters or rope_scaling), each
// required as transformers requires it; their ranges are the model table's to check.
void import_rope_scaling(const keel::ImportSource& source, const std::string& table, keel::ImportedConfig& out) {
  auto real = [&](const char* name) {
    const std::string field = table + "." + name;
    const std::optional<double> value = source.real(field);
    if (!value) throw keel::unsupported_config(field, "missing (rope_type \"llama3\" needs it)");
    return *value;
  };
  out.set("rope_scaling", "llama3");
  out.set("rope_factor", real("factor"));
  out.set("rope_low_freq_factor", real("low_freq_factor"));
  out.set("rope_high_freq_factor", real("high_freq_factor"));
  out.set("rope_original_max_position",
          keel::import_size(source, table + ".original_max_position_embeddings", "rope_type \"llama3\"", 1));
}

}  // namespace

void import_hf_config(const keel::ImportSource& source, keel::ImportedConfig& out) {
  const std::string architecture = source.string("architectures.0").value_or("");
  if (architecture != "LlamaForCausalLM")
    throw keel::unsupported_config("architectures",
                                   "'" + architecture + "', the llama3 model imports LlamaForCausalLM");
  const int64_t dim = required(source, "hidden_size"), heads = required(source, "num_attention_heads");
  if (std::optional<int64_t> head_dim = source.integer("head_dim"); head_dim && heads > 0 && *head_dim * heads != dim)
    throw keel::unsupported_config("head_dim", std::to_string(*head_dim) +
                                                   ": Keel's Llama 3 uses hidden_size / "
                                                   "num_attention_heads (" +
                                                   std::to_string(dim / heads) + ")");
  const std::string act = source.string("hidden_act").value_or("silu");
  if (act != "silu") throw keel::unsupported_config("hidden_act", "'" + act + "', Keel's Llama 3 uses silu");
  refuse_true(source, "attention_bias", "true; Keel's Llama 3 has no attention biases");
  refuse_true(source, "mlp_bias", "true; Keel's Llama 3 has no MLP biases");
  // transformers 5 writes rope_parameters; older files rope_theta and rope_scaling.
  std::string scaled_by;  // the table that names rope_type "llama3", if any
  for (const char* field : {"rope_parameters.rope_type", "rope_scaling.rope_type", "rope_scaling.type"}) {
    const std::string type = source.string(field).value_or("default");
    if (type == "llama3") {
      const std::string table = std::string(field).substr(0, std::string(field).find('.'));
      if (scaled_by.empty()) scaled_by = table;
    } else if (type != "default") {
      throw keel::unsupported_config(
          field, "'" + type + "'; Keel's Llama 3 has plain RoPE (\"default\") or Llama 3.1's scaling (\"llama3\")");
    }
  }
  if (!scaled_by.empty()) import_rope_scaling(source, scaled_by, out);
  std::optional<double> theta = source.real("rope_parameters.rope_theta");
  if (!theta) theta = source.real("rope_theta");
  out.set("dim", dim);
  out.set("n_layers", keel::import_layer_count(source, "num_hidden_layers", "input_layernorm.weight"));
  out.set("n_heads", heads);
  out.set("n_kv_heads", source.integer("num_key_value_heads").value_or(heads));
  out.set("ffn_hidden", required(source, "intermediate_size"));
  out.set("vocab_size", required(source, "vocab_size"));
  if (theta) out.set("rope_theta", *theta);
  out.set("norm_eps", source.real("rms_norm_eps").value_or(1e-6));
  out.set("tie_embeddings", source.boolean("tie_word_embeddings").value_or(false));
}

at::Tensor half_to_interleaved(const at::Tensor& weight, int64_t heads) {
  const int64_t rows = weight.size(0), dim = weight.size(1), head_dim = rows / heads;
  return weight.reshape({heads, 2, head_dim / 2, dim}).transpose(1, 2).reshape({rows, dim}).contiguous();
}

void import_hf(keel_host* host, const Args& args, const keel::ImportSource& source, keel::ExportSink& sink) {
  const keel_part_spec spec = keel::whole_model_on_meta(args.n_layers);
  Part whole(host, args, spec);
  for (const auto& record : whole.parameters().records()) {
    const std::string& fqn = record->fqn();
    const std::string name = hf_name(fqn);
    if (name.empty()) throw keel::Error(KEEL_ERROR_INTERNAL, "import hf: no transformers name for '" + fqn + "'");
    at::Tensor value = keel::import_weight(source, name, record->tensor().sizes());
    if (name.ends_with("q_proj.weight"))
      value = half_to_interleaved(value, args.n_heads);
    else if (name.ends_with("k_proj.weight"))
      value = half_to_interleaved(value, args.n_kv_heads);
    sink.tensor(fqn, value);
  }
  // A tied checkpoint may still store the head; it must then be the embedding.
  if (args.tie_embeddings && source.has("lm_head.weight")) {
    const at::Tensor embedding = keel::import_weight(source, "model.embed_tokens.weight", {args.vocab_size, args.dim});
    if (!at::equal(keel::import_weight(source, "lm_head.weight", {args.vocab_size, args.dim}), embedding))
      throw keel::Error(
          KEEL_ERROR_INVALID_ARGUMENT,
          "import: tie_word_embeddings is true but lm_head.weight differs from model.embed_tokens.weight");
  }
}

}  // namespace llama3
