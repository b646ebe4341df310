#include "plugins/extensions.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <sstream>

#include <toml.hpp>

#include "common/error.hpp"
#include "common/text.hpp"
#include "common/utf8.hpp"
#include "plugins/versioned.hpp"

namespace keel {

namespace {

constexpr size_t kMaxKeyName = 64;
constexpr size_t kMaxDefaultText = 256;

// A plugin's C string, bounded: the text, or an InputError when it is longer than `limit`,
// not UTF-8 or holds a control character (it is printed to terminals).
std::string plugin_text(const char* text, size_t limit, const std::string& what) {
  const size_t length = strnlen(text, limit + 1);
  if (length > limit) throw InputError(cat(what, " is longer than ", limit, " bytes"));
  std::string out(text, length);
  check_utf8(out, what);
  if (std::any_of(out.begin(), out.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
    throw InputError(cat(what, " holds a control character"));
  return out;
}

// [a-z0-9_]+, and not the role table's own keys: in the flat form a component key `plugin`
// would read the selector's value.
bool valid_key_name(const std::string& name) {
  return !name.empty() && name != "plugin" && name != "component" && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

// The declared default "v = <text>" parsed as TOML, of the key's type (an integer literal
// stands for a float key's value, as config_float accepts it).
ConfigValue parse_default(const std::string& text, keel_config_type type, const std::string& what) {
  toml::value value;
  try {
    std::istringstream stream("v = " + text);
    const toml::value root = toml::parse(stream, what);
    if (root.as_table().size() != 1) throw InputError(cat(what, ": '", text, "' is not one TOML value"));
    value = toml::find(root, "v");
  } catch (const toml::exception&) {
    throw InputError(cat(what, ": '", text, "' is not a TOML value"));
  }
  switch (type) {
    // A default must be a value the job file could hold: the resolved configuration records it,
    // and a non-finite float or an integer at int64's ends (toml11's saturation) is refused there.
    case KEEL_CONFIG_INT:
      if (value.is_integer()) {
        const int64_t v = value.as_integer();
        if (v == std::numeric_limits<int64_t>::min() || v == std::numeric_limits<int64_t>::max())
          throw InputError(cat(what, ": '", text, "' is at the end of int64's range, which a job file cannot hold"));
        return v;
      }
      break;
    case KEEL_CONFIG_FLOAT:
      if (value.is_floating()) {
        const double v = value.as_floating();
        if (!std::isfinite(v) || std::fabs(v) == std::numeric_limits<double>::max())
          throw InputError(cat(what, ": '", text, "' is not a finite number, which a job file cannot hold"));
        return v;
      }
      if (value.is_integer()) return static_cast<double>(value.as_integer());
      break;
    case KEEL_CONFIG_BOOL:
      if (value.is_boolean()) return value.as_boolean();
      break;
    case KEEL_CONFIG_STRING:
      if (value.is_string()) return value.as_string().str;
      break;
  }
  throw InputError(cat(what, ": '", text, "' is not a TOML ", config_type_name(type)));
}

std::vector<DeclaredConfigKey> read_config_keys(const keel_extension* e, const std::string& where) {
  if (e->struct_size < KEEL_CONFIG_KEYS_EXTENSION_SIZE_1_3)
    throw InputError(cat(where, ": the config keys extension is ", e->struct_size, " bytes, this host needs at least ",
                         KEEL_CONFIG_KEYS_EXTENSION_SIZE_1_3, " (ABI 1.3)"));
  const auto table = copy_versioned<keel_config_keys_extension>(e);
  if (table.count > KEEL_MAX_CONFIG_KEYS)
    throw InputError(cat(where, ": declares ", table.count, " config keys, more than ", KEEL_MAX_CONFIG_KEYS));
  if (table.count > 0 && table.keys == nullptr)
    throw InputError(cat(where, ": declares ", table.count, " config keys but no array"));
  std::vector<DeclaredConfigKey> keys;
  std::set<std::string> seen;
  for (size_t i = 0; i < table.count; ++i) {
    const keel_config_key* raw = table.keys[i];
    const std::string at = cat(where, ": config key #", i);
    if (raw == nullptr || raw->struct_size < KEEL_CONFIG_KEY_SIZE_1_3)
      throw InputError(cat(at, " is NULL or smaller than keel_config_key of ABI 1.3"));
    const auto key = copy_versioned<keel_config_key>(raw);
    DeclaredConfigKey out;
    if (key.name != nullptr) out.name = plugin_text(key.name, kMaxKeyName, cat(at, "'s name"));
    if (!valid_key_name(out.name)) throw InputError(cat(at, " has an invalid name (want [a-z0-9_]+, at most 64)"));
    const std::string named = cat(where, ": config key '", out.name, "'");
    if (!seen.insert(out.name).second) throw InputError(cat(named, " is declared twice"));
    if (key.type < KEEL_CONFIG_INT || key.type > KEEL_CONFIG_STRING)
      throw InputError(cat(named, " has unknown type ", key.type));
    out.type = static_cast<keel_config_type>(key.type);
    if (key.default_value != nullptr) {
      out.default_text = plugin_text(key.default_value, kMaxDefaultText, cat(named, "'s default"));
      out.default_value = parse_default(out.default_text, out.type, cat(named, "'s default"));
    }
    if (key.doc != nullptr) out.doc = plugin_text(key.doc, KEEL_MAX_CONFIG_DOC, cat(named, "'s doc"));
    keys.push_back(std::move(out));
  }
  return keys;
}

}  // namespace

const char* config_type_name(keel_config_type type) {
  switch (type) {
    case KEEL_CONFIG_INT:
      return "integer";
    case KEEL_CONFIG_FLOAT:
      return "float";
    case KEEL_CONFIG_BOOL:
      return "boolean";
    case KEEL_CONFIG_STRING:
      return "string";
  }
  return "unknown";
}

namespace {

const char* kind_name(int kind) {
  switch (kind) {
    case KEEL_COMPONENT_MODEL:
      return "model";
    case KEEL_COMPONENT_CLIPPER:
      return "clipper";
  }
  return "component of unknown kind";
}

// An extension of type T for components of `kind`, checked to be on one and at least `needed`
// bytes (the size of ABI `abi`), zero-extended and cut from its chain.
template <class T>
T read_kind_extension(keel_component_kind kind, const keel_component& component, const keel_extension* e,
                      const std::string& where, const char* what, size_t needed, const char* abi) {
  if (component.kind != kind)
    throw InputError(cat(where, ": the ", kind_name(kind), " ", what, " extension on a ", kind_name(component.kind)));
  if (e->struct_size < needed)
    throw InputError(cat(where, ": the ", kind_name(kind), " ", what, " extension is ", e->struct_size,
                         " bytes, this host needs at least ", needed, " (ABI ", abi, ")"));
  T out = copy_versioned<T>(e);
  out.base.next = nullptr;
  return out;
}

template <class T>
T read_model_extension(const keel_component& component, const keel_extension* e, const std::string& where,
                       const char* what, size_t needed, const char* abi) {
  return read_kind_extension<T>(KEEL_COMPONENT_MODEL, component, e, where, what, needed, abi);
}

}  // namespace

ComponentExtensions read_extensions(const std::string& path, const keel_component& component) {
  ComponentExtensions out;
  if (component.struct_size < KEEL_COMPONENT_SIZE_1_2) return out;  // before 1.2: no chain
  auto where = [&](size_t index) {
    return cat("plugin ", path, ": component '", component.name, "' extension #", index);
  };
  std::set<int32_t> seen;
  size_t index = 0;
  for (const keel_extension* e = component.extensions; e != nullptr; e = e->next, ++index) {
    // A chain that loops back on itself must not hang the loader.
    if (index >= KEEL_MAX_EXTENSIONS)
      throw InputError(cat("plugin ", path, ": component '", component.name, "' lists more than ", KEEL_MAX_EXTENSIONS,
                           " extensions (a loop in its chain?)"));
    if (e->struct_size < KEEL_EXTENSION_SIZE_1_2)
      throw InputError(cat(where(index), " is ", e->struct_size, " bytes, smaller than keel_extension (",
                           KEEL_EXTENSION_SIZE_1_2, ")"));
    if (!seen.insert(e->type).second) throw InputError(cat(where(index), ": type ", e->type, " is listed twice"));
    if (e->type == KEEL_EXTENSION_CONFIG_KEYS) {
      out.config_keys = read_config_keys(e, where(index));
      continue;
    }
    if (e->type == KEEL_EXTENSION_MODEL_IMPORT) {
      out.model_import = read_model_extension<keel_model_import_extension>(component, e, where(index), "import",
                                                                           KEEL_MODEL_IMPORT_EXTENSION_SIZE_1_4, "1.4");
      if (out.model_import.import_config == nullptr || out.model_import.import_state == nullptr)
        throw InputError(cat(where(index), ": the model import extension lacks import_config or import_state"));
      continue;
    }
    if (e->type == KEEL_EXTENSION_MODEL_RECOMPUTE) {
      out.model_recompute = read_model_extension<keel_model_recompute_extension>(
          component, e, where(index), "recompute", KEEL_MODEL_RECOMPUTE_EXTENSION_SIZE_1_6, "1.6");
      if (out.model_recompute.set_recompute == nullptr)
        throw InputError(cat(where(index), ": the model recompute extension has no set_recompute function"));
      continue;
    }
    if (e->type == KEEL_EXTENSION_MODEL_MEMORY) {
      out.model_memory = read_model_extension<keel_model_memory_extension>(component, e, where(index), "memory",
                                                                           KEEL_MODEL_MEMORY_EXTENSION_SIZE_1_6, "1.6");
      if (out.model_memory.activation_bytes == nullptr)
        throw InputError(cat(where(index), ": the model memory extension has no activation_bytes function"));
      continue;
    }
    if (e->type == KEEL_EXTENSION_MODEL_ATTENTION) {
      out.model_attention = read_model_extension<keel_model_attention_extension>(
          component, e, where(index), "attention", KEEL_MODEL_ATTENTION_EXTENSION_SIZE_1_9, "1.9");
      if (out.model_attention.set_attention == nullptr)
        throw InputError(cat(where(index), ": the model attention extension has no set_attention function"));
      continue;
    }
    if (e->type == KEEL_EXTENSION_CLIPPER_SHARDS) {
      out.clipper_shards = read_kind_extension<keel_clipper_shards_extension>(
          KEEL_COMPONENT_CLIPPER, component, e, where(index), "shards", KEEL_CLIPPER_SHARDS_EXTENSION_SIZE_1_7, "1.7");
      if (out.clipper_shards.bind_gradient_shards == nullptr)
        throw InputError(cat(where(index), ": the clipper shards extension has no bind_gradient_shards function"));
      continue;
    }
    if (e->type != KEEL_EXTENSION_MODEL_EXPORT) {
      out.unknown.push_back(e->type);
      continue;
    }
    out.model_export = read_model_extension<keel_model_export_extension>(component, e, where(index), "export",
                                                                         KEEL_MODEL_EXPORT_EXTENSION_SIZE_1_2, "1.2");
    if (out.model_export.export_state == nullptr)
      throw InputError(cat(where(index), ": the model export extension has no export_state function"));
  }
  return out;
}

}  // namespace keel
