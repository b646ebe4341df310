#include "interop/model_import.hpp"

#include <set>
#include <sstream>
#include <stdexcept>

#include "common/error.hpp"
#include "common/text.hpp"
#include "config/config_tree.hpp"
#include "interop/import_source.hpp"
#include "plugins/extensions.hpp"

namespace keel {

namespace {

// The host's side of keel_config_sink: keys checked against the component's declaration.
struct ConfigReceiver {
  HostContext* context;
  const std::optional<std::vector<DeclaredConfigKey>>* declared;
  std::vector<std::pair<std::string, std::string>> table;
  std::set<std::string> names;

  static bool parses_as(const std::string& value, keel_config_type type) {
    try {
      std::istringstream stream("v = " + value);
      const toml::value v = toml::find(toml::parse(stream, "import_config"), "v");
      switch (type) {
        case KEEL_CONFIG_INT:
          return v.is_integer();
        case KEEL_CONFIG_FLOAT:
          return v.is_floating() || v.is_integer();
        case KEEL_CONFIG_BOOL:
          return v.is_boolean();
        case KEEL_CONFIG_STRING:
          return v.is_string();
      }
    } catch (const std::exception&) {
    }
    return false;
  }

  static keel_status set(void* self_pointer, const char* key, const char* value) {
    auto& self = *static_cast<ConfigReceiver*>(self_pointer);
    // No exception crosses back into the plugin's frames.
    try {
      return self.receive(key, value);
    } catch (const std::exception& e) {
      host_api().set_error(self.context->raw(), KEEL_ERROR_RUNTIME, e.what());
      return KEEL_ERROR_RUNTIME;
    }
  }

  keel_status receive(const char* key, const char* value) {
    ConfigReceiver& self = *this;
    std::string why;
    const std::string k = key != nullptr ? key : "", v = value != nullptr ? value : "";
    if (k.empty() || value == nullptr) {
      why = "import_config: a key without a name or value";
    } else if (!self.names.insert(k).second) {
      why = cat("import_config: key '", k, "' set twice");
    } else if (self.declared->has_value()) {
      const DeclaredConfigKey* found = nullptr;
      for (const DeclaredConfigKey& d : **self.declared)
        if (d.name == k) found = &d;
      if (found == nullptr)
        why = cat("import_config: key '", k, "' is not one the component declares");
      else if (!parses_as(v, found->type))
        why = cat("import_config: key '", k, "' = ", v, " is not a TOML ", config_type_name(found->type));
    } else if (!parses_as(v, KEEL_CONFIG_INT) && !parses_as(v, KEEL_CONFIG_FLOAT) && !parses_as(v, KEEL_CONFIG_BOOL) &&
               !parses_as(v, KEEL_CONFIG_STRING)) {
      why = cat("import_config: key '", k, "' = ", v, " is not a TOML value");
    }
    if (why.empty()) {
      self.table.emplace_back(k, v);
      return KEEL_OK;
    }
    // The component broke its own contract: a bug in the plugin, not the user's input.
    host_api().set_error(self.context->raw(), KEEL_ERROR_INTERNAL, why.c_str());
    return KEEL_ERROR_INTERNAL;
  }
};

}  // namespace

std::vector<std::pair<std::string, std::string>> import_model_config(const keel_component& component,
                                                                     const std::string& plugin_name,
                                                                     const std::string& format,
                                                                     HfCheckpoint& checkpoint, HostServices services) {
  const ComponentExtensions extensions = read_extensions(plugin_name, component);
  HostContext context(cat("model ", component.name, " (", plugin_name, ")"), services);
  if (extensions.model_import.import_config == nullptr)
    throw InputError(cat(context.label(), " cannot import '", format,
                         "': the plugin has no import extension (it was built against an SDK before 1.4, or its "
                         "model does not support import)"));
  ImportSourceAdapter source(checkpoint, context);
  ConfigReceiver receiver{&context, &extensions.config_keys, {}, {}};
  keel_config_sink sink{sizeof(keel_config_sink), &receiver, &ConfigReceiver::set};
  const keel_status status = extensions.model_import.import_config(context.raw(), format.c_str(), source.raw(), &sink);
  try {
    context.check(status, "import_config");
  } catch (const std::runtime_error& e) {
    if (status == KEEL_ERROR_UNSUPPORTED) throw InputError(e.what());
    throw;
  }
  return std::move(receiver.table);
}

}  // namespace keel
