#include "config/component_table.hpp"

#include <algorithm>
#include <vector>

#include "common/error.hpp"
#include "common/text.hpp"

namespace keel {

namespace {

bool is_role_key(const std::string& key) { return key == "plugin" || key == "component"; }

// Levenshtein distance, by hand: two short names, no library call worth a dependency.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

ComponentTable component_table(ConfigTree& tree, const std::string& role, const std::string& component) {
  ConfigSection role_table = tree.section(role);
  const std::string own = role + "." + component;
  std::vector<std::string> flat, tables;
  for (const std::string& key : role_table.keys()) {
    if (is_role_key(key)) continue;
    (role_table.has_table(key) ? tables : flat).push_back(key);
  }
  if (!flat.empty() && !tables.empty()) {
    const std::string& key = flat.front();
    const std::string& table =
        std::find(tables.begin(), tables.end(), component) != tables.end() ? component : tables.front();
    throw InputError(cat(role_table.where(key), ": ", role, ".", key, " sets a component's key in [", role,
                         "] itself, but ", role_table.where(table), " holds [", role, ".", toml_key(table),
                         "]: use one form. Put ", key, " in [", own, "] (on the command line: --set ", own, ".", key,
                         "=...), or drop the component tables"));
  }
  ComponentTable out{tables.empty() ? tree.section(role, own) : tree.section(own), {}, false};
  out.own_table_missing = !tables.empty() && std::find(tables.begin(), tables.end(), component) == tables.end();
  // A misspelt table of the selected component would run it on its defaults without a word.
  if (out.own_table_missing)
    for (const std::string& table : tables)
      if (edit_distance(table, component) <= 2)
        throw InputError(cat(role_table.where(table), ": [", role, ".", toml_key(table), "] is not read: the ", role,
                             " component is '", component, "' and there is no [", own, "]. Did you mean [", own,
                             "]? (Rename the table, select its component with ", role, ".component, or add an empty [",
                             own, "] to run '", component, "' on its defaults.)"));
  for (const std::string& table : tables) {
    if (table == component) continue;
    const std::string dotted = role + "." + toml_key(table);
    const std::string origin = tree.override_inside(dotted);
    if (!origin.empty())
      throw InputError(cat(origin, ": [", dotted, "] is not read: the ", role, " component is '", component, "' (",
                           role, ".plugin / ", role, ".component); set its keys as ", own, ".KEY=VALUE"));
    tree.keep_unread(role, table);
    out.ignored.push_back("[" + dotted + "]");
  }
  return out;
}

std::string ignored_tables_notice(const std::string& role, const std::string& component, const ComponentTable& table) {
  if (table.ignored.empty()) return "";
  std::string line = cat(join(table.ignored, ", "), table.ignored.size() == 1 ? " holds" : " hold", " settings of ",
                         table.ignored.size() == 1 ? "a component" : "components", " not selected (the ", role, " is '",
                         component, "'): kept in the resolved configuration, not read");
  if (table.own_table_missing) line += cat("; there is no [", role, ".", component, "], so it runs on its defaults");
  return line;
}

}  // namespace keel
