// The config handle a component receives (keel_config*): its table and, when the component
// declares its keys (KEEL_EXTENSION_CONFIG_KEYS), the declaration its reads are held to, so
// that what `keel-plugin inspect` lists is exactly what the component reads.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <keel/keel.h>

#include "config/config_tree.hpp"
#include "plugins/extensions.hpp"

namespace keel {

class ComponentConfig {
 public:
  /// `declared` (may be empty: nothing is checked) must outlive this object.
  ComponentConfig(const ConfigSection& section, const std::optional<std::vector<DeclaredConfigKey>>& declared)
      : section_(section), declared_(declared) {}

  /// The component's table.
  const ConfigSection& section() const { return section_; }
  /// Throws PluginContractError unless the declaration lets `key` be read with getter `type`
  /// and this `fallback` (a fixed default must equal it); the first such error is also kept.
  void check_read(const char* key, keel_config_type type, const ConfigValue& fallback) const;
  /// The first broken read, or "": a component that swallows the failed status must not pass.
  const std::string& violation() const { return violation_; }

 private:
  ConfigSection section_;
  const std::optional<std::vector<DeclaredConfigKey>>& declared_;
  mutable std::string violation_;
};

}  // namespace keel
