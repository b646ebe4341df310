// keel-plugin inspect PATH|NAME: runs the host's own validation on a plugin, then prints its
// descriptor: ABI, LibTorch, components, the hooks they provide and the config keys they read.
#include <torch/headeronly/version.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include <keel/keel.h>
#include <keel/recompute_mode.hpp>

#include "common/error.hpp"
#include "common/text.hpp"
#include "plugins/extensions.hpp"
#include "plugins/plugin_registry.hpp"

namespace {

int usage(int status) {
  std::fprintf(status == 0 ? stdout : stderr,
               "Usage: keel-plugin inspect PATH|NAME [--plugin-path DIR]...\n"
               "  Validates a plugin as keel-train does and prints its descriptor.\n");
  return status;
}

std::string hooks(const keel_component& c, const keel::ComponentExtensions& extensions) {
  std::vector<std::string> out;
  auto tag = [&](const char* name, bool present, bool capture_safe) {
    if (present) out.push_back(keel::cat(name, capture_safe ? " [capture-safe]" : ""));
  };
  if (c.kind == KEEL_COMPONENT_MODEL) {
    auto* v = static_cast<const keel_model_vtable*>(c.vtable);
    tag("post_init", v->post_init != nullptr, false);
    if (v->pre_clip != nullptr) {
      std::vector<std::string> flags;
      if ((v->hook_flags & KEEL_HOOK_PRE_CLIP_CAPTURE_SAFE) != 0) flags.push_back("capture-safe");
      if ((v->hook_flags & KEEL_HOOK_PRE_CLIP_REPLICAS_ONLY) != 0) flags.push_back("replicas only");
      out.push_back(flags.empty() ? "pre_clip" : keel::cat("pre_clip [", keel::join(flags, ", "), "]"));
    }
    tag("post_step", v->post_step != nullptr, false);
    // Appended in ABI 1.1 (an older plugin's vtable ends before it); an extension from 1.2.
    const bool legacy_export = v->struct_size >= KEEL_MODEL_VTABLE_SIZE_1_1 && v->export_state != nullptr;
    const keel_model_export_extension& e = extensions.model_export;
    if (e.export_state != nullptr)
      out.push_back(keel::cat("export_state [extension; formats: ", e.formats != nullptr ? e.formats : "", "]"));
    else
      tag("export_state", legacy_export, false);
    const keel_model_import_extension& i = extensions.model_import;
    if (i.import_state != nullptr)
      out.push_back(keel::cat("import [extension; formats: ", i.formats != nullptr ? i.formats : "", "]"));
    const keel_model_recompute_extension& r = extensions.model_recompute;
    if (r.set_recompute != nullptr) {
      std::vector<std::string> modes;
      for (const keel::RecomputeName& n : keel::kRecomputeNames)
        if (n.mode != keel::Recompute::none && (r.modes & keel::recompute_bit(n.mode)) != 0) modes.emplace_back(n.name);
      out.push_back(keel::cat("recompute [extension; modes: ", keel::join(modes, ", "), "]"));
    }
    if (extensions.model_memory.activation_bytes != nullptr) out.push_back("activation estimate [extension]");
  } else {
    auto* v = static_cast<const keel_clipper_vtable*>(c.vtable);
    tag("bind_model_parts", v->bind_model_parts != nullptr, false);
    tag("clip", true, (v->hook_flags & KEEL_HOOK_CLIP_CAPTURE_SAFE) != 0);
    tag("state", v->state != nullptr, false);
    if (extensions.clipper_shards.bind_gradient_shards != nullptr) out.push_back("gradient shards [extension]");
  }
  return out.empty() ? "none" : keel::join(out, ", ");
}

const char* role_of(const keel_component& c) { return c.kind == KEEL_COMPONENT_MODEL ? "model" : "clipper"; }

// The keys a component declares, one per line in aligned columns: name, type, default, doc.
void print_config_keys(const keel_component& c, const keel::ComponentExtensions& extensions) {
  if (!extensions.config_keys) {
    std::printf("           config keys: not declared (the plugin predates ABI 1.3 or does not list them)\n");
    return;
  }
  const std::vector<keel::DeclaredConfigKey>& keys = *extensions.config_keys;
  std::printf("           config keys ([%s.%s], or [%s] beside plugin = ...):%s\n", role_of(c), c.name, role_of(c),
              keys.empty() ? " none" : "");
  size_t name_width = 0, default_width = 0;
  auto shown_default = [](const keel::DeclaredConfigKey& k) { return k.default_value ? k.default_text : "-"; };
  for (const keel::DeclaredConfigKey& k : keys) {
    name_width = std::max(name_width, k.name.size());
    default_width = std::max(default_width, shown_default(k).size());
  }
  for (const keel::DeclaredConfigKey& k : keys)
    std::printf("             %-*s  %-7s  %-*s  %s\n", static_cast<int>(name_width), k.name.c_str(),
                keel::config_type_name(k.type), static_cast<int>(default_width), shown_default(k).c_str(),
                k.doc.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) return usage(2);
  if (args[0] == "--help" || args[0] == "-h") return usage(0);
  if (args[0] != "inspect") return usage(2);
  std::string target;
  std::vector<std::string> dirs;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--plugin-path" && i + 1 < args.size())
      dirs.push_back(args[++i]);
    else if (target.empty())
      target = args[i];
    else
      return usage(2);
  }
  if (target.empty()) return usage(2);
  try {
    keel::PluginRegistry registry(keel::plugin_search_path(dirs));
    const keel::LoadedPlugin& plugin = registry.load(target);
    const keel_plugin_descriptor& d = *plugin.descriptor;
    std::printf("plugin     %s %s\n", d.plugin_name, d.plugin_version != nullptr ? d.plugin_version : "");
    std::printf("file       %s\n", plugin.path.c_str());
    std::printf("abi        %u.%u (host %d.%d)\n", d.abi_major, d.abi_minor, KEEL_ABI_MAJOR, KEEL_ABI_MINOR);
    std::printf("libtorch   %s, C++11 ABI %d (host %s)\n", d.torch_version, d.cxx11_abi, TORCH_VERSION);
    std::printf("components %zu\n", d.num_components);
    for (size_t i = 0; i < d.num_components; ++i) {
      const keel_component& c = *d.components[i];
      std::printf("  %-8s %s — %s\n", keel::kind_name(c.kind), c.name, c.description != nullptr ? c.description : "");
      const keel::ComponentExtensions extensions = keel::read_extensions(plugin.path, c);
      std::printf("           hooks: %s\n", hooks(c, extensions).c_str());
      print_config_keys(c, extensions);
      if (!extensions.unknown.empty()) {
        std::vector<std::string> types;
        for (int32_t t : extensions.unknown) types.push_back(std::to_string(t));
        std::printf("           extensions this host does not know (ignored): %s\n", keel::join(types, ", ").c_str());
      }
    }
    return 0;
  } catch (const keel::InputError& e) {
    std::fprintf(stderr, "keel-plugin: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "keel-plugin: %s\n", e.what());
    return 1;
  }
}
