#include "export_hf.hpp"

#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>

#include "part.hpp"

namespace deepseek_v3 {

namespace {

const std::string kFusedFirst = "moe.experts.w1", kFusedSecond = "moe.experts.w3";

// Within a block: Keel's module path -> transformers' (DeepseekV3DecoderLayer).
const std::map<std::string, std::string>& block_names() {
  static const std::map<std::string, std::string> names = {
      {"attention_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attention.wq.weight", "self_attn.q_proj.weight"},
      {"attention.wq_a.weight", "self_attn.q_a_proj.weight"},
      {"attention.q_norm.weight", "self_attn.q_a_layernorm.weight"},
      {"attention.wq_b.weight", "self_attn.q_b_proj.weight"},
      {"attention.wkv_a.weight", "self_attn.kv_a_proj_with_mqa.weight"},
      {"attention.kv_norm.weight", "self_attn.kv_a_layernorm.weight"},
      {"attention.wkv_b.weight", "self_attn.kv_b_proj.weight"},
      {"attention.wo.weight", "self_attn.o_proj.weight"},
      {"feed_forward.w1.weight", "mlp.gate_proj.weight"},
      {"feed_forward.w3.weight", "mlp.up_proj.weight"},
      {"feed_forward.w2.weight", "mlp.down_proj.weight"},
      {"moe.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"},
      {"moe.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"},
      {"moe.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"},
      {"moe.router.gate.weight", "mlp.gate.weight"},
      {"moe.expert_bias", "mlp.gate.e_score_correction_bias"},
      {"moe.experts.w2", "mlp.experts.down_proj"},
  };
  return names;
}

// The whole model (one stage, every expert) on the meta device: the FQNs and global shapes
// the state must hold. Nothing is allocated.
void check_state(const keel::Host& host, const Args& args, const std::map<std::string, at::Tensor>& state) {
  const keel_part_spec spec = keel::whole_model_on_meta(args.n_layers);
  ExpertPlacement placement;
  placement.local = args.n_routed_experts;
  Part whole(host.raw(), args, spec, placement);
  keel::check_export_state(whole, state);
}

}  // namespace

std::optional<HfPlace> hf_place(const Args& args, const std::string& fqn) {
  static const std::regex layer("layers\\.(\\d+)\\.(.+)"), mtp("mtp\\.(\\d+)\\.(.+)");
  std::smatch m;
  if (std::regex_match(fqn, m, layer)) return HfPlace{"model.layers." + m[1].str() + ".", m[2].str()};
  if (!std::regex_match(fqn, m, mtp)) return std::nullopt;
  const std::string within = m[2].str();
  const std::string prefix = "model.layers." + std::to_string(args.n_layers + std::stoll(m[1].str())) + ".";
  return HfPlace{prefix, within.starts_with("block.") ? within.substr(6) : within};
}

std::string hf_name(const Args& args, const std::string& fqn) {
  static const std::map<std::string, std::string> top = {{"tok_embeddings.weight", "model.embed_tokens.weight"},
                                                         {"norm.weight", "model.norm.weight"},
                                                         {"output.weight", "lm_head.weight"}};
  // An MTP module's own tensors, named as in the release's layer n_layers + k.
  static const std::map<std::string, std::string> mtp = {{"enorm.weight", "enorm.weight"},
                                                         {"hnorm.weight", "hnorm.weight"},
                                                         {"eh_proj.weight", "eh_proj.weight"},
                                                         {"norm.weight", "shared_head.norm.weight"}};
  if (auto it = top.find(fqn); it != top.end()) return it->second;
  std::optional<HfPlace> place = hf_place(args, fqn);
  if (!place) return "";
  const bool mtp_own = fqn.starts_with("mtp.") && fqn.find(".block.") == std::string::npos;
  const auto& names = mtp_own ? mtp : block_names();
  auto it = names.find(place->within);
  return it == names.end() ? "" : place->layer + it->second;
}

std::string hf_mtp_embedding(const Args& args, int64_t k) {
  return "model.layers." + std::to_string(args.n_layers + k) + ".embed_tokens.weight";
}

std::string hf_mtp_head(const Args& args, int64_t k) {
  return "model.layers." + std::to_string(args.n_layers + k) + ".shared_head.head.weight";
}

std::string hf_config_json(const Args& a, at::ScalarType dtype) {
  nlohmann::ordered_json rope;
  if (a.rope_factor > 1.0) {
    rope = {{"rope_type", "yarn"},      {"rope_theta", a.rope_theta},
            {"factor", a.rope_factor},  {"original_max_position_embeddings", a.original_seq_len},
            {"beta_fast", a.beta_fast}, {"beta_slow", a.beta_slow},
            {"mscale", a.mscale},       {"mscale_all_dim", a.mscale_all_dim}};
  } else {
    rope = {{"rope_type", "default"}, {"rope_theta", a.rope_theta}};
  }
  const std::string type = keel::transformers_dtype(dtype);
  nlohmann::ordered_json config = {
      {"architectures", {"DeepseekV3ForCausalLM"}},
      {"model_type", "deepseek_v3"},
      {"vocab_size", a.vocab_size},
      {"hidden_size", a.dim},
      {"intermediate_size", a.dense_hidden},
      {"moe_intermediate_size", a.moe_hidden},
      {"num_hidden_layers", a.n_layers},
      {"first_k_dense_replace", a.n_dense_layers},
      {"num_attention_heads", a.n_heads},
      {"num_key_value_heads", a.n_heads},
      {"q_lora_rank", a.q_lora_rank > 0 ? nlohmann::ordered_json(a.q_lora_rank) : nlohmann::ordered_json(nullptr)},
      {"kv_lora_rank", a.kv_lora_rank},
      {"qk_nope_head_dim", a.qk_nope_head_dim},
      {"qk_rope_head_dim", a.qk_rope_head_dim},
      {"v_head_dim", a.v_head_dim},
      {"n_routed_experts", a.n_routed_experts},
      {"n_shared_experts", a.n_shared_experts},
      {"num_experts_per_tok", a.top_k},
      {"n_group", a.n_expert_groups},
      {"topk_group", a.n_limited_groups},
      {"norm_topk_prob", a.route_norm},
      {"routed_scaling_factor", a.route_scale},
      {"hidden_act", "silu"},
      {"rms_norm_eps", a.norm_eps},
      // YaRN stretches the trained context by its factor.
      {"max_position_embeddings",
       static_cast<int64_t>(std::llround(static_cast<double>(a.original_seq_len) * std::max(1.0, a.rope_factor)))},
      {"rope_parameters", rope},
      {"rope_interleave", true},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"tie_word_embeddings", false},
      // The MTP modules follow the main layers, as in the release.
      {"num_nextn_predict_layers", a.num_mtp_layers},
      {"dtype", type},
      {"torch_dtype", type},
  };
  return config.dump(2) + "\n";
}

void export_hf(const keel::Host& host, const Args& args, const std::map<std::string, at::Tensor>& state,
               keel::ExportSink& sink) {
  // transformers' DeepseekV3 scores experts with a sigmoid only.
  if (args.score_func != "sigmoid")
    throw keel::Error(KEEL_ERROR_UNSUPPORTED,
                      "export hf: score_func \"" + args.score_func +
                          "\" has no DeepseekV3ForCausalLM equivalent (it scores with sigmoid)");
  check_state(host, args, state);
  for (const auto& [fqn, tensor] : state) {
    if (fqn.ends_with(kFusedSecond)) continue;  // fused with its w1
    if (fqn.ends_with(kFusedFirst)) {
      const std::string block = fqn.substr(0, fqn.size() - kFusedFirst.size());
      // [experts, 2 * moe_hidden, dim]: gate rows first, then up rows.
      sink.tensor(hf_place(args, fqn)->layer + "mlp.experts.gate_up_proj",
                  at::cat({tensor, state.at(block + kFusedSecond)}, 1));
      continue;
    }
    std::string name = hf_name(args, fqn);
    if (name.empty()) throw keel::Error(KEEL_ERROR_INTERNAL, "export hf: no transformers name for '" + fqn + "'");
    sink.tensor(name, tensor);
  }
  // The release stores the shared embedding and head again in each MTP layer.
  for (int64_t k = 0; k < args.num_mtp_layers; ++k) {
    sink.tensor(hf_mtp_embedding(args, k), state.at("tok_embeddings.weight"));
    sink.tensor(hf_mtp_head(args, k), state.at("output.weight"));
  }
  sink.file("config.json", hf_config_json(args, state.at("tok_embeddings.weight").scalar_type()));
}

}  // namespace deepseek_v3
