// keel/export.hpp — model export: the sink a model hands tensors and files to, and helpers
// shared by export formats.
#pragma once

#include <ATen/ATen.h>

#include <keel/keel.h>
#include <keel/host.hpp>
#include <keel/part.hpp>

#include <map>
#include <string>
#include <vector>

namespace keel {

// ------------------------------------------------------------------ model export

/// The host's receiver of a model export (keel_export_sink): each call hands over one tensor
/// or file, which the host takes before returning.
class ExportSink {
 public:
  /// Wraps `sink`; `host` (optional) lets a failing callback's error carry the host's message.
  explicit ExportSink(const keel_export_sink* sink, keel_host* host = nullptr) : sink_(sink), host_(host) {
    if (sink == nullptr || sink->struct_size < KEEL_EXPORT_SINK_SIZE_1_1)
      throw Error(KEEL_ERROR_INVALID_ARGUMENT, "keel_export_sink is NULL or older than SDK 1.1");
  }
  /// Hands over `value` under `name` (a name of the target format).
  void tensor(const std::string& name, const at::Tensor& value) const {
    check(sink_->tensor(sink_->context, name.c_str(), handle(value)), host_);
  }
  /// Hands over the text file `name` (a plain file name, e.g. "config.json").
  void file(const std::string& name, const std::string& text) const {
    check(sink_->file(sink_->context, name.c_str(), text.c_str()), host_);
  }

 private:
  const keel_export_sink* sink_;
  keel_host* host_;
};

/// The spec of the whole model (`layers` layers) as one stage on the meta device: nothing is
/// allocated, and its parameters give the FQNs and global shapes an export or import checks.
inline keel_part_spec whole_model_on_meta(int64_t layers) {
  keel_part_spec spec{};
  spec.struct_size = sizeof(spec);
  spec.num_stages = 1;
  spec.num_layers = static_cast<int32_t>(layers);
  spec.device_type = KEEL_DEVICE_META;
  return spec;
}

/// The name transformers' config.json uses for a dtype ("float32", "bfloat16", "float16").
inline std::string transformers_dtype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return "float32";
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    default:
      throw Error(KEEL_ERROR_UNSUPPORTED, std::string("export: no transformers dtype for ") + c10::toString(dtype));
  }
}

/// The error a model raises for an export format it does not know.
inline Error unsupported_format(const std::string& model, const std::string& format, const std::string& known) {
  return Error(KEEL_ERROR_UNSUPPORTED, model + " cannot export format '" + format + "'; it exports: " + known);
}

/// Checks that an export's `state` holds exactly the parameters and persistent buffers that
/// `whole` declares (a part holding the whole model, e.g. built on the meta device), each with
/// its global shape; throws naming the first FQN that is missing, unknown or misshapen.
inline void check_export_state(Part& whole, const std::map<std::string, at::Tensor>& state) {
  std::map<std::string, std::vector<int64_t>> expected;
  auto collect = [&](ParamTable& table, bool persistent_only) {
    for (const auto& r : table.records()) {
      if (persistent_only && !r->persistent()) continue;
      std::vector<int64_t> shape = r->tensor().sizes().vec();
      if (r->shard_dim() >= 0) shape[static_cast<size_t>(r->shard_dim())] = r->global_dim_size();
      expected.emplace(r->fqn(), std::move(shape));
    }
  };
  collect(whole.parameters(), false);
  collect(whole.buffers(), true);
  auto text = [](const std::vector<int64_t>& shape) {
    std::string out = "[";
    for (size_t i = 0; i < shape.size(); ++i) out += (i > 0 ? ", " : "") + std::to_string(shape[i]);
    return out + "]";
  };
  for (const auto& [fqn, shape] : expected) {
    auto it = state.find(fqn);
    if (it == state.end()) throw Error(KEEL_ERROR_INVALID_ARGUMENT, "export: the state lacks '" + fqn + "'");
    if (it->second.sizes().vec() != shape)
      throw Error(KEEL_ERROR_INVALID_ARGUMENT, "export: '" + fqn + "' has shape " + text(it->second.sizes().vec()) +
                                                   ", the model's config gives " + text(shape));
  }
  for (const auto& [fqn, value] : state)
    if (expected.count(fqn) == 0)
      throw Error(KEEL_ERROR_INVALID_ARGUMENT, "export: '" + fqn + "' is not a tensor of this model's config");
}

}  // namespace keel
