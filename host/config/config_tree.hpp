// The job's TOML configuration with --set overrides, typed reads that remember what was read,
// and error messages that name the key and its position ("job.toml:12: training.steps: ...").
// Tables nest one level for components ([clipper.norm_clipper]): a section's name is then
// dotted, "clipper.norm_clipper".
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <toml.hpp>

namespace keel {

class ConfigSection;

/// A parsed job file. Every read goes through a ConfigSection so that unread (unknown) keys
/// can be reported and the resolved configuration (every key with its effective value)
/// printed and saved.
class ConfigTree {
 public:
  /// Parses a TOML file; a syntax error becomes an InputError with toml11's located message.
  static ConfigTree from_file(const std::string& path);
  /// Parses TOML text; `name` stands for the file name in messages.
  static ConfigTree from_string(const std::string& text, const std::string& name);

  /// Applies one "section.key=value" or "section.table.key=value" override (TOML value
  /// syntax; a bare word is a string).
  void set(const std::string& assignment);
  /// A view of the table `name` ("clipper" or "clipper.norm_clipper"; empty when absent), its
  /// reads resolved under `resolved_as` (default `name`). Several views of one table may coexist.
  ConfigSection section(const std::string& name, const std::string& resolved_as = "");
  /// Marks the table at `key` of section `section` and everything in it as read, to be kept
  /// verbatim (keys sorted) in the resolved configuration: a table the job holds for a
  /// component it does not use.
  void keep_unread(const std::string& section, const std::string& key);
  /// Appends `hint` to the message of every unknown key directly in table `name`.
  void annotate(const std::string& name, std::string hint);
  /// The first --set (in key order) that wrote table `name` or inside it, or "".
  std::string override_inside(const std::string& name) const;
  /// Throws an InputError naming every key that was never read, with its position.
  void check_all_read() const;
  /// The resolved configuration as TOML: every key read, with its effective value, each
  /// table's sub-tables right after it.
  std::string resolved_toml() const;
  /// The file name given at parse time.
  const std::string& source_name() const { return source_; }

 private:
  friend class ConfigSection;
  ConfigTree(toml::value root, std::string source) : root_(std::move(root)), source_(std::move(source)) {}

  const toml::value* table_at(const std::string& section) const;
  const toml::value* find(const std::string& section, const std::string& key) const;
  std::string where(const toml::value& value, const std::string& dotted) const;
  void record(const std::string& section, const std::string& resolved_as, const std::string& key,
              const toml::value& effective);
  void collect_unread(const toml::value& table, const std::string& prefix, std::vector<std::string>& out) const;
  std::vector<std::pair<std::string, toml::value>>& resolved_section(const std::string& name);

  toml::value root_;
  std::string source_;
  std::map<std::string, std::string> override_origin_;  // dotted key -> "--set a.b=c"
  std::set<std::string> read_;                          // dotted keys and sections
  std::set<std::string> kept_;                          // dotted tables kept unread
  std::map<std::string, std::string> hints_;            // dotted table -> hint for its unknown keys
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, toml::value>>>> resolved_;
};

/// Typed access to one table of a ConfigTree. Getters with a fallback return it when the key
/// is absent; a present key of the wrong type is an InputError naming key and position.
class ConfigSection {
 public:
  /// A view of table `name` whose reads are resolved under `resolved_as` (default `name`).
  ConfigSection(ConfigTree& tree, std::string name, std::string resolved_as = "")
      : tree_(&tree), name_(std::move(name)), resolved_as_(resolved_as.empty() ? name_ : std::move(resolved_as)) {}

  /// The integer at `key`, or `fallback`.
  int64_t integer(const std::string& key, int64_t fallback) const;
  /// The integer at `key`, or `fallback`; outside [lo, hi] is an InputError naming the range.
  int64_t integer(const std::string& key, int64_t fallback, int64_t lo, int64_t hi) const;
  /// The integer at `key` as a T, within [lo, hi] and T's own range: never narrowed silently.
  template <class T>
  T integer_as(const std::string& key, T fallback, int64_t lo, int64_t hi = std::numeric_limits<int64_t>::max()) const {
    if (std::in_range<int64_t>(std::numeric_limits<T>::min()))
      lo = std::max(lo, static_cast<int64_t>(std::numeric_limits<T>::min()));
    if (std::in_range<int64_t>(std::numeric_limits<T>::max()))
      hi = std::min(hi, static_cast<int64_t>(std::numeric_limits<T>::max()));
    return static_cast<T>(integer(key, static_cast<int64_t>(fallback), lo, hi));
  }
  /// The finite number at `key` (an integer is accepted), or `fallback`; nan and inf (and
  /// literals beyond double's range, such as 1e309) are refused naming the key.
  double real(const std::string& key, double fallback) const;
  /// The boolean at `key`, or `fallback`.
  bool boolean(const std::string& key, bool fallback) const;
  /// The string at `key`, or `fallback`.
  std::string string(const std::string& key, const std::string& fallback) const;
  /// The string at `key`, or an integer's decimal text (`load = 5` and `load = "latest"`).
  std::string string_or_integer(const std::string& key, const std::string& fallback) const;
  /// The string at `key`; absent is an error naming the table.
  std::string required_string(const std::string& key) const;
  /// The string at `key`, which must be one of `choices`.
  std::string choice(const std::string& key, const std::string& fallback,
                     const std::vector<std::string>& choices) const;
  /// The array of strings at `key`, or `fallback`.
  std::vector<std::string> strings(const std::string& key, const std::vector<std::string>& fallback) const;
  /// The array of numbers at `key`, or `fallback`.
  std::vector<double> reals(const std::string& key, const std::vector<double>& fallback) const;
  /// The array of integers at `key`, or `fallback`.
  std::vector<int64_t> integers(const std::string& key, const std::vector<int64_t>& fallback) const;
  /// Whether `key` is present (does not mark it read).
  bool has(const std::string& key) const;
  /// Whether `key` is present and holds a table ([section.key]).
  bool has_table(const std::string& key) const;
  /// The tables of the array at `key` ([[section.key]] in TOML), in order, each a view named
  /// "section.key[i]" (so messages name "section.key[i].field"); none when absent.
  std::vector<ConfigSection> tables(const std::string& key) const;
  /// The keys present in the table, sorted (nothing is marked read).
  std::vector<std::string> keys() const;

  /// Throws an InputError "<position>: <section>.<key>: <why>".
  [[noreturn]] void invalid(const std::string& key, const std::string& why) const;
  /// "job.toml:12" for a present key, the table's position (or file) otherwise.
  std::string where(const std::string& key) const;
  /// "section.key".
  std::string dotted(const std::string& key) const { return name_ + "." + key; }
  /// The table's name.
  const std::string& name() const { return name_; }

 private:
  const toml::value* lookup(const std::string& key) const;
  [[noreturn]] void wrong_type(const std::string& key, const toml::value& value, const char* expected) const;

  ConfigTree* tree_;
  std::string name_;
  std::string resolved_as_;
};

/// `key` as TOML writes it: bare when it may be, else a quoted basic string.
std::string toml_key(const std::string& key);

}  // namespace keel
