// keel/config_keys.hpp — the keys a component reads from its config table, declared once.
//
// A key with a fixed default is a keel::Key<T> constant: the component reads it with
// config.get(key) and lists it in `static std::vector<keel::ConfigKey> config_keys()`, so its
// default is written in one place. The component helpers (plugin.hpp) hand that list to the
// host as a KEEL_EXTENSION_CONFIG_KEYS extension: `keel-plugin inspect` prints it, unknown-key
// errors name it, and the host refuses a read the list does not declare.
#pragma once

#include <keel/keel.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

namespace keel {

/// A config key of type T (int64_t, double, bool or std::string) with a fixed default:
/// `static const keel::Key<double> kMaxNorm{"max_norm", 1.0, "the largest global norm"};`
template <class T>
struct Key {
  static_assert(std::is_same_v<T, int64_t> || std::is_same_v<T, double> || std::is_same_v<T, bool> ||
                    std::is_same_v<T, std::string>,
                "a config key is an int64_t, a double, a bool or a std::string");
  const char* name;
  T fallback;
  const char* doc = "";
};

/// `value` as TOML writes it (the form of keel_config_key.default_value).
inline std::string toml_text(int64_t value) { return std::to_string(value); }
/// "true" or "false".
inline std::string toml_text(bool value) { return value ? "true" : "false"; }
/// The shortest decimal that reads back as `value`, always a TOML float ("1.0", "0.0003",
/// "500000.0"; exponents only outside [1e-4, 1e15)).
inline std::string toml_text(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  const bool fixed = value == 0 || (std::fabs(value) >= 1e-4 && std::fabs(value) < 1e15);
  char text[64];
  for (int precision = fixed ? 0 : 1; precision <= (fixed ? 40 : 17); ++precision) {
    std::snprintf(text, sizeof(text), fixed ? "%.*f" : "%.*g", precision, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  std::string out = text;
  if (out.find_first_of(".e") == std::string::npos) out += ".0";
  return out;
}
/// A TOML basic string, escaped.
inline std::string toml_text(const std::string& value) {
  std::string out = "\"";
  for (char c : value) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (byte < 0x20 || byte == 0x7f) {
      char escape[8];
      std::snprintf(escape, sizeof(escape), "\\u%04X", byte);
      out += escape;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

/// The getter type of T.
template <class T>
constexpr keel_config_type config_type_of() {
  if constexpr (std::is_same_v<T, int64_t>) return KEEL_CONFIG_INT;
  if constexpr (std::is_same_v<T, double>) return KEEL_CONFIG_FLOAT;
  if constexpr (std::is_same_v<T, bool>) return KEEL_CONFIG_BOOL;
  return KEEL_CONFIG_STRING;
}

/// One declared key of a component's table, as `keel-plugin inspect` lists it.
struct ConfigKey {
  /// A key with a fixed default.
  template <class T>
  ConfigKey(const Key<T>& key)  // NOLINT: a Key is a ConfigKey
      : name(key.name), type(config_type_of<T>()), default_value(toml_text(key.fallback)), doc(key.doc) {}
  /// Any key; `default_value` (TOML text) absent when the default is not fixed (a model size
  /// its flavor sets).
  ConfigKey(std::string name, keel_config_type type, std::optional<std::string> default_value, std::string doc)
      : name(std::move(name)), type(type), default_value(std::move(default_value)), doc(std::move(doc)) {}

  std::string name;
  keel_config_type type;
  std::optional<std::string> default_value;
  std::string doc;
};

}  // namespace keel
