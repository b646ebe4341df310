// The llama3 plugin: a Llama 3 model component (flavors tiny, debug, 8b). With tied
// embeddings under pipeline parallelism the model keeps the head's REPLICA of the embedding
// exact itself (keel::StageReplicas: post_init broadcasts the first stage's copy to the last
// stage, pre_clip sums the two gradients).
#include <keel/keel.hpp>
#include <keel/replica.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "llama3_activations.hpp"
#include "llama3_args.hpp"
#include "llama3_export_hf.hpp"
#include "llama3_import_hf.hpp"
#include "llama3_part.hpp"

namespace {

class Llama3 {
 public:
  static constexpr const char* export_formats = "hf";
  static constexpr const char* import_formats = "hf";
  static constexpr uint32_t recompute_modes = keel::recompute_bit(keel::Recompute::full) |
                                              keel::recompute_bit(keel::Recompute::selective) |
                                              keel::recompute_bit(keel::Recompute::lean);
  static constexpr uint32_t attention_flags = KEEL_ATTENTION_BLOCK_CAUSAL | KEEL_ATTENTION_RESET_POSITIONS;
  static std::vector<keel::ConfigKey> config_keys() { return llama3::config_keys(); }

  Llama3(keel::Host host, keel::Config& config) : host_(host), args_(llama3::read_args(config)) {}

  keel_model_info info() const {
    keel_model_info info{};
    info.vocab_size = args_.vocab_size;
    info.num_layers = static_cast<int32_t>(args_.n_layers);
    info.hidden_size = args_.dim;
    return info;
  }
  void set_recompute(keel::Recompute mode) { args_.recompute = mode; }
  // The parts mask by the documents each forward's inputs carry: nothing to remember here.
  void set_attention(uint32_t /*flags*/) {}
  int64_t activation_bytes(const keel_part_spec& spec, int64_t batch, int64_t seq, keel::Recompute mode) const {
    return llama3::activation_bytes(args_, spec, batch, seq, mode);
  }
  keel::Part& build_part(const keel_part_spec& spec) {
    parts_.push_back(std::make_unique<llama3::Part>(host_.raw(), args_, spec));
    if (at::Tensor* embedding = parts_.back()->tok_embeddings()) embeddings_.hold(*embedding, spec.stage_index != 0);
    return *parts_.back();
  }
  void post_init() { embeddings_.post_init(host_, /*shared=*/args_.tie_embeddings); }
  // After the DP reduction: both copies receive the sum of both gradients (same bits on both).
  void pre_clip() { embeddings_.pre_clip(host_); }
  void export_state(const std::string& format, const std::map<std::string, at::Tensor>& state, keel::ExportSink& sink) {
    if (format != "hf") throw keel::unsupported_format("llama3", format, "hf");
    llama3::export_hf(host_.raw(), args_, state, sink);
  }
  static void import_config(keel::Host, const std::string& format, const keel::ImportSource& source,
                            keel::ImportedConfig& out) {
    if (format != "hf") throw keel::unsupported_format("llama3", format, "hf");
    llama3::import_hf_config(source, out);
  }
  void import_state(const std::string& format, const keel::ImportSource& source, keel::ExportSink& sink) {
    if (format != "hf") throw keel::unsupported_format("llama3", format, "hf");
    llama3::import_hf(host_.raw(), args_, source, sink);
  }

 private:
  keel::Host host_;
  llama3::Args args_;
  keel::StageReplicas embeddings_;
  std::vector<std::unique_ptr<llama3::Part>> parts_;
};

}  // namespace

KEEL_PLUGIN("llama3", "1.6.0",
            keel::model_component<Llama3>("llama3", "Llama 3 (RMSNorm, RoPE, grouped-query attention, SwiGLU)",
                                          KEEL_HOOK_PRE_CLIP_CAPTURE_SAFE | KEEL_HOOK_PRE_CLIP_REPLICAS_ONLY))
