// A component's extension chain (ABI 1.2): validated once at load; the host keeps the
// extensions it knows and skips the others, so a newer plugin's features never stop it loading.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <keel/keel.h>

namespace keel {

/// A config value of one of the four getter types.
using ConfigValue = std::variant<int64_t, double, bool, std::string>;

/// One key of a component's config table, as the component declares it (ABI 1.3).
struct DeclaredConfigKey {
  std::string name;
  keel_config_type type = KEEL_CONFIG_INT;
  std::optional<ConfigValue> default_value;  ///< absent: not fixed (a model's flavor sets it)
  std::string default_text;                  ///< the declared TOML text, "" when absent
  std::string doc;
};

/// "integer", "float", "boolean" or "string".
const char* config_type_name(keel_config_type type);

/// What a host of this version finds in a component's extension chain.
struct ComponentExtensions {
  /// KEEL_EXTENSION_MODEL_EXPORT (zero-extended to this host's size), or empty (export_state
  /// NULL) when absent.
  keel_model_export_extension model_export{};
  /// KEEL_EXTENSION_MODEL_IMPORT (zero-extended), or empty (import_state NULL) when absent.
  keel_model_import_extension model_import{};
  /// KEEL_EXTENSION_MODEL_RECOMPUTE (zero-extended), or empty (set_recompute NULL) when absent.
  keel_model_recompute_extension model_recompute{};
  /// KEEL_EXTENSION_MODEL_MEMORY (zero-extended), or empty (activation_bytes NULL) when absent.
  keel_model_memory_extension model_memory{};
  /// KEEL_EXTENSION_MODEL_ATTENTION (zero-extended), or empty (set_attention NULL) when absent.
  keel_model_attention_extension model_attention{};
  /// KEEL_EXTENSION_CLIPPER_SHARDS (zero-extended), or empty (bind_gradient_shards NULL) when
  /// absent.
  keel_clipper_shards_extension clipper_shards{};
  /// KEEL_EXTENSION_CONFIG_KEYS: the keys the component reads, in its order; empty when it
  /// declares none (then nothing is checked).
  std::optional<std::vector<DeclaredConfigKey>> config_keys;
  /// Types this host does not know, in chain order (ignored).
  std::vector<int32_t> unknown;
};

/// Walks and validates the extension chain of `component` (from plugin `path`): at most
/// KEEL_MAX_EXTENSIONS entries, each at least a keel_extension, no type twice, a known type
/// complete and on the right kind of component (a model's or a clipper's; declared config
/// keys: named [a-z0-9_]+, unique, of a known type, defaults of that type). A component older
/// than 1.2 has none. Throws InputError naming the plugin, the component and the entry.
ComponentExtensions read_extensions(const std::string& path, const keel_component& component);

}  // namespace keel
