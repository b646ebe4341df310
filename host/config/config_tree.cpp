#include "config/config_tree.hpp"

#include <keel/config_keys.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "common/error.hpp"
#include "common/input_file.hpp"
#include "common/text.hpp"
#include "common/utf8.hpp"
#include "config/toml_depth.hpp"

namespace keel {

namespace {

const char* type_name(const toml::value& value) {
  switch (value.type()) {
    case toml::value_t::boolean:
      return "a boolean";
    case toml::value_t::integer:
      return "an integer";
    case toml::value_t::floating:
      return "a float";
    case toml::value_t::string:
      return "a string";
    case toml::value_t::array:
      return "an array";
    case toml::value_t::table:
      return "a table";
    default:
      return "a date or time";
  }
}

std::string value_text(const toml::value& value) {
  // The SDK's TOML writer: shortest round-trip floats, strings always one escaped line
  // (toml::format may choose a multi-line string and writes some control characters raw).
  if (value.is_floating()) return toml_text(value.as_floating());
  if (value.is_string()) return toml_text(value.as_string().str);
  if (value.is_array()) {
    std::vector<std::string> items;
    for (const toml::value& item : value.as_array()) items.push_back(value_text(item));
    return "[" + join(items, ", ") + "]";
  }
  if (value.is_table()) {  // inline, keys sorted (toml11's tables are unordered maps)
    std::vector<std::string> items;
    for (const auto& [key, item] : value.as_table()) items.push_back(toml_key(key) + " = " + value_text(item));
    std::sort(items.begin(), items.end());
    return items.empty() ? "{}" : "{ " + join(items, ", ") + " }";
  }
  std::string text = toml::format(value);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

bool is_bare_key(const std::string& key) {
  return !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

std::vector<std::string> split_dotted(const std::string& dotted) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t dot; (dot = dotted.find('.', start)) != std::string::npos; start = dot + 1)
    parts.push_back(dotted.substr(start, dot - start));
  parts.push_back(dotted.substr(start));
  return parts;
}

// "sources[2]" -> ("sources", 2): an element of an array of tables ([[data.sources]]); a
// plain segment has no index.
// Only Keel's own names carry an index (ConfigSection::tables builds them); a key of the job
// file spelled like one ("x[99999999999]", quoted) stays a plain name.
std::pair<std::string, std::optional<size_t>> array_segment(const std::string& segment) {
  const size_t open = segment.find('[');
  if (open == std::string::npos || open == 0 || segment.back() != ']') return {segment, std::nullopt};
  const std::string digits = segment.substr(open + 1, segment.size() - open - 2);
  if (digits.empty() || digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), ::isdigit))
    return {segment, std::nullopt};
  return {segment.substr(0, open), static_cast<size_t>(std::stoul(digits))};
}

std::string short_text(const toml::value& value) {
  std::string text = value_text(value);
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

// Every TOML text Keel parses (a job file, a --set value, a manifest's config) comes through
// here: it must be UTF-8 and its nesting is bounded before toml11 (which over-reads on some
// invalid sequences and recurses once per level) sees it.
toml::value parse_text(const std::string& text, const std::string& name, const std::string& what) {
  check_utf8(text, name);
  check_toml_depth(text, name);
  std::istringstream stream(text);
  try {
    return toml::parse(stream, name);
  } catch (const toml::exception& e) {
    throw InputError(cat("cannot parse ", what, name, ":\n", e.what()));
  }
}

// An override as messages name it: "--set a.b=value", its value cut short.
std::string set_origin(const std::string& assignment) {
  const size_t limit = 80;
  return "--set " + (assignment.size() <= limit ? assignment : assignment.substr(0, limit) + "...");
}

}  // namespace

std::string toml_key(const std::string& key) { return is_bare_key(key) ? key : toml_text(key); }

ConfigTree ConfigTree::from_file(const std::string& path) {
  // A job's config is a page of text; the bound keeps a wrong file (a token file, a device's
  // worth of bytes) from being read whole before the parser refuses it.
  constexpr uint64_t kMaxConfigBytes = uint64_t{16} << 20;
  return ConfigTree(parse_text(read_input_file(path, "--config", kMaxConfigBytes), path, "config "), path);
}

ConfigTree ConfigTree::from_string(const std::string& text, const std::string& name) {
  return ConfigTree(parse_text(text, name, ""), name);
}

void ConfigTree::set(const std::string& assignment) {
  const std::string origin = set_origin(assignment);
  size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) throw InputError(cat(origin, ": expected section.key=value"));
  std::string dotted = assignment.substr(0, eq);
  std::string text = assignment.substr(eq + 1);
  const std::vector<std::string> path = split_dotted(dotted);
  if (path.size() < 2 || path.size() > 3 || !std::all_of(path.begin(), path.end(), is_bare_key))
    throw InputError(cat(origin, ": the key must be section.key or section.table.key (names of letters, digits, '_' ",
                         "and '-'), got '", dotted, "'"));

  toml::value parsed;
  check_utf8(assignment, origin);
  check_toml_depth("v = " + text, origin);
  check_toml_depth("v = \"" + text + "\"", origin);  // the bare-word reading below
  try {
    std::istringstream stream("v = " + text);
    parsed = toml::find(toml::parse(stream, origin), "v");
  } catch (const toml::exception&) {
    // A bare word (--set model.flavor=debug) is meant as a string.
    std::istringstream stream("v = \"" + text + "\"");
    try {
      parsed = toml::find(toml::parse(stream, origin), "v");
    } catch (const toml::exception& e) {
      throw InputError(cat(origin, ": the value is not valid TOML: ", e.what()));
    }
  }
  if (!root_.is_table()) root_ = toml::table{};
  toml::value* table = &root_;
  std::string prefix;
  for (size_t i = 0; i + 1 < path.size(); ++i) {
    prefix += (i == 0 ? "" : ".") + path[i];
    toml::table& parent = table->as_table();
    if (parent.count(path[i]) == 0) parent[path[i]] = toml::table{};
    if (!parent[path[i]].is_table()) throw InputError(cat(origin, ": '", prefix, "' is not a table in ", source_));
    table = &parent[path[i]];
  }
  toml::table& target = table->as_table();
  auto existing = target.find(path.back());
  if (existing != target.end() && existing->second.is_table())
    throw InputError(
        cat(origin, ": '", dotted, "' is a table in ", source_, "; set one of its keys (", dotted, ".KEY=VALUE)"));
  target[path.back()] = parsed;
  override_origin_[dotted] = origin;
}

ConfigSection ConfigTree::section(const std::string& name, const std::string& resolved_as) {
  const toml::value* table = &root_;
  std::string path;
  for (const std::string& segment : split_dotted(name)) {
    path += (path.empty() ? "" : ".") + segment;
    read_.insert(path);
    if (table == nullptr || !table->is_table()) continue;
    if (array_segment(segment).second) {  // an element ConfigSection::tables() found: read_ holds its array's path
      table = table_at(path);
      continue;
    }
    auto it = table->as_table().find(segment);
    if (it == table->as_table().end()) {
      table = nullptr;
      continue;
    }
    if (!it->second.is_table())
      throw InputError(
          cat(where(it->second, path), ": '", path, "' must be a table ([", path, "]), found ", type_name(it->second)));
    table = &it->second;
  }
  return ConfigSection(*this, name, resolved_as);
}

void ConfigTree::keep_unread(const std::string& section, const std::string& key) {
  const std::string dotted = section + "." + toml_key(key);
  kept_.insert(dotted);
  const toml::value* table = find(section, key);
  if (table == nullptr || !table->is_table()) return;
  std::vector<std::pair<std::string, toml::value>> entries(table->as_table().begin(), table->as_table().end());
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  resolved_section(dotted) = std::move(entries);
}

void ConfigTree::annotate(const std::string& name, std::string hint) { hints_[name] = std::move(hint); }

std::string ConfigTree::override_inside(const std::string& name) const {
  for (const auto& [dotted, origin] : override_origin_)
    if (dotted == name || dotted.compare(0, name.size() + 1, name + ".") == 0) return origin;
  return "";
}

const toml::value* ConfigTree::table_at(const std::string& section) const {
  const toml::value* table = &root_;
  for (const std::string& segment : split_dotted(section)) {
    if (!table->is_table()) return nullptr;
    const auto [name, index] = array_segment(segment);
    auto it = table->as_table().find(name);
    if (it == table->as_table().end()) return nullptr;
    table = &it->second;
    if (index) {
      if (!table->is_array() || *index >= table->as_array().size()) return nullptr;
      table = &table->as_array()[*index];
    }
    if (!table->is_table()) return nullptr;
  }
  return table;
}

const toml::value* ConfigTree::find(const std::string& section, const std::string& key) const {
  const toml::value* table = table_at(section);
  if (table == nullptr) return nullptr;
  auto k = table->as_table().find(key);
  return k == table->as_table().end() ? nullptr : &k->second;
}

std::string ConfigTree::where(const toml::value& value, const std::string& dotted) const {
  auto origin = override_origin_.find(dotted);
  if (origin != override_origin_.end()) return origin->second;
  const toml::source_location loc = value.location();
  // A value toml11 did not parse (a table a --set created) has no region: toml11 then says
  // line 1 of "unknown file".
  if (loc.line() == 0 || loc.file_name() == "unknown file") {
    const std::string origin = override_inside(dotted);
    return origin.empty() ? source_ : origin;
  }
  return cat(source_, ":", loc.line());
}

std::vector<std::pair<std::string, toml::value>>& ConfigTree::resolved_section(const std::string& name) {
  auto s = std::find_if(resolved_.begin(), resolved_.end(), [&](const auto& entry) { return entry.first == name; });
  if (s != resolved_.end()) return s->second;
  resolved_.push_back({name, {}});
  return resolved_.back().second;
}

void ConfigTree::record(const std::string& section, const std::string& resolved_as, const std::string& key,
                        const toml::value& effective) {
  read_.insert(section + "." + key);
  auto& keys = resolved_section(resolved_as);
  auto k = std::find_if(keys.begin(), keys.end(), [&](const auto& entry) { return entry.first == key; });
  if (k == keys.end())
    keys.push_back({key, effective});
  else
    k->second = effective;
}

void ConfigTree::collect_unread(const toml::value& table, const std::string& prefix,
                                std::vector<std::string>& out) const {
  for (const auto& [key, value] : table.as_table()) {
    std::string dotted = prefix.empty() ? toml_key(key) : prefix + "." + toml_key(key);
    if (kept_.count(dotted) != 0) continue;
    if (read_.count(dotted) != 0) {
      if (value.is_table()) collect_unread(value, dotted, out);
      if (value.is_array())  // an array of tables ([[a.b]]): each element's keys, as a.b[i].key
        for (size_t i = 0; i < value.as_array().size(); ++i)
          if (value.as_array()[i].is_table()) collect_unread(value.as_array()[i], cat(dotted, "[", i, "]"), out);
      continue;
    }
    std::string what = value.is_table() ? cat("unknown section [", dotted, "]") : cat("unknown key '", dotted, "'");
    auto hint = hints_.find(prefix);
    if (hint != hints_.end()) what += "; " + hint->second;
    out.push_back(cat(where(value, dotted), ": ", what));
  }
}

void ConfigTree::check_all_read() const {
  if (!root_.is_table()) return;
  std::vector<std::string> unread;
  collect_unread(root_, "", unread);
  if (unread.empty()) return;
  std::sort(unread.begin(), unread.end());
  throw InputError(join(unread, "\n") + "\n(check the spelling; docs/config.md lists every key)");
}

std::string ConfigTree::resolved_toml() const {
  std::vector<std::string> tops;  // first segments, in order of first appearance
  for (const auto& entry : resolved_) {
    std::string top = entry.first.substr(0, entry.first.find('.'));
    if (std::find(tops.begin(), tops.end(), top) == tops.end()) tops.push_back(top);
  }
  std::string out;
  auto emit = [&](const std::string& section, const std::vector<std::pair<std::string, toml::value>>& keys) {
    if (keys.empty()) return;
    // An element of an array of tables, "a.b[i]", is written as one more [[a.b]] in order.
    const bool element = !section.empty() && section.back() == ']';
    out += element ? cat("[[", section.substr(0, section.rfind('[')), "]]\n") : cat("[", section, "]\n");
    for (const auto& [key, value] : keys) out += cat(toml_key(key), " = ", value_text(value), "\n");
    out += "\n";
  };
  // Each table, then the sub-tables read, then those kept unread.
  for (const std::string& top : tops) {
    for (const auto& [section, keys] : resolved_)
      if (section == top) emit(section, keys);
    for (bool kept : {false, true})
      for (const auto& [section, keys] : resolved_)
        if (section.compare(0, top.size() + 1, top + ".") == 0 && (kept_.count(section) != 0) == kept)
          emit(section, keys);
  }
  return out;
}

// ------------------------------------------------------------------ ConfigSection

const toml::value* ConfigSection::lookup(const std::string& key) const { return tree_->find(name_, key); }

bool ConfigSection::has(const std::string& key) const { return lookup(key) != nullptr; }

bool ConfigSection::has_table(const std::string& key) const {
  const toml::value* value = lookup(key);
  return value != nullptr && value->is_table();
}

std::vector<ConfigSection> ConfigSection::tables(const std::string& key) const {
  const toml::value* value = lookup(key);
  if (value == nullptr) return {};
  const std::string expected = "an array of tables ([[" + dotted(key) + "]])";
  if (!value->is_array()) wrong_type(key, *value, expected.c_str());
  tree_->read_.insert(dotted(key));
  std::vector<ConfigSection> out;
  for (size_t i = 0; i < value->as_array().size(); ++i) {
    if (!value->as_array()[i].is_table()) wrong_type(key, value->as_array()[i], expected.c_str());
    out.push_back(tree_->section(cat(dotted(key), "[", i, "]")));
  }
  return out;
}

std::vector<std::string> ConfigSection::keys() const {
  std::vector<std::string> out;
  if (const toml::value* table = tree_->table_at(name_))
    for (const auto& entry : table->as_table()) out.push_back(entry.first);
  std::sort(out.begin(), out.end());
  return out;
}

std::string ConfigSection::where(const std::string& key) const {
  if (const toml::value* value = lookup(key)) return tree_->where(*value, dotted(key));
  if (const toml::value* table = tree_->table_at(name_)) return tree_->where(*table, name_);
  return tree_->source_;
}

void ConfigSection::invalid(const std::string& key, const std::string& why) const {
  throw InputError(cat(where(key), ": ", dotted(key), ": ", why));
}

void ConfigSection::wrong_type(const std::string& key, const toml::value& value, const char* expected) const {
  invalid(key, cat("expected ", expected, ", found ", type_name(value), " (", short_text(value), ")"));
}

int64_t ConfigSection::integer(const std::string& key, int64_t fallback) const {
  const toml::value* value = lookup(key);
  int64_t result = fallback;
  if (value != nullptr) {
    if (!value->is_integer()) wrong_type(key, *value, "an integer");
    result = value->as_integer();
    // toml11 (3.7) saturates a literal beyond int64 to its limits without a word.
    if (result == std::numeric_limits<int64_t>::max() || result == std::numeric_limits<int64_t>::min())
      invalid(key, "is beyond the range of a 64-bit integer");
  }
  tree_->record(name_, resolved_as_, key, toml::value(result));
  return result;
}

int64_t ConfigSection::integer(const std::string& key, int64_t fallback, int64_t lo, int64_t hi) const {
  const int64_t result = integer(key, fallback);
  if (result < lo) invalid(key, cat("must be at least ", lo, ", got ", result));
  if (result > hi) invalid(key, cat("must be in [", lo, ", ", hi, "], got ", result));
  return result;
}

double ConfigSection::real(const std::string& key, double fallback) const {
  const toml::value* value = lookup(key);
  double result = fallback;
  if (value != nullptr) {
    if (value->is_integer())
      result = static_cast<double>(value->as_integer());
    else if (value->is_floating())
      result = value->as_floating();
    else
      wrong_type(key, *value, "a number");
    // No setting means infinity or nan. toml11 (3.7) reads a literal beyond double's range
    // (1e309) as the largest double without a word: that value is taken as the overflow it is.
    if (!std::isfinite(result) || std::abs(result) == std::numeric_limits<double>::max())
      invalid(key, cat("must be a finite number within double's range, got ", short_text(*value)));
    // A subnormal number passes a range check made before the CPU flushes denormals and then
    // compares equal to 0 (LibTorch's kernels set that mode): refused. Found from its bits, as
    // a comparison would itself read it as 0 under that mode.
    uint64_t bits = 0;
    std::memcpy(&bits, &result, sizeof(bits));
    const bool subnormal = ((bits >> 52) & 0x7FF) == 0 && (bits & ((uint64_t{1} << 52) - 1)) != 0;
    if (subnormal)
      invalid(key, cat("must be 0 or at least ", std::numeric_limits<double>::min(),
                       " in magnitude (a subnormal number reads as 0 in the CPU's flush-to-zero mode), got ",
                       short_text(*value)));
  }
  tree_->record(name_, resolved_as_, key, toml::value(result));
  return result;
}

bool ConfigSection::boolean(const std::string& key, bool fallback) const {
  const toml::value* value = lookup(key);
  bool result = fallback;
  if (value != nullptr) {
    if (!value->is_boolean()) wrong_type(key, *value, "a boolean (true or false)");
    result = value->as_boolean();
  }
  tree_->record(name_, resolved_as_, key, toml::value(result));
  return result;
}

std::string ConfigSection::string(const std::string& key, const std::string& fallback) const {
  const toml::value* value = lookup(key);
  std::string result = fallback;
  if (value != nullptr) {
    if (!value->is_string()) wrong_type(key, *value, "a string");
    result = value->as_string().str;
  }
  tree_->record(name_, resolved_as_, key, toml::value(result));
  return result;
}

std::string ConfigSection::string_or_integer(const std::string& key, const std::string& fallback) const {
  const toml::value* value = lookup(key);
  if (value != nullptr && value->is_integer()) {
    std::string result = std::to_string(value->as_integer());
    tree_->record(name_, resolved_as_, key, *value);
    return result;
  }
  return string(key, fallback);
}

std::string ConfigSection::required_string(const std::string& key) const {
  if (lookup(key) == nullptr) invalid(key, "required key is missing");
  return string(key, "");
}

std::string ConfigSection::choice(const std::string& key, const std::string& fallback,
                                  const std::vector<std::string>& choices) const {
  std::string result = string(key, fallback);
  if (std::find(choices.begin(), choices.end(), result) == choices.end())
    invalid(key, cat("must be one of ", join(choices, ", "), "; got '", result, "'"));
  return result;
}

std::vector<std::string> ConfigSection::strings(const std::string& key,
                                                const std::vector<std::string>& fallback) const {
  const toml::value* value = lookup(key);
  std::vector<std::string> result = fallback;
  if (value != nullptr) {
    if (!value->is_array()) wrong_type(key, *value, "an array of strings");
    result.clear();
    for (const toml::value& item : value->as_array()) {
      if (!item.is_string()) wrong_type(key, item, "an array of strings");
      result.push_back(item.as_string().str);
    }
  }
  tree_->record(name_, resolved_as_, key, toml::value(result));
  return result;
}

std::vector<double> ConfigSection::reals(const std::string& key, const std::vector<double>& fallback) const {
  const toml::value* value = lookup(key);
  std::vector<double> result = fallback;
  if (value != nullptr) {
    if (!value->is_array()) wrong_type(key, *value, "an array of numbers");
    result.clear();
    for (const toml::value& item : value->as_array()) {
      if (item.is_integer())
        result.push_back(static_cast<double>(item.as_integer()));
      else if (item.is_floating())
        result.push_back(item.as_floating());
      else
        wrong_type(key, item, "an array of numbers");
    }
  }
  tree_->record(name_, resolved_as_, key, toml::value(result));
  return result;
}

std::vector<int64_t> ConfigSection::integers(const std::string& key, const std::vector<int64_t>& fallback) const {
  const toml::value* value = lookup(key);
  std::vector<int64_t> result = fallback;
  if (value != nullptr) {
    if (!value->is_array()) wrong_type(key, *value, "an array of integers");
    result.clear();
    for (const toml::value& item : value->as_array()) {
      if (!item.is_integer()) wrong_type(key, item, "an array of integers");
      result.push_back(item.as_integer());
    }
  }
  tree_->record(name_, resolved_as_, key, toml::value(result));
  return result;
}

}  // namespace keel
