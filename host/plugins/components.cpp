#include "plugins/components.hpp"

#include <keel/keel.hpp>
#include <keel/recompute_mode.hpp>

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>
#include <stdexcept>

#include "common/error.hpp"
#include "common/text.hpp"
#include "config/config_tree.hpp"
#include "plugins/versioned.hpp"

namespace keel {

namespace {

// The host's own record of a model's entry. Every field is in ABI 1.0, so an entry shorter
// than that is refused rather than half read.
ParamRef to_ref(const keel_param_info* info, const std::string& owner) {
  if (info == nullptr || info->struct_size < KEEL_PARAM_INFO_SIZE_1_0)
    throw std::runtime_error(cat(owner, ": a parameter entry is NULL or smaller than keel_param_info of ABI 1.0 (",
                                 info == nullptr ? 0 : info->struct_size, " < ", KEEL_PARAM_INFO_SIZE_1_0, " bytes)"));
  keel_param_info full = copy_versioned<keel_param_info>(info);
  if (full.fqn == nullptr || full.fqn[0] == '\0') throw std::runtime_error(cat(owner, ": a parameter has no FQN"));
  if (full.tensor == nullptr || !keel::tensor(full.tensor).defined())
    throw std::runtime_error(cat(owner, ": parameter '", full.fqn, "' has no tensor"));
  return ParamRef(full);
}

}  // namespace

// ------------------------------------------------------------------ ParamRef

std::shared_ptr<const ParamRef::Record> ParamRef::own(const keel_param_info& entry) {
  auto record = std::make_shared<Record>();
  record->info = entry;
  record->info.struct_size = sizeof(keel_param_info);
  record->fqn = entry.fqn != nullptr ? entry.fqn : "";
  record->module_group = entry.module_group != nullptr ? entry.module_group : "main";
  // The C record's strings point into the block that owns them.
  record->info.fqn = record->fqn.c_str();
  record->info.module_group = record->module_group.c_str();
  return record;
}

// ------------------------------------------------------------------ ModelPart

ModelPart::ModelPart(Model& model, keel_part* raw, const keel_part_spec& spec) : model_(model), raw_(raw), spec_(spec) {
  parameters_ = list(false);
  buffers_ = list(true);
}

std::vector<ParamRef> ModelPart::list(bool buffers) {
  const keel_param_info* const* entries = nullptr;
  size_t count = 0;
  auto call = buffers ? model_.vtable().buffers : model_.vtable().parameters;
  model_.context().check(call(raw_, &entries, &count), buffers ? "buffers" : "parameters");
  std::vector<ParamRef> out;
  std::set<std::string> seen;
  std::string owner = cat(model_.context().label(), " part ", spec_.stage_index);
  for (size_t i = 0; i < count; ++i) {
    out.push_back(to_ref(entries[i], owner));
    if (!seen.insert(out.back().fqn()).second)
      throw std::runtime_error(cat(owner, ": FQN '", out.back().fqn(), "' is listed twice"));
  }
  return out;
}

void ModelPart::init_weights(uint64_t seed) {
  model_.context().check(model_.vtable().init_weights(raw_, seed), "init_weights");
}

at::Tensor ModelPart::forward(const at::Tensor& tokens, const at::Tensor& labels, const at::Tensor* activation,
                              int microbatch, int num_microbatches) {
  keel_forward_inputs in{};
  in.struct_size = sizeof(in);
  in.tokens = handle(tokens);
  in.labels = handle(labels);
  in.activation = activation != nullptr ? handle(*activation) : nullptr;
  in.microbatch = microbatch;
  in.num_microbatches = num_microbatches;
  at::Tensor documents, positions;
  if ((model_.attention() & KEEL_ATTENTION_BLOCK_CAUSAL) != 0) {
    if (!model_.document_end())
      throw std::logic_error(cat(model_.label(), ": document masking without the EOS id that ends documents"));
    // An EOS belongs to the document it ends: the next position starts another.
    const at::Tensor ends = tokens.eq(*model_.document_end()).to(at::kLong);
    documents = ends.cumsum(1) - ends;
    in.documents = handle(documents);
    if ((model_.attention() & KEEL_ATTENTION_RESET_POSITIONS) != 0) {
      // Each position minus the index of its document's first position.
      const at::Tensor index = at::arange(tokens.size(1), tokens.options()).expand_as(tokens);
      const at::Tensor starts = at::cat({at::ones_like(ends.narrow(1, 0, 1)), ends.narrow(1, 0, ends.size(1) - 1)}, 1);
      positions = index - std::get<0>(at::cummax(index * starts, 1));
      in.positions = handle(positions);
    }
  }
  at::Tensor out_activation, out_loss;
  keel_forward_outputs out{};
  out.struct_size = sizeof(out);
  out.activation = handle(out_activation);
  out.loss_sum = handle(out_loss);
  model_.context().check(model_.vtable().forward(raw_, &in, &out), "forward");
  bool last = spec_.stage_index == spec_.num_stages - 1;
  at::Tensor& result = last ? out_loss : out_activation;
  if (!result.defined())
    throw std::runtime_error(cat(model_.context().label(), ": forward of stage ", spec_.stage_index, " set no ",
                                 last ? "loss_sum" : "activation"));
  return result;
}

// ------------------------------------------------------------------ Model

Model::Model(const keel_component& component, const std::string& plugin_name, const ConfigSection& config,
             HostServices services)
    : vtable_(copy_versioned<keel_model_vtable>(component.vtable)),
      extensions_(read_extensions(plugin_name, component)),
      config_(config, extensions_.config_keys),
      context_(cat("model ", component.name, " (", plugin_name, ")"), services) {
  context_.check(vtable_.create(context_.raw(), HostContext::config_handle(config_), &raw_), "create");
  if (!config_.violation().empty()) {
    if (raw_ != nullptr) vtable_.destroy(raw_);
    throw std::runtime_error(cat(context_.label(), ": create ", config_.violation(), " (and reported success)"));
  }
  if (raw_ == nullptr) throw std::runtime_error(cat(context_.label(), ": create returned no model"));
  info_.struct_size = sizeof(info_);
  context_.check(vtable_.info(raw_, &info_), "info");
  if (info_.vocab_size <= 0 || info_.num_layers < 0 || info_.hidden_size <= 0)
    throw std::runtime_error(cat(context_.label(), ": info() reports vocab ", info_.vocab_size, ", layers ",
                                 info_.num_layers, ", hidden ", info_.hidden_size));
}

Model::~Model() {
  parts_.clear();
  if (raw_ != nullptr) vtable_.destroy(raw_);
}

ModelPart& Model::build_part(const keel_part_spec& spec) {
  keel_part* raw = nullptr;
  context_.check(vtable_.build_part(raw_, &spec, &raw), "build_part");
  if (raw == nullptr) throw std::runtime_error(cat(context_.label(), ": build_part returned no part"));
  parts_.push_back(std::make_unique<ModelPart>(*this, raw, spec));
  return *parts_.back();
}

void Model::post_init() {
  if (vtable_.post_init != nullptr) context_.check(vtable_.post_init(raw_), "post_init");
}
void Model::pre_clip() {
  if (vtable_.pre_clip != nullptr) context_.check(vtable_.pre_clip(raw_), "pre_clip");
}
void Model::post_step() {
  if (vtable_.post_step != nullptr) context_.check(vtable_.post_step(raw_), "post_step");
}

namespace {

// The host's side of keel_export_sink: what the model hands over is kept here; a refusal is
// reported to the model's context like any host API error.
struct ExportReceiver {
  HostContext* context;
  ModelExport result;
  std::set<std::string> names;

  static keel_status refuse(ExportReceiver& self, const std::string& why) {
    host_api().set_error(self.context->raw(), KEEL_ERROR_INVALID_ARGUMENT, why.c_str());
    return KEEL_ERROR_INVALID_ARGUMENT;
  }
  static keel_status tensor(void* context, const char* name, const keel_tensor* value) {
    auto& self = *static_cast<ExportReceiver*>(context);
    if (name == nullptr || name[0] == '\0') return refuse(self, "export: a tensor without a name");
    if (value == nullptr || !keel::tensor(value).defined())
      return refuse(self, cat("export: tensor '", name, "' is undefined"));
    if (!self.names.insert(name).second) return refuse(self, cat("export: tensor '", name, "' given twice"));
    self.result.tensors.emplace_back(name, keel::tensor(value).detach());
    return KEEL_OK;
  }
  static keel_status file(void* context, const char* name, const char* text) {
    auto& self = *static_cast<ExportReceiver*>(context);
    std::string n = name != nullptr ? name : "";
    // The caller writes files under its output folder: a name must not leave it.
    if (n.empty() || n == "." || n == ".." || n.find('/') != std::string::npos)
      return refuse(self, cat("export: file name '", n, "' is not a plain file name"));
    if (text == nullptr) return refuse(self, cat("export: file '", n, "' has no text"));
    if (!self.result.files.emplace(n, text).second) return refuse(self, cat("export: file '", n, "' given twice"));
    return KEEL_OK;
  }
};

}  // namespace

void Model::set_recompute(const std::string& mode, const std::string& key) {
  const std::optional<keel::Recompute> named = keel::recompute_named(mode);
  if (!named || *named == keel::Recompute::none)
    throw std::logic_error(cat("Model::set_recompute: \"", mode, "\" is not a mode to ask a model for"));
  const keel::Recompute wanted = *named;
  const keel_model_recompute_extension& e = extensions_.model_recompute;
  if (e.set_recompute == nullptr)
    throw InputError(cat(key, " = \"", mode, "\": ", context_.label(),
                         " does not recompute activations (its plugin offers no KEEL_EXTENSION_MODEL_RECOMPUTE, "
                         "SDK 1.6); use \"none\""));
  if ((e.modes & keel::recompute_bit(wanted)) == 0) {
    std::vector<std::string> offered = {"\"none\""};
    for (const keel::RecomputeName& n : keel::kRecomputeNames)
      if (n.mode != keel::Recompute::none && (e.modes & keel::recompute_bit(n.mode)) != 0)
        offered.push_back(cat("\"", n.name, "\""));
    throw InputError(cat(key, " = \"", mode, "\": ", context_.label(), " recomputes only ", join(offered, ", ")));
  }
  context_.check(e.set_recompute(raw_, static_cast<int32_t>(wanted)), "set_recompute");
}

void Model::set_attention(uint32_t flags, const std::string& key) {
  const keel_model_attention_extension& e = extensions_.model_attention;
  if (e.set_attention == nullptr)
    throw InputError(cat(key, " = \"block_causal\": ", context_.label(),
                         " cannot mask attention by document (its plugin offers no KEEL_EXTENSION_MODEL_ATTENTION, "
                         "SDK 1.9); use \"causal\""));
  if ((e.supported & flags) != flags)
    throw InputError(cat(key, " = \"block_causal\" with data.reset_positions = true: ", context_.label(),
                         " masks attention by document but cannot restart positions per document; set "
                         "data.reset_positions = false"));
  context_.check(e.set_attention(raw_, flags), "set_attention");
  attention_ = flags;
}

std::optional<int64_t> Model::activation_bytes(const keel_part_spec& spec, int64_t batch, int64_t seq,
                                               keel_recompute_mode mode) {
  const keel_model_memory_extension& e = extensions_.model_memory;
  if (e.activation_bytes == nullptr) return std::nullopt;
  int64_t bytes = -1;
  context_.check(e.activation_bytes(raw_, &spec, batch, seq, mode, &bytes), "activation_bytes");
  // A plugin's figure is outside input like any other: a negative one is a broken estimate.
  if (bytes < 0) throw InputError(cat(context_.label(), ": activation_bytes gave ", bytes, " bytes"));
  return bytes;
}

ModelExport Model::export_state(const std::string& format,
                                const std::vector<std::pair<std::string, at::Tensor>>& state) {
  // 1.2 offers export as an extension; a 1.1 plugin has it in the vtable.
  auto* export_state =
      extensions_.model_export.export_state != nullptr ? extensions_.model_export.export_state : vtable_.export_state;
  if (export_state == nullptr)
    throw InputError(cat(context_.label(), " cannot export to '", format,
                         "': the plugin has no export_state (it was built against SDK 1.0, or its model does not "
                         "support export)"));
  std::vector<at::Tensor> tensors;  // the handles' slots (shallow copies of the caller's tensors)
  for (const auto& item : state) tensors.push_back(item.second);
  std::vector<keel_named_tensor> entries(state.size());
  std::vector<const keel_named_tensor*> pointers;
  for (size_t i = 0; i < state.size(); ++i) {
    entries[i] = {sizeof(keel_named_tensor), state[i].first.c_str(), handle(tensors[i])};
    pointers.push_back(&entries[i]);
  }
  ExportReceiver receiver{&context_, {}, {}};
  keel_export_sink sink{sizeof(keel_export_sink), &receiver, &ExportReceiver::tensor, &ExportReceiver::file};
  keel_status status = export_state(raw_, format.c_str(), pointers.data(), pointers.size(), &sink);
  try {
    context_.check(status, "export_state");
  } catch (const std::runtime_error& e) {
    // An unknown format is the user's request, not a failure of the model.
    if (status == KEEL_ERROR_UNSUPPORTED) throw InputError(e.what());
    throw;
  }
  return std::move(receiver.result);
}

namespace {

// The sink of an import: each tensor goes to the caller's receiver at once.
struct ImportReceiver {
  HostContext* context;
  const std::function<void(const std::string&, const at::Tensor&)>* receive;

  static keel_status tensor(void* context, const char* name, const keel_tensor* value) {
    auto& self = *static_cast<ImportReceiver*>(context);
    std::string why;
    if (name == nullptr || name[0] == '\0') {
      why = "import: a tensor without a name";
    } else if (value == nullptr || !keel::tensor(value).defined()) {
      why = cat("import: tensor '", name, "' is undefined");
    } else {
      // A tensor that does not fit the model is bad input; a failure to write it (a full disk)
      // is not.
      try {
        (*self.receive)(name, keel::tensor(value).detach());
        return KEEL_OK;
      } catch (const InputError& e) {
        why = e.what();
      } catch (const std::exception& e) {
        host_api().set_error(self.context->raw(), KEEL_ERROR_RUNTIME, e.what());
        return KEEL_ERROR_RUNTIME;
      }
    }
    host_api().set_error(self.context->raw(), KEEL_ERROR_INVALID_ARGUMENT, why.c_str());
    return KEEL_ERROR_INVALID_ARGUMENT;
  }
  static keel_status file(void* context, const char* name, const char*) {
    auto& self = *static_cast<ImportReceiver*>(context);
    host_api().set_error(
        self.context->raw(), KEEL_ERROR_INVALID_ARGUMENT,
        cat("import: file '", name != nullptr ? name : "", "': an import produces tensors only").c_str());
    return KEEL_ERROR_INVALID_ARGUMENT;
  }
};

}  // namespace

void Model::import_state(const std::string& format, const keel_import_source& source,
                         const std::function<void(const std::string&, const at::Tensor&)>& receive) {
  if (extensions_.model_import.import_state == nullptr)
    throw InputError(cat(context_.label(), " cannot import '", format,
                         "': the plugin has no import extension (it was built against an SDK before 1.4, or its "
                         "model does not support import)"));
  ImportReceiver receiver{&context_, &receive};
  keel_export_sink sink{sizeof(keel_export_sink), &receiver, &ImportReceiver::tensor, &ImportReceiver::file};
  const keel_status status = extensions_.model_import.import_state(raw_, format.c_str(), &source, &sink);
  try {
    context_.check(status, "import_state");
  } catch (const std::runtime_error& e) {
    if (status == KEEL_ERROR_UNSUPPORTED) throw InputError(e.what());
    throw;
  }
}

// ------------------------------------------------------------------ Clipper

Clipper::Clipper(const keel_component& component, const std::string& plugin_name, const ConfigSection& config,
                 HostServices services)
    : vtable_(copy_versioned<keel_clipper_vtable>(component.vtable)),
      extensions_(read_extensions(plugin_name, component)),
      config_(config, extensions_.config_keys),
      context_(cat("clipper ", component.name, " (", plugin_name, ")"), services) {
  context_.check(vtable_.create(context_.raw(), HostContext::config_handle(config_), &raw_), "create");
  if (!config_.violation().empty()) {
    if (raw_ != nullptr) vtable_.destroy(raw_);
    throw std::runtime_error(cat(context_.label(), ": create ", config_.violation(), " (and reported success)"));
  }
  if (raw_ == nullptr) throw std::runtime_error(cat(context_.label(), ": create returned no clipper"));
}

Clipper::~Clipper() {
  if (raw_ != nullptr) vtable_.destroy(raw_);
}

void Clipper::bind_model_parts(const std::vector<const keel_param_info*>& params) {
  if (vtable_.bind_model_parts != nullptr)
    context_.check(vtable_.bind_model_parts(raw_, params.data(), params.size()), "bind_model_parts");
}

void Clipper::bind_gradient_shards(const std::vector<const keel_param_info*>& owners, std::vector<at::Tensor>& owned) {
  if (!takes_gradient_shards() || owners.size() != owned.size())
    throw std::logic_error(cat(context_.label(), ": bind_gradient_shards without the extension or with ", owners.size(),
                               " owners for ", owned.size(), " views"));
  owned_handles_.clear();
  for (at::Tensor& t : owned) owned_handles_.push_back(handle(t));
  context_.check(extensions_.clipper_shards.bind_gradient_shards(raw_, owners.data(), owned_handles_.data(),
                                                                 owned_handles_.size()),
                 "bind_gradient_shards");
}

at::Tensor Clipper::clip(const std::vector<const keel_param_info*>& params) {
  at::Tensor total_norm;
  context_.check(vtable_.clip(raw_, params.data(), params.size(), handle(total_norm)), "clip");
  if (!total_norm.defined() || total_norm.numel() != 1)
    throw std::runtime_error(cat(context_.label(), ": clip returned no scalar total norm"));
  return total_norm;
}

std::vector<std::pair<std::string, at::Tensor*>> Clipper::state() {
  std::vector<std::pair<std::string, at::Tensor*>> out;
  if (vtable_.state == nullptr) return out;
  const keel_named_tensor* const* entries = nullptr;
  size_t count = 0;
  context_.check(vtable_.state(raw_, &entries, &count), "state");
  if (count > 0 && entries == nullptr) throw std::runtime_error(cat(context_.label(), ": state lists no array"));
  for (size_t i = 0; i < count; ++i) {
    const keel_named_tensor* e = entries[i];
    if (e == nullptr || e->struct_size < KEEL_NAMED_TENSOR_SIZE_1_0 || e->name == nullptr || e->name[0] == '\0' ||
        e->tensor == nullptr)
      throw std::runtime_error(cat(context_.label(), ": state entry #", i, " is NULL, too small or incomplete"));
    out.push_back({e->name, &keel::tensor(e->tensor)});
  }
  return out;
}

}  // namespace keel
