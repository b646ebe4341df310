// A component's extension chain (ABI 1.2): validated once at load; the host keeps the
// extensions it knows and skips the others, so a newer plugin's features never stop it loading.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <keel/keel.h>

namespace keel {

/// What a host of this version finds in a component's extension chain.
struct ComponentExtensions {
  /// KEEL_EXTENSION_MODEL_EXPORT (zero-extended to this host's size), or empty (export_state
  /// NULL) when absent.
  keel_model_export_extension model_export{};
  /// Types this host does not know, in chain order (ignored).
  std::vector<int32_t> unknown;
};

/// Walks and validates the extension chain of `component` (from plugin `path`): at most
/// KEEL_MAX_EXTENSIONS entries, each at least a keel_extension, no type twice, a known type
/// complete and on the right kind of component. A component older than 1.2 has none. Throws
/// InputError naming the plugin, the component and the entry.
ComponentExtensions read_extensions(const std::string& path, const keel_component& component);

}  // namespace keel
