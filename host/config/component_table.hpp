// Where a component's own settings live in a job file. Two forms, one per role table:
//   per-component: [clipper] plugin = "norm_clipper"  with  [clipper.norm_clipper] max_norm = 1.0
//                  (and any other component's table beside it, kept but not read)
//   flat:          [clipper] plugin = "norm_clipper", max_norm = 1.0
// so that swapping a component is `--set clipper.plugin=...` alone. Mixing the forms in one
// role table is refused, since the flat keys would be handed to whichever component runs.
#pragma once

#include <string>
#include <vector>

#include "config/config_tree.hpp"

namespace keel {

/// The table a component reads, and the tables of other components that the job holds.
struct ComponentTable {
  ConfigSection section;
  /// "[clipper.value_clipper]" for each table of a component not selected, sorted; these are
  /// kept in the resolved configuration and not read.
  std::vector<std::string> ignored;
  /// Component tables exist, but none for the selected component: it runs on its defaults.
  bool own_table_missing = false;
};

/// The table of `component` in role table `role` ("model", "clipper"): [role.component] or,
/// in the flat form, [role] itself (its reads resolved as [role.component], so both forms
/// resolve alike). `plugin` and `component` are the role's own keys. A flat key beside a
/// component table, or a --set inside the table of a component not selected, is an
/// InputError naming both places.
ComponentTable component_table(ConfigTree& tree, const std::string& role, const std::string& component);

/// The one notice line on `table.ignored` and `own_table_missing` ("" when neither applies).
std::string ignored_tables_notice(const std::string& role, const std::string& component, const ComponentTable& table);

}  // namespace keel
