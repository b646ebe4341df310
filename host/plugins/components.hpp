// C++ handles on plugin components: a Model with its Parts and a Clipper. Every call goes
// through the component's vtable and turns a failed status into an exception that names the
// component, the call and the component's own message.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <keel/keel.h>
#include <keel/param_view.hpp>

#include "plugins/component_config.hpp"
#include "plugins/extensions.hpp"
#include "plugins/host_context.hpp"

namespace keel {

class ConfigSection;

/// The host's record of one parameter or buffer of a part: its own normalised copy of the
/// model's keel_param_info (this host's struct_size, module_group never NULL), read through
/// keel::ParamView, and the record clippers receive, never the model plugin's struct. Copies
/// share the record.
class ParamRef : public ParamView {
 public:
  /// The host's record of a model's complete entry (every ABI 1.0 field read).
  explicit ParamRef(const keel_param_info& entry) : ParamRef(own(entry)) {}
  /// The canonical FQN.
  const std::string& fqn() const { return record_->fqn; }
  /// The module group the parameter counts under ("main" when the model gave none).
  const std::string& module_group() const { return record_->module_group; }
  /// The C record handed to clippers; stable while any copy of this ParamRef lives.
  const keel_param_info* info() const { return &record_->info; }

 private:
  struct Record {
    keel_param_info info;
    std::string fqn, module_group;
  };
  static std::shared_ptr<const Record> own(const keel_param_info& entry);
  explicit ParamRef(std::shared_ptr<const Record> record) : ParamView(&record->info), record_(std::move(record)) {}

  std::shared_ptr<const Record> record_;
};

class Model;

/// What a model exports in another format: tensors under the format's names, in the order
/// given, and text files (file name -> contents).
struct ModelExport {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::map<std::string, std::string> files;
};

/// One pipeline part of a model.
class ModelPart {
 public:
  ModelPart(Model& model, keel_part* raw, const keel_part_spec& spec);
  /// The part's trainable parameters.
  const std::vector<ParamRef>& parameters() const { return parameters_; }
  /// The part's buffers.
  const std::vector<ParamRef>& buffers() const { return buffers_; }
  /// The spec it was built from.
  const keel_part_spec& spec() const { return spec_; }
  /// Initialises weights from `seed`.
  void init_weights(uint64_t seed);
  /// Runs one microbatch; returns the activation (non-last stage) or the loss sum (last).
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& labels, const at::Tensor* activation, int microbatch,
                     int num_microbatches);

 private:
  std::vector<ParamRef> list(bool buffers);

  Model& model_;
  keel_part* raw_;
  keel_part_spec spec_;
  std::vector<ParamRef> parameters_;
  std::vector<ParamRef> buffers_;
};

/// A model component instance.
class Model {
 public:
  /// Creates the model from its table ([model.<component>] or [model]); unread keys are
  /// checked by the caller.
  Model(const keel_component& component, const std::string& plugin_name, const ConfigSection& config,
        HostServices services);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  /// What the model reports of itself.
  const keel_model_info& info() const { return info_; }
  /// Builds one part (owned by this model).
  ModelPart& build_part(const keel_part_spec& spec);
  /// The parts built so far.
  const std::vector<std::unique_ptr<ModelPart>>& parts() const { return parts_; }
  /// Runs post_init if the model has it.
  void post_init();
  /// Runs pre_clip if the model has it.
  void pre_clip();
  /// Runs post_step if the model has it.
  void post_step();
  /// The model's consolidated `state` (canonical FQN -> whole CPU tensor) in `format`. An
  /// InputError naming the plugin and the format when the model cannot export (no
  /// export_state, as in every ABI 1.0 plugin) or does not know the format.
  ModelExport export_state(const std::string& format, const std::vector<std::pair<std::string, at::Tensor>>& state);
  /// Hands each tensor the model imports from `source` in `format` to `receive` (canonical
  /// FQN, whole CPU tensor), one at a time; an exception from `receive` refuses the tensor. An
  /// InputError names the plugin when the model cannot import, does not know the format, or
  /// refuses the source.
  void import_state(const std::string& format, const keel_import_source& source,
                    const std::function<void(const std::string&, const at::Tensor&)>& receive);
  /// Asks the model to recompute `mode` (a training.recompute name but "none") in the parts it builds next;
  /// an InputError naming `key` and the plugin when it does not implement that mode.
  void set_recompute(const std::string& mode, const std::string& key);
  /// Asks the model for document masking (KEEL_ATTENTION_* `flags`) in the parts it builds
  /// next; an InputError naming `key` and the plugin when it cannot honour them.
  void set_attention(uint32_t flags, const std::string& key);
  /// The KEEL_ATTENTION_* flags set (0: causal attention over the whole sample).
  uint32_t attention() const { return attention_; }
  /// The EOS id that ends documents, read by every forward under document masking.
  void set_document_end(int64_t eos) { document_end_ = eos; }
  /// The EOS id set_document_end() recorded.
  std::optional<int64_t> document_end() const { return document_end_; }
  /// The model's estimate of what one forward of the part `spec` keeps for backward, for a
  /// [batch, seq] microbatch under recompute `mode`; nullopt when its plugin offers none.
  std::optional<int64_t> activation_bytes(const keel_part_spec& spec, int64_t batch, int64_t seq,
                                          keel_recompute_mode mode);
  /// The vtable (zero-extended to this host's size).
  const keel_model_vtable& vtable() const { return vtable_; }
  /// The extensions of the model's component that this host knows.
  const ComponentExtensions& extensions() const { return extensions_; }
  /// The host context the model reports to.
  HostContext& context() { return context_; }
  /// "model <component> (<plugin>)", for messages.
  const std::string& label() const { return context_.label(); }

 private:
  keel_model_vtable vtable_{};
  ComponentExtensions extensions_;
  uint32_t attention_ = 0;
  std::optional<int64_t> document_end_;
  ComponentConfig config_;
  HostContext context_;
  keel_model* raw_ = nullptr;
  keel_model_info info_{};
  std::vector<std::unique_ptr<ModelPart>> parts_;
};

/// A clipper component instance.
class Clipper {
 public:
  /// Creates the clipper from its table ([clipper.<component>] or [clipper]); unread keys are
  /// checked by the caller.
  Clipper(const keel_component& component, const std::string& plugin_name, const ConfigSection& config,
          HostServices services);
  ~Clipper();
  Clipper(const Clipper&) = delete;
  Clipper& operator=(const Clipper&) = delete;

  /// Hands the clipper the host's records of every parameter of this rank, once, in clip()
  /// order; `params` (the array itself) must outlive the clipper's use of it.
  void bind_model_parts(const std::vector<const keel_param_info*>& params);
  /// Whether the clipper clips reduce-scattered gradients (KEEL_EXTENSION_CLIPPER_SHARDS).
  bool takes_gradient_shards() const { return extensions_.clipper_shards.bind_gradient_shards != nullptr; }
  /// After bind_model_parts: from now on clip() counts and scales only `owned` (flat views of
  /// reduced gradient rows), owned[i] belonging to owners[i]. Both arrays must outlive the
  /// clipper's use of them. Requires takes_gradient_shards().
  void bind_gradient_shards(const std::vector<const keel_param_info*>& owners, std::vector<at::Tensor>& owned);
  /// Clips in place; returns the total norm as a device tensor. `params` is the array given to
  /// bind_model_parts.
  at::Tensor clip(const std::vector<const keel_param_info*>& params);
  /// The clipper's state tensors (empty when stateless).
  std::vector<std::pair<std::string, at::Tensor*>> state();
  /// The vtable (zero-extended to this host's size).
  const keel_clipper_vtable& vtable() const { return vtable_; }
  /// The extensions of the clipper's component that this host knows.
  const ComponentExtensions& extensions() const { return extensions_; }
  /// "clipper <component> (<plugin>)", for messages.
  const std::string& label() const { return context_.label(); }

 private:
  keel_clipper_vtable vtable_{};
  ComponentExtensions extensions_;
  ComponentConfig config_;
  HostContext context_;
  keel_clipper* raw_ = nullptr;
  std::vector<keel_tensor*> owned_handles_;
};

}  // namespace keel
