#include "config/config_tree.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.hpp"
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

// The shortest decimal that reads back as the same double, always with a '.' or exponent so
// TOML keeps it a float (toml11 prints 17 digits: 0.00029999999999999997).
std::string float_text(double value) {
  if (!std::isfinite(value)) return value != value ? "nan" : value > 0 ? "inf" : "-inf";
  for (int precision = 1; precision <= 17; ++precision) {
    std::string text = format("%.*g", precision, value);
    if (std::strtod(text.c_str(), nullptr) == value) {
      if (text.find_first_of(".en") == std::string::npos) text += ".0";
      return text;
    }
  }
  return format("%.17g", value);
}

std::string value_text(const toml::value& value) {
  if (value.is_floating()) return float_text(value.as_floating());
  if (value.is_array()) {
    std::vector<std::string> items;
    for (const toml::value& item : value.as_array()) items.push_back(value_text(item));
    return "[" + join(items, ", ") + "]";
  }
  std::string text = toml::format(value);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
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

ConfigTree ConfigTree::from_file(const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error))
    throw InputError(cat("cannot read config ", path, ": it is a folder, not a TOML file"));
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  if (!in || in.bad()) throw InputError(cat("cannot read config ", path, ": ", std::strerror(errno)));
  return ConfigTree(parse_text(text.str(), path, "config "), path);
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
  size_t dot = dotted.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == dotted.size() ||
      dotted.find('.', dot + 1) != std::string::npos)
    throw InputError(cat(origin, ": the key must be section.key, got '", dotted, "'"));

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
  std::string section = dotted.substr(0, dot);
  std::string key = dotted.substr(dot + 1);
  if (!root_.is_table()) root_ = toml::table{};
  toml::table& top = root_.as_table();
  if (top.count(section) == 0) top[section] = toml::table{};
  if (!top[section].is_table()) throw InputError(cat(origin, ": '", section, "' is not a table in ", source_));
  top[section].as_table()[key] = parsed;
  override_origin_[dotted] = origin;
}

ConfigSection ConfigTree::section(const std::string& name) {
  if (root_.is_table()) {
    const toml::table& top = root_.as_table();
    auto it = top.find(name);
    if (it != top.end() && !it->second.is_table())
      throw InputError(
          cat(where(it->second, name), ": '", name, "' must be a table ([", name, "]), found ", type_name(it->second)));
  }
  read_.insert(name);
  return ConfigSection(*this, name);
}

const toml::value* ConfigTree::find(const std::string& section, const std::string& key) const {
  if (!root_.is_table()) return nullptr;
  const toml::table& top = root_.as_table();
  auto s = top.find(section);
  if (s == top.end() || !s->second.is_table()) return nullptr;
  const toml::table& table = s->second.as_table();
  auto k = table.find(key);
  return k == table.end() ? nullptr : &k->second;
}

std::string ConfigTree::where(const toml::value& value, const std::string& dotted) const {
  auto origin = override_origin_.find(dotted);
  if (origin != override_origin_.end()) return origin->second;
  const toml::source_location loc = value.location();
  if (loc.line() == 0) return source_;
  return cat(source_, ":", loc.line());
}

void ConfigTree::record(const std::string& section, const std::string& key, const toml::value& effective) {
  read_.insert(section + "." + key);
  auto s = std::find_if(resolved_.begin(), resolved_.end(), [&](const auto& entry) { return entry.first == section; });
  if (s == resolved_.end()) {
    resolved_.push_back({section, {}});
    s = resolved_.end() - 1;
  }
  auto k = std::find_if(s->second.begin(), s->second.end(), [&](const auto& entry) { return entry.first == key; });
  if (k == s->second.end())
    s->second.push_back({key, effective});
  else
    k->second = effective;
}

void ConfigTree::collect_unread(const toml::value& table, const std::string& prefix,
                                std::vector<std::string>& out) const {
  for (const auto& [key, value] : table.as_table()) {
    std::string dotted = prefix.empty() ? key : prefix + "." + key;
    if (read_.count(dotted) != 0) {
      if (value.is_table() && prefix.empty()) collect_unread(value, dotted, out);
      continue;
    }
    std::string what =
        prefix.empty() && value.is_table() ? cat("unknown section [", dotted, "]") : cat("unknown key '", dotted, "'");
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
  std::string out;
  for (const auto& [section, keys] : resolved_) {
    if (keys.empty()) continue;
    out += cat("[", section, "]\n");
    for (const auto& [key, value] : keys) out += cat(key, " = ", value_text(value), "\n");
    out += "\n";
  }
  return out;
}

// ------------------------------------------------------------------ ConfigSection

const toml::value* ConfigSection::lookup(const std::string& key) const { return tree_->find(name_, key); }

bool ConfigSection::has(const std::string& key) const { return lookup(key) != nullptr; }

std::string ConfigSection::where(const std::string& key) const {
  if (const toml::value* value = lookup(key)) return tree_->where(*value, dotted(key));
  if (tree_->root_.is_table()) {
    const toml::table& top = tree_->root_.as_table();
    auto s = top.find(name_);
    if (s != top.end()) return tree_->where(s->second, name_);
  }
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
  tree_->record(name_, key, toml::value(result));
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
  }
  tree_->record(name_, key, toml::value(result));
  return result;
}

bool ConfigSection::boolean(const std::string& key, bool fallback) const {
  const toml::value* value = lookup(key);
  bool result = fallback;
  if (value != nullptr) {
    if (!value->is_boolean()) wrong_type(key, *value, "a boolean (true or false)");
    result = value->as_boolean();
  }
  tree_->record(name_, key, toml::value(result));
  return result;
}

std::string ConfigSection::string(const std::string& key, const std::string& fallback) const {
  const toml::value* value = lookup(key);
  std::string result = fallback;
  if (value != nullptr) {
    if (!value->is_string()) wrong_type(key, *value, "a string");
    result = value->as_string().str;
  }
  tree_->record(name_, key, toml::value(result));
  return result;
}

std::string ConfigSection::string_or_integer(const std::string& key, const std::string& fallback) const {
  const toml::value* value = lookup(key);
  if (value != nullptr && value->is_integer()) {
    std::string result = std::to_string(value->as_integer());
    tree_->record(name_, key, *value);
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
  tree_->record(name_, key, toml::value(result));
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
  tree_->record(name_, key, toml::value(result));
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
  tree_->record(name_, key, toml::value(result));
  return result;
}

}  // namespace keel
