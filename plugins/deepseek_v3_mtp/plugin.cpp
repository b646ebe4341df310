// The deepseek_v3_mtp plugin: DeepSeek-V3 (MLA, DeepSeekMoE with aux-loss-free balancing)
// with multi-token prediction. The model keeps its embedding replica exact itself
// (keel::StageReplicas: post_init broadcasts the first stage's copy to the last stage,
// pre_clip sums the two gradients); the expert bias is updated in post_step from the step's
// expert loads summed over dp.
#include <c10/core/GradMode.h>
#include <keel/keel.hpp>
#include <keel/replica.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "activations.hpp"
#include "args.hpp"
#include "export_hf.hpp"
#include "import_hf.hpp"
#include "part.hpp"

namespace {

class DeepSeekV3 {
 public:
  static constexpr const char* export_formats = "hf";
  static constexpr const char* import_formats = "hf";
  static constexpr uint32_t recompute_modes = keel::recompute_bit(keel::Recompute::full) |
                                              keel::recompute_bit(keel::Recompute::selective) |
                                              keel::recompute_bit(keel::Recompute::lean);
  static constexpr uint32_t attention_flags = KEEL_ATTENTION_BLOCK_CAUSAL | KEEL_ATTENTION_RESET_POSITIONS;
  static std::vector<keel::ConfigKey> config_keys() { return deepseek_v3::config_keys(); }

  DeepSeekV3(keel::Host host, keel::Config& config)
      : host_(host), args_(deepseek_v3::read_args(config)), mesh_(host.mesh()) {
    if (args_.n_routed_experts % mesh_.ep != 0)
      config.invalid("n_routed_experts", "must be divisible by parallelism.ep (" + std::to_string(mesh_.ep) +
                                             "), got " + std::to_string(args_.n_routed_experts));
  }

  keel_model_info info() const {
    keel_model_info info{};
    info.vocab_size = args_.vocab_size;
    info.num_layers = static_cast<int32_t>(args_.n_layers);
    info.hidden_size = args_.dim;
    return info;
  }

  void set_recompute(keel::Recompute mode) { args_.recompute = mode; }
  void set_attention(uint32_t flags) { args_.attention_flags = flags; }

  int64_t activation_bytes(const keel_part_spec& spec, int64_t batch, int64_t seq, keel::Recompute mode) const {
    return deepseek_v3::activation_bytes(args_, spec, batch, seq, mode, mesh_.ep);
  }

  keel::Part& build_part(const keel_part_spec& spec) {
    deepseek_v3::ExpertPlacement placement;
    placement.local = args_.n_routed_experts / mesh_.ep;
    placement.first = mesh_.ep_index * placement.local;
    placement.ep = mesh_.ep;
    placement.host = host_.raw();
    placement.group = host_.group(KEEL_GROUP_EP);
    parts_.push_back(std::make_unique<deepseek_v3::Part>(host_.raw(), args_, spec, placement));
    if (at::Tensor* embedding = parts_.back()->embedding()) embeddings_.hold(*embedding, spec.stage_index != 0);
    return *parts_.back();
  }

  // The embedding has a REPLICA on the last stage when MTP embeds future tokens there.
  void post_init() { embeddings_.post_init(host_, /*shared=*/args_.num_mtp_layers > 0); }

  // After the DP reduction: both copies receive the sum of both gradients (same bits on both).
  void pre_clip() { embeddings_.pre_clip(host_); }

  // Aux-loss-free balancing: bias += coeff * sign(mean load - load), centred, from the step's
  // loads summed over dp (every replica routes its own tokens).
  void post_step() {
    c10::NoGradGuard no_grad;
    for (auto& part : parts_)
      for (deepseek_v3::Moe* moe : part->moes()) {
        at::Tensor& load = moe->tokens_per_expert();
        host_.all_reduce(host_.group(KEEL_GROUP_DP), load, KEEL_REDUCE_SUM);
        at::Tensor mean = load.mean();
        host_.metric(("load_max_over_mean." + moe->prefix().substr(0, moe->prefix().size() - 5)).c_str(),
                     load.max() / mean.clamp_min(1e-9), KEEL_METRIC_LAST);
        if (args_.load_balance_coeff > 0) {
          at::Tensor delta = args_.load_balance_coeff * at::sign(mean - load);
          moe->expert_bias().add_(delta - delta.mean());
        }
        load.zero_();
      }
  }

  void export_state(const std::string& format, const std::map<std::string, at::Tensor>& state, keel::ExportSink& sink) {
    if (format != "hf") throw keel::unsupported_format("deepseek_v3_mtp", format, "hf");
    deepseek_v3::export_hf(host_, args_, state, sink);
  }

  static void import_config(keel::Host host, const std::string& format, const keel::ImportSource& source,
                            keel::ImportedConfig& out) {
    if (format != "hf") throw keel::unsupported_format("deepseek_v3_mtp", format, "hf");
    deepseek_v3::import_hf_config(host, source, out);
  }

  void import_state(const std::string& format, const keel::ImportSource& source, keel::ExportSink& sink) {
    if (format != "hf") throw keel::unsupported_format("deepseek_v3_mtp", format, "hf");
    deepseek_v3::import_hf(host_, args_, source, sink);
  }

 private:
  keel::Host host_;
  deepseek_v3::Args args_;
  keel_mesh_info mesh_;
  keel::StageReplicas embeddings_;
  std::vector<std::unique_ptr<deepseek_v3::Part>> parts_;
};

}  // namespace

KEEL_PLUGIN("deepseek_v3_mtp", "1.5.0",
            keel::model_component<DeepSeekV3>("deepseek_v3_mtp",
                                              "DeepSeek-V3: MLA, DeepSeekMoE with aux-loss-free balancing, "
                                              "multi-token prediction",
                                              KEEL_HOOK_PRE_CLIP_CAPTURE_SAFE | KEEL_HOOK_PRE_CLIP_REPLICAS_ONLY))
