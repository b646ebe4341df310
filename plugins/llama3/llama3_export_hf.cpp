#include "llama3_export_hf.hpp"

#include <nlohmann/json.hpp>
#include <regex>

#include "llama3_part.hpp"

namespace llama3 {

std::string hf_name(const std::string& fqn) {
  static const std::map<std::string, std::string> top = {{"tok_embeddings.weight", "model.embed_tokens.weight"},
                                                         {"norm.weight", "model.norm.weight"},
                                                         {"output.weight", "lm_head.weight"}};
  static const std::map<std::string, std::string> block = {
      {"attention_norm.weight", "input_layernorm.weight"}, {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attention.wq.weight", "self_attn.q_proj.weight"},  {"attention.wk.weight", "self_attn.k_proj.weight"},
      {"attention.wv.weight", "self_attn.v_proj.weight"},  {"attention.wo.weight", "self_attn.o_proj.weight"},
      {"feed_forward.w1.weight", "mlp.gate_proj.weight"},  {"feed_forward.w3.weight", "mlp.up_proj.weight"},
      {"feed_forward.w2.weight", "mlp.down_proj.weight"},
  };
  if (auto it = top.find(fqn); it != top.end()) return it->second;
  static const std::regex layer("layers\\.(\\d+)\\.(.+)");
  std::smatch m;
  if (!std::regex_match(fqn, m, layer)) return "";
  auto it = block.find(m[2].str());
  return it == block.end() ? "" : "model.layers." + m[1].str() + "." + it->second;
}

at::Tensor interleaved_to_half(const at::Tensor& weight, int64_t heads) {
  const int64_t rows = weight.size(0), dim = weight.size(1), head_dim = rows / heads;
  return weight.reshape({heads, head_dim / 2, 2, dim}).transpose(1, 2).reshape({rows, dim}).contiguous();
}

namespace {

// transformers 5's rope_parameters: the type, theta and, for Llama 3.1's scaling, its fields.
nlohmann::ordered_json rope_parameters(const Args& a) {
  if (a.rope_scaling != "llama3") return {{"rope_type", "default"}, {"rope_theta", a.rope_theta}};
  return {{"rope_type", "llama3"},
          {"rope_theta", a.rope_theta},
          {"factor", a.rope_factor},
          {"low_freq_factor", a.rope_low_freq_factor},
          {"high_freq_factor", a.rope_high_freq_factor},
          {"original_max_position_embeddings", a.rope_original_max_position}};
}

}  // namespace

std::string hf_config_json(const Args& a, at::ScalarType dtype) {
  const std::string type = keel::transformers_dtype(dtype);
  nlohmann::ordered_json config = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"vocab_size", a.vocab_size},
      {"hidden_size", a.dim},
      {"intermediate_size", a.ffn_hidden},
      {"num_hidden_layers", a.n_layers},
      {"num_attention_heads", a.n_heads},
      {"num_key_value_heads", a.n_kv_heads},
      {"head_dim", a.head_dim()},
      {"hidden_act", "silu"},
      {"rms_norm_eps", a.norm_eps},
      // Keel's RoPE has no length limit; Llama 3's context length (3.1's when scaled) stands in.
      {"max_position_embeddings", a.rope_scaling == "llama3" ? 131072 : 8192},
      {"rope_parameters", rope_parameters(a)},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"mlp_bias", false},
      // Tied: no lm_head.weight is exported; transformers ties it to model.embed_tokens.
      {"tie_word_embeddings", a.tie_embeddings},
      {"dtype", type},
      {"torch_dtype", type},
  };
  return config.dump(2) + "\n";
}

void export_hf(keel_host* host, const Args& args, const std::map<std::string, at::Tensor>& state,
               keel::ExportSink& sink) {
  const keel_part_spec spec = keel::whole_model_on_meta(args.n_layers);
  Part whole(host, args, spec);
  keel::check_export_state(whole, state);
  for (const auto& [fqn, tensor] : state) {
    std::string name = hf_name(fqn);
    if (name.empty()) throw keel::Error(KEEL_ERROR_INTERNAL, "export hf: no transformers name for '" + fqn + "'");
    if (name.ends_with("q_proj.weight"))
      sink.tensor(name, interleaved_to_half(tensor, args.n_heads));
    else if (name.ends_with("k_proj.weight"))
      sink.tensor(name, interleaved_to_half(tensor, args.n_kv_heads));
    else
      sink.tensor(name, tensor);
  }
  sink.file("config.json", hf_config_json(args, state.at("tok_embeddings.weight").scalar_type()));
}

}  // namespace llama3
