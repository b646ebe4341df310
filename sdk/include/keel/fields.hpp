// keel/fields.hpp — a model's sizes as data: one row per config key (the member of the
// plugin's Args it sets and, for an integer, the least value it may take) and one row per
// flavor (a named Args value). read_fields() turns a [model] table into Args with both, and
// field_keys() declares the same keys (keel/config_keys.hpp) for the host's listing.
#pragma once

#include <keel/config_keys.hpp>
#include <keel/host.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace keel {

/// One config key of a plugin's Args: the member it overwrites when present and, for an
/// integer, the least value that member may hold.
template <class A>
struct Field {
  /// An integer key; values below `minimum` are config errors.
  Field(const char* key, int64_t A::*member, int64_t minimum) : key(key), member(member), minimum(minimum) {}
  /// A number key (integers are accepted).
  Field(const char* key, double A::*member) : key(key), member(member) {}
  /// A boolean key.
  Field(const char* key, bool A::*member) : key(key), member(member) {}
  /// A string key.
  Field(const char* key, std::string A::*member) : key(key), member(member) {}

  const char* key;
  std::variant<int64_t A::*, double A::*, bool A::*, std::string A::*> member;
  std::optional<int64_t> minimum;
};

/// A named model size: `{"tiny", {.dim = 64, ...}}`; members it leaves out keep Args' defaults.
template <class A>
struct Flavor {
  const char* name;
  A args;
};

/// The flavor named by the `flavor` key (`fallback` when absent) with every present key of
/// `fields` applied on top, in row order; an unknown flavor or an integer below its minimum is
/// config.invalid naming the key. Checks between fields stay with the plugin.
template <class A>
A read_fields(const Config& config, const std::vector<Flavor<A>>& flavors, const std::vector<Field<A>>& fields,
              const char* fallback) {
  const std::string name = config.string("flavor", fallback);
  const Flavor<A>* chosen = nullptr;
  std::string known;
  for (const Flavor<A>& f : flavors) {
    if (name == f.name) chosen = &f;
    known += (known.empty() ? "" : ", ") + std::string(f.name);
  }
  if (chosen == nullptr) config.invalid("flavor", "unknown flavor '" + name + "'; known: " + known);
  A args = chosen->args;
  for (const Field<A>& field : fields)
    std::visit([&](auto member) { config.update(field.key, args.*member); }, field.member);
  for (const Field<A>& field : fields) {
    if (!field.minimum) continue;
    const int64_t value = args.*std::get<int64_t A::*>(field.member);
    if (value < *field.minimum)
      config.invalid(field.key,
                     "must be at least " + std::to_string(*field.minimum) + ", got " + std::to_string(value));
  }
  return args;
}

/// The keys read_fields() reads, declared: `flavor` (default `fallback`) and every field, whose
/// default is not fixed (its flavor sets it); each field's doc lists every flavor's value.
template <class A>
std::vector<ConfigKey> field_keys(const std::vector<Flavor<A>>& flavors, const std::vector<Field<A>>& fields,
                                  const char* fallback) {
  std::string names;
  for (const Flavor<A>& f : flavors) names.append(names.empty() ? "" : ", ").append(f.name);
  std::vector<ConfigKey> keys = {
      ConfigKey("flavor", KEEL_CONFIG_STRING, toml_text(std::string(fallback)), "the named size: " + names)};
  for (const Field<A>& field : fields) {
    std::visit(
        [&](auto member) {
          using T = std::remove_cvref_t<decltype(std::declval<A>().*member)>;
          std::string doc = "from the flavor:";
          const char* separator = " ";
          for (const Flavor<A>& f : flavors) {
            doc.append(separator).append(f.name).append(" ").append(toml_text(f.args.*member));
            separator = ", ";
          }
          if (field.minimum) doc += "; at least " + std::to_string(*field.minimum);
          keys.emplace_back(field.key, config_type_of<T>(), std::nullopt, std::move(doc));
        },
        field.member);
  }
  return keys;
}

}  // namespace keel
