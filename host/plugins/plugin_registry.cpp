#include "plugins/plugin_registry.hpp"

#include <torch/headeronly/version.h>

#include <algorithm>
#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>

#include "common/error.hpp"
#include "common/input_file.hpp"
#include "common/text.hpp"
#include "plugins/extensions.hpp"

namespace keel {

namespace fs = std::filesystem;

namespace {

// Libraries are never unloaded: code and objects from a plugin may be referenced until exit.
struct LoadedLibrary {
  boost::dll::shared_library library;
  LoadedPlugin plugin;
};
std::map<std::string, LoadedLibrary*>& loaded_libraries() {
  static auto* libraries = new std::map<std::string, LoadedLibrary*>();
  return *libraries;
}

std::vector<std::string> split_path_list(const char* text) {
  std::vector<std::string> out;
  if (text == nullptr) return out;
  std::string s(text);
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(':', start);
    if (end == std::string::npos) end = s.size();
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

bool valid_name(const char* name) {
  static const std::regex pattern("[a-z0-9_]+");
  return name != nullptr && std::regex_match(name, pattern);
}

// The functions a host of this version calls unconditionally; a NULL one refuses the plugin.
std::vector<std::string> missing_functions(const keel_component& c) {
  std::vector<std::string> missing;
  if (c.kind == KEEL_COMPONENT_MODEL) {
    auto* v = static_cast<const keel_model_vtable*>(c.vtable);
    if (v->create == nullptr) missing.push_back("create");
    if (v->destroy == nullptr) missing.push_back("destroy");
    if (v->info == nullptr) missing.push_back("info");
    if (v->build_part == nullptr) missing.push_back("build_part");
    if (v->parameters == nullptr) missing.push_back("parameters");
    if (v->buffers == nullptr) missing.push_back("buffers");
    if (v->init_weights == nullptr) missing.push_back("init_weights");
    if (v->forward == nullptr) missing.push_back("forward");
  } else {
    auto* v = static_cast<const keel_clipper_vtable*>(c.vtable);
    if (v->create == nullptr) missing.push_back("create");
    if (v->destroy == nullptr) missing.push_back("destroy");
    if (v->clip == nullptr) missing.push_back("clip");
  }
  return missing;
}

void validate_components(const std::string& path, const keel_plugin_descriptor& d) {
  if (d.num_components > 0 && d.components == nullptr)
    throw InputError(cat("plugin ", path, ": descriptor lists ", d.num_components, " components but no array"));
  for (size_t i = 0; i < d.num_components; ++i) {
    const keel_component* c = d.components[i];
    if (c == nullptr || c->struct_size < KEEL_COMPONENT_SIZE_1_0)
      throw InputError(cat("plugin ", path, ": component #", i, " is NULL or smaller than keel_component of ABI 1.0 (",
                           c == nullptr ? 0 : c->struct_size, " < ", KEEL_COMPONENT_SIZE_1_0, " bytes)"));
    if (!valid_name(c->name))
      throw InputError(cat("plugin ", path, ": component #", i, " has an invalid name (want [a-z0-9_]+)"));
    // [clipper.plugin] would collide with the role's own `plugin` key in a job file.
    if (std::strcmp(c->name, "plugin") == 0 || std::strcmp(c->name, "component") == 0)
      throw InputError(cat("plugin ", path, ": component #", i, " is named '", c->name,
                           "', a name the job file's role tables reserve for themselves"));
    if (c->kind != KEEL_COMPONENT_MODEL && c->kind != KEEL_COMPONENT_CLIPPER)
      throw InputError(
          cat("plugin ", path, ": component '", c->name, "' has unknown kind ", static_cast<int>(c->kind)));
    // What ABI 1.0 had: later appends are optional and read through copy_versioned.
    size_t vtable_size = c->kind == KEEL_COMPONENT_MODEL ? KEEL_MODEL_VTABLE_SIZE_1_0 : KEEL_CLIPPER_VTABLE_SIZE_1_0;
    size_t have = c->vtable == nullptr ? 0 : *static_cast<const size_t*>(c->vtable);
    if (have < vtable_size)
      throw InputError(cat("plugin ", path, ": component '", c->name, "' has a ", kind_name(c->kind), " vtable of ",
                           have, " bytes, this host needs at least ", vtable_size, " (ABI 1.0)"));
    std::vector<std::string> missing = missing_functions(*c);
    if (!missing.empty())
      throw InputError(cat("plugin ", path, ": ", kind_name(c->kind), " component '", c->name,
                           "' lacks required function(s): ", join(missing, ", ")));
    read_extensions(path, *c);  // refuses a malformed chain; unknown types are skipped
  }
}

}  // namespace

const char* kind_name(keel_component_kind kind) {
  return kind == KEEL_COMPONENT_MODEL ? "model" : kind == KEEL_COMPONENT_CLIPPER ? "clipper" : "unknown";
}

std::string torch_release(const std::string& version) { return version.substr(0, version.find('+')); }

std::vector<std::string> plugin_search_path(const std::vector<std::string>& cli_dirs) {
  std::vector<std::string> dirs = cli_dirs;
  for (const std::string& dir : split_path_list(std::getenv("KEEL_PLUGIN_PATH"))) dirs.push_back(dir);
  boost::dll::fs::error_code ec;
  boost::dll::fs::path exe = boost::dll::program_location(ec);
  if (!ec) dirs.push_back((fs::path(exe.string()).parent_path().parent_path() / "lib" / "keel" / "plugins").string());
  return dirs;
}

std::vector<std::string> PluginRegistry::available() const {
  std::vector<std::string> found;
  for (const std::string& dir : search_path_) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec))
      if (entry.path().extension() == ".so") found.push_back(entry.path().stem().string());
  }
  std::sort(found.begin(), found.end());
  found.erase(std::unique(found.begin(), found.end()), found.end());
  return found;
}

std::string PluginRegistry::locate(const std::string& name) const {
  for (const std::string& dir : search_path_) {
    fs::path candidate = fs::path(dir) / (name + ".so");
    if (fs::exists(candidate)) return candidate.string();
  }
  const std::vector<std::string> found = available();
  throw InputError(cat("plugin '", name, "' not found; looked for ", name,
                       ".so in: ", search_path_.empty() ? std::string("(no directories)") : join(search_path_, ", "),
                       "; found: ", found.empty() ? std::string("no plugins") : join(found, ", "),
                       ". Add its folder with --plugin-path or KEEL_PLUGIN_PATH."));
}

const LoadedPlugin& PluginRegistry::load(const std::string& name_or_path) {
  bool is_path = name_or_path.find('/') != std::string::npos;
  if (!is_path && !valid_name(name_or_path.c_str()))
    throw InputError(cat("invalid plugin name '", name_or_path, "': names are [a-z0-9_]+ (or give a path to a .so)"));
  std::string path = is_path ? name_or_path : locate(name_or_path);
  std::error_code ec;
  fs::path canonical = fs::weakly_canonical(path, ec);
  std::string key = ec ? path : canonical.string();
  auto& libraries = loaded_libraries();
  if (auto it = libraries.find(key); it != libraries.end()) return it->second->plugin;

  // 1. open: only a regular file is handed to the loader, which would wait forever on a FIFO.
  if (!is_regular_input(path))
    throw InputError(cat("cannot open plugin ", path, ": it is ", file_kind(path), ", expected a shared library"));
  auto loaded = std::make_unique<LoadedLibrary>();
  try {
    loaded->library.load(boost::dll::fs::path(path),
                         boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    throw InputError(cat("cannot open plugin ", path, ": ", e.what()));
  }
  // 2. entry symbol
  if (!loaded->library.has(KEEL_PLUGIN_ENTRY_SYMBOL))
    throw InputError(cat("plugin ", path, " has no '", KEEL_PLUGIN_ENTRY_SYMBOL,
                         "' symbol: not a Keel plugin? (build it with keel_add_plugin() and define KEEL_PLUGIN(...))"));
  auto entry = loaded->library.get<const keel_plugin_descriptor*()>(KEEL_PLUGIN_ENTRY_SYMBOL);
  const keel_plugin_descriptor* d = entry();
  // 3. struct size
  if (d == nullptr || d->struct_size < KEEL_PLUGIN_DESCRIPTOR_SIZE_1_0)
    throw InputError(cat("plugin ", path, ": its descriptor is ", d == nullptr ? 0 : d->struct_size,
                         " bytes, this host needs at least ", KEEL_PLUGIN_DESCRIPTOR_SIZE_1_0,
                         " (keel_plugin_descriptor of ABI 1.0); rebuild it against SDK ", KEEL_ABI_MAJOR));
  // 4. ABI major
  if (d->abi_major != KEEL_ABI_MAJOR)
    throw InputError(cat("plugin ", path, " was built for Keel ABI ", d->abi_major, ".", d->abi_minor,
                         ", this host speaks ABI ", KEEL_ABI_MAJOR, ".", KEEL_ABI_MINOR, ": rebuild it against SDK ",
                         KEEL_ABI_MAJOR));
  // 5. LibTorch
  std::string plugin_torch = d->torch_version != nullptr ? d->torch_version : "(none)";
  if (torch_release(plugin_torch) != torch_release(TORCH_VERSION) || d->cxx11_abi != _GLIBCXX_USE_CXX11_ABI)
    throw InputError(cat("plugin ", path, " was built against LibTorch ", plugin_torch, " (C++11 ABI ", d->cxx11_abi,
                         "), this host runs LibTorch ", TORCH_VERSION, " (C++11 ABI ", _GLIBCXX_USE_CXX11_ABI,
                         "): rebuild the plugin against LibTorch ", TORCH_VERSION));
  if (!valid_name(d->plugin_name))
    throw InputError(cat("plugin ", path, ": descriptor has an invalid plugin name (want [a-z0-9_]+)"));
  // 6. required functions (and component sanity)
  validate_components(path, *d);

  loaded->plugin = LoadedPlugin{path, d};
  LoadedLibrary* raw = loaded.release();
  libraries[key] = raw;
  return raw->plugin;
}

const LoadedPlugin& PluginRegistry::load_by_name(const std::string& name) {
  // The whole string, not its C prefix: a name with an embedded NUL must not pass.
  if (name.empty() || name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos)
    throw InputError(cat("invalid plugin name '", name, "': names are [a-z0-9_]+ (a path is not accepted here)"));
  return load(name);
}

const keel_component& PluginRegistry::component(const std::string& name_or_path, const std::string& component,
                                                keel_component_kind kind) {
  return component_of(load(name_or_path), component, kind);
}

const keel_component& PluginRegistry::component_of(const LoadedPlugin& plugin, const std::string& component,
                                                   keel_component_kind kind) {
  const keel_plugin_descriptor& d = *plugin.descriptor;
  std::vector<std::string> available;
  for (size_t i = 0; i < d.num_components; ++i) {
    const keel_component& c = *d.components[i];
    if (component == c.name) {
      if (c.kind != kind)
        throw InputError(cat("component '", component, "' of plugin ", plugin.path, " is a ", kind_name(c.kind),
                             ", but a ", kind_name(kind), " is needed here"));
      return c;
    }
    available.push_back(cat(c.name, " (", kind_name(c.kind), ")"));
  }
  throw InputError(cat("plugin ", plugin.path, " has no component '", component,
                       "'; it has: ", available.empty() ? std::string("none") : join(available, ", "),
                       ". Choose one with the 'component' key."));
}

}  // namespace keel
