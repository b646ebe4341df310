// keel/import.hpp — model import (SDK 1.4): the checkpoint of another format a model reads
// (ImportSource), the config table it derives from it (ImportedConfig), and helpers shared by
// import formats.
#pragma once

#include <ATen/ATen.h>

#include <keel/keel.h>
#include <keel/config_keys.hpp>
#include <keel/host.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace keel {

/// The host's view of a foreign checkpoint (keel_import_source): config values by path and
/// tensors by name. A failure carries the host's message, which names the file and the value.
class ImportSource {
 public:
  /// Wraps `source`; `host` lets a failing callback's error carry the host's message.
  ImportSource(const keel_import_source* source, keel_host* host) : source_(source), host_(host) {
    if (source == nullptr || source->struct_size < KEEL_IMPORT_SOURCE_SIZE_1_4)
      throw Error(KEEL_ERROR_INVALID_ARGUMENT, "keel_import_source is NULL or older than SDK 1.4");
  }
  /// The integer at `path` ("num_hidden_layers", "rope_scaling.factor"), or nullopt when absent or null.
  std::optional<int64_t> integer(const std::string& path) const { return get<int64_t>(path, KEEL_CONFIG_INT); }
  /// The number at `path` (an integer is accepted), or nullopt when absent or null.
  std::optional<double> real(const std::string& path) const { return get<double>(path, KEEL_CONFIG_FLOAT); }
  /// The boolean at `path`, or nullopt when absent or null.
  std::optional<bool> boolean(const std::string& path) const {
    std::optional<int32_t> v = get<int32_t>(path, KEEL_CONFIG_BOOL);
    return v ? std::optional<bool>(*v != 0) : std::nullopt;
  }
  /// The string at `path`, or nullopt when absent or null.
  std::optional<std::string> string(const std::string& path) const {
    std::optional<const char*> v = get<const char*>(path, KEEL_CONFIG_STRING);
    return v && *v != nullptr ? std::optional<std::string>(*v) : std::nullopt;
  }
  /// "'name' (in FILE)" for messages: the tensor and where the source stores it.
  std::string where(const std::string& name) const {
    const char* file = source_->origin(source_->context, name.c_str());
    return "'" + name + "'" + (file != nullptr ? std::string(" (in ") + file + ")" : std::string());
  }
  /// Whether the source holds tensor `name`.
  bool has(const std::string& name) const { return source_->has_tensor(source_->context, name.c_str()) != 0; }
  /// The tensor `name` as stored (CPU, read-only); throws, naming it, when absent.
  const at::Tensor& tensor(const std::string& name) const {
    const keel_tensor* out = nullptr;
    check(source_->read_tensor(source_->context, name.c_str(), &out), host_);
    if (out == nullptr) throw Error(KEEL_ERROR_INTERNAL, "import: the host returned no tensor for '" + name + "'");
    return keel::tensor(out);
  }

 private:
  template <class T>
  std::optional<T> get(const std::string& path, keel_config_type type) const {
    T out{};
    int32_t found = 0;
    check(source_->config_get(source_->context, path.c_str(), type, &out, &found), host_);
    return found != 0 ? std::optional<T>(out) : std::nullopt;
  }

  const keel_import_source* source_;
  keel_host* host_;
};

/// Where a model's import_config writes its config table (keel_config_sink): one key at a time.
class ImportedConfig {
 public:
  /// Wraps `sink`; `host` lets a failing callback's error carry the host's message.
  ImportedConfig(const keel_config_sink* sink, keel_host* host) : sink_(sink), host_(host) {
    if (sink == nullptr || sink->struct_size < KEEL_CONFIG_SINK_SIZE_1_4)
      throw Error(KEEL_ERROR_INVALID_ARGUMENT, "keel_config_sink is NULL or older than SDK 1.4");
  }
  /// Sets config key `key` to `value` (written as TOML).
  template <class T>
  void set(const std::string& key, const T& value) const {
    check(sink_->set(sink_->context, key.c_str(), toml_text(value).c_str()), host_);
  }
  /// Sets an integer key.
  void set(const std::string& key, int value) const { set(key, static_cast<int64_t>(value)); }
  /// Sets a string key.
  void set(const std::string& key, const char* value) const { set(key, std::string(value)); }

 private:
  const keel_config_sink* sink_;
  keel_host* host_;
};

/// The error a model raises for a config value it cannot represent.
inline Error unsupported_config(const std::string& field, const std::string& why) {
  return Error(KEEL_ERROR_UNSUPPORTED, "config.json: " + field + ": " + why);
}

/// The shape as "[a, b]".
inline std::string shape_text(at::IntArrayRef shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i > 0 ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

/// The largest size an import takes from config.json (a vocabulary, a width, an expert count):
/// three such sizes multiplied by four bytes still fit 64 bits, so a tensor shaped from them
/// cannot overflow before the host compares its bytes with the folder's. 2^20: four times the
/// largest published vocabulary.
constexpr int64_t kMaxImportSize = int64_t{1} << 20;

/// The size config.json gives at `field`, refused naming the field when it is missing or outside
/// [`min`, kMaxImportSize]; `model` names what needs it ("DeepseekV3ForCausalLM").
inline int64_t import_size(const ImportSource& source, const std::string& field, const std::string& model,
                           int64_t min = 0) {
  const std::optional<int64_t> value = source.integer(field);
  if (!value) throw unsupported_config(field, "missing (" + model + " needs it)");
  if (*value < min || *value > kMaxImportSize)
    throw unsupported_config(field, std::to_string(*value) + " is outside [" + std::to_string(min) + ", " +
                                        std::to_string(kMaxImportSize) + "]");
  return *value;
}

/// `value` (the fp32 weight `name`), refused naming it and its file when it holds a NaN or an
/// infinity: a damaged checkpoint must not start a run.
/// Whether every element of `value` is finite (true for a tensor that is not floating-point).
inline bool all_finite(const at::Tensor& value) {
  if (!at::isFloatingType(value.scalar_type())) return true;
  // In slices: isfinite's temporaries over a whole vocab-sized table would double the
  // import's memory.
  const at::Tensor flat = value.reshape({-1});
  constexpr int64_t kSlice = int64_t{1} << 20;
  for (int64_t begin = 0; begin < flat.numel(); begin += kSlice)
    if (!at::isfinite(flat.slice(0, begin, std::min(flat.numel(), begin + kSlice))).all().item<bool>()) return false;
  return true;
}

inline at::Tensor finite_weight(const ImportSource& source, const std::string& name, at::Tensor value) {
  if (!all_finite(value))
    throw Error(KEEL_ERROR_INVALID_ARGUMENT, "import: " + source.where(name) + " holds a NaN or an infinity");
  return value;
}

/// The layer count config.json's `field` gives, checked against the folder before any model is
/// built from it: at least 1, and the folder holds `model.layers.<count - 1>.<probe>` (a count
/// the weights do not have is refused naming the field, whatever its size).
inline int64_t import_layer_count(const ImportSource& source, const std::string& field, const std::string& probe) {
  std::optional<int64_t> count = source.integer(field);
  if (!count) throw unsupported_config(field, "missing");
  if (*count < 1 || *count > (int64_t{1} << 20) ||
      !source.has("model.layers." + std::to_string(*count - 1) + "." + probe))
    throw unsupported_config(field, std::to_string(*count) + ", but the folder has no model.layers." +
                                        std::to_string(*count < 1 ? 0 : *count - 1) + "." + probe);
  return *count;
}

/// The weight `name` of `source` in fp32, checked against `shape`: a float8_e4m3fn weight is
/// dequantized with its `<name>_scale_inv` block scales; NaN and infinities are refused (DeepSeek-V3's FP8 release:
/// each block x block tile, the last ones cut at the edges, times one fp32 scale).
inline at::Tensor import_weight(const ImportSource& source, const std::string& name, at::IntArrayRef shape,
                                int64_t block = 128) {
  const at::Tensor& stored = source.tensor(name);
  if (stored.sizes() != shape)
    throw Error(KEEL_ERROR_INVALID_ARGUMENT, "import: " + source.where(name) + " has shape " +
                                                 shape_text(stored.sizes()) + ", the config gives " +
                                                 shape_text(shape));
  if (stored.scalar_type() != at::kFloat8_e4m3fn) {
    if (!at::isFloatingType(stored.scalar_type()))
      throw Error(KEEL_ERROR_INVALID_ARGUMENT, "import: " + source.where(name) + " is " +
                                                   c10::toString(stored.scalar_type()) +
                                                   ", not a floating-point tensor");
    return finite_weight(source, name, stored.to(at::kFloat));
  }
  if (stored.dim() != 2)
    throw Error(KEEL_ERROR_INVALID_ARGUMENT,
                "import: '" + name + "' is float8 but not a matrix: no block scales apply");
  const std::string scale_name = name + "_scale_inv";
  if (!source.has(scale_name))
    throw Error(KEEL_ERROR_INVALID_ARGUMENT,
                "import: '" + name + "' is float8_e4m3fn but '" + scale_name + "' is missing");
  const int64_t rows = stored.size(0), cols = stored.size(1);
  const int64_t block_rows = (rows + block - 1) / block, block_cols = (cols + block - 1) / block;
  const at::Tensor scale = import_weight(source, scale_name, {block_rows, block_cols});
  // Each scale covers its tile: repeat it over the tile, cut at the matrix's edges.
  at::Tensor expanded =
      scale.repeat_interleave(block, 0).repeat_interleave(block, 1).slice(0, 0, rows).slice(1, 0, cols);
  // Checked after the product: a finite FP8 value times a large finite scale can overflow.
  return finite_weight(source, name, stored.to(at::kFloat) * expanded);
}

}  // namespace keel
