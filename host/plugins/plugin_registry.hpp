// Finds, loads and validates plugins. Validation runs in a fixed order, each failure with its
// own message naming the file, what was expected and what was found:
//   cannot open -> no entry symbol -> descriptor too small -> ABI major mismatch ->
//   LibTorch mismatch -> missing required function -> component not found -> wrong kind.
// Loaded libraries stay loaded for the life of the process.
#pragma once

#include <string>
#include <vector>

#include <keel/keel.h>

namespace keel {

/// A validated plugin: its file and descriptor (valid for the life of the process).
struct LoadedPlugin {
  std::string path;
  const keel_plugin_descriptor* descriptor = nullptr;
};

/// The search path: --plugin-path dirs, then KEEL_PLUGIN_PATH (':'-separated), then the
/// installation's plugin folder (<prefix>/lib/keel/plugins, found from the executable).
std::vector<std::string> plugin_search_path(const std::vector<std::string>& cli_dirs);

/// Loads plugins by name or path and hands out their components.
class PluginRegistry {
 public:
  explicit PluginRegistry(std::vector<std::string> search_path) : search_path_(std::move(search_path)) {}

  /// Loads (once) and validates the plugin `name_or_path`: a name [a-z0-9_]+ looked up as
  /// <dir>/<name>.so along the search path, or a path containing '/'. Throws InputError.
  const LoadedPlugin& load(const std::string& name_or_path);
  /// Loads the plugin `name` only by name: [a-z0-9_]+ looked up along the search path, never a
  /// path (for names read from files, such as a checkpoint's manifest). Throws InputError.
  const LoadedPlugin& load_by_name(const std::string& name);
  /// The component `component` of the given kind from plugin `name_or_path`. Throws
  /// InputError when it is absent (listing what the plugin has) or of another kind.
  const keel_component& component(const std::string& name_or_path, const std::string& component,
                                  keel_component_kind kind);
  /// The component `component` of the given kind from the loaded `plugin`; as component().
  static const keel_component& component_of(const LoadedPlugin& plugin, const std::string& component,
                                            keel_component_kind kind);
  /// The names of the plugin files (<name>.so) along the search path, sorted, each once.
  std::vector<std::string> available() const;
  /// The directories searched, in order.
  const std::vector<std::string>& search_path() const { return search_path_; }

 private:
  std::string locate(const std::string& name) const;

  std::vector<std::string> search_path_;
};

/// "model" or "clipper".
const char* kind_name(keel_component_kind kind);

/// The release part of a LibTorch version ("2.15.0" of "2.15.0+cu132").
std::string torch_release(const std::string& version);

}  // namespace keel
