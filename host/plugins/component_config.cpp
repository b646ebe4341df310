#include "plugins/component_config.hpp"

#include <keel/config_keys.hpp>

#include <algorithm>

#include "common/error.hpp"
#include "common/text.hpp"

namespace keel {

namespace {

std::string value_text(const ConfigValue& value) {
  return std::visit([](const auto& v) { return toml_text(v); }, value);
}

const char* getter(keel_config_type type) {
  switch (type) {
    case KEEL_CONFIG_INT:
      return "config_int";
    case KEEL_CONFIG_FLOAT:
      return "config_float";
    case KEEL_CONFIG_BOOL:
      return "config_bool";
    case KEEL_CONFIG_STRING:
      return "config_string";
  }
  return "an unknown getter";
}

}  // namespace

void ComponentConfig::check_read(const char* key, keel_config_type type, const ConfigValue& fallback) const {
  if (!declared_) return;
  const std::string name = key != nullptr ? key : "";
  auto it =
      std::find_if(declared_->begin(), declared_->end(), [&](const DeclaredConfigKey& k) { return k.name == name; });
  std::string broken;
  if (it == declared_->end())
    broken = cat("reads config key '", name,
                 "', which its config keys extension does not declare (declare every key it reads)");
  else if (it->type != type)
    broken = cat("reads config key '", name, "' with ", getter(type), ", but declares it of type ",
                 config_type_name(it->type));
  else if (it->default_value && *it->default_value != fallback)
    broken = cat("reads config key '", name, "' with fallback ", value_text(fallback), ", but declares its default as ",
                 it->default_text);
  if (broken.empty()) return;
  if (violation_.empty()) violation_ = broken;
  throw PluginContractError(broken);
}

}  // namespace keel
