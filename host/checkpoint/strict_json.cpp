#include "checkpoint/strict_json.hpp"

#include <limits>
#include <set>

#include "common/error.hpp"
#include "common/text.hpp"

namespace keel {

using nlohmann::json;

nlohmann::json parse_untrusted_json(std::string_view text, const std::string& where, int max_depth) {
  // One set of keys per open object: nlohmann keeps the last of two equal keys without a word.
  std::vector<std::set<std::string>> open_objects;
  auto check = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= max_depth) throw InputError(cat(where, ": JSON nested deeper than ", max_depth, " levels"));
        if (event == json::parse_event_t::object_start) open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() && !open_objects.back().insert(parsed.get<std::string>()).second)
          throw InputError(cat(where, ": key '", parsed.get<std::string>(), "' appears twice in one object"));
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), check);
  } catch (const json::exception& e) {
    throw InputError(cat(where, ": not valid JSON: ", e.what()));
  }
}

const json& json_field(const json& object, const std::string& key, const std::string& where) {
  if (!object.is_object()) throw InputError(cat(where, ": expected a JSON object, found ", object.type_name()));
  auto it = object.find(key);
  if (it == object.end()) throw InputError(cat(where, ": missing '", key, "'"));
  return *it;
}

void json_only_keys(const json& object, std::initializer_list<const char*> known, const std::string& where) {
  if (!object.is_object()) throw InputError(cat(where, ": expected a JSON object, found ", object.type_name()));
  for (const auto& [key, value] : object.items()) {
    bool found = false;
    for (const char* k : known) found = found || key == k;
    if (!found) throw InputError(cat(where, ": unknown key '", key, "'"));
  }
}

int64_t json_int(const json& value, const std::string& where, int64_t lo, int64_t hi) {
  int64_t v = 0;
  if (value.is_number_unsigned()) {
    const auto u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw InputError(cat(where, ": ", u, " is out of range [", lo, ", ", hi, "]"));
    v = static_cast<int64_t>(u);
  } else if (value.is_number_integer()) {
    v = value.get<int64_t>();
  } else {
    throw InputError(cat(where, ": expected an integer, found ", value.is_number() ? value.dump() : value.type_name()));
  }
  if (v < lo || v > hi) throw InputError(cat(where, ": ", v, " is out of range [", lo, ", ", hi, "]"));
  return v;
}

uint64_t json_uint(const json& value, const std::string& where, uint64_t hi) {
  if (value.is_number_integer() && !value.is_number_unsigned())
    throw InputError(cat(where, ": ", value.get<int64_t>(), " is negative"));
  if (!value.is_number_unsigned())
    throw InputError(cat(where, ": expected an integer, found ", value.is_number() ? value.dump() : value.type_name()));
  const auto v = value.get<uint64_t>();
  if (v > hi) throw InputError(cat(where, ": ", v, " is out of range [0, ", hi, "]"));
  return v;
}

std::string json_string(const json& value, const std::string& where) {
  if (!value.is_string()) throw InputError(cat(where, ": expected a string, found ", value.type_name()));
  return value.get<std::string>();
}

std::vector<int64_t> json_dims(const json& value, const std::string& where, size_t max_rank) {
  if (!value.is_array()) throw InputError(cat(where, ": expected an array of integers, found ", value.type_name()));
  if (value.size() > max_rank)
    throw InputError(cat(where, ": ", value.size(), " dimensions, at most ", max_rank, " are supported"));
  std::vector<int64_t> dims;
  for (size_t i = 0; i < value.size(); ++i) {
    const json& d = value[i];
    if (d.is_number_integer() && !d.is_number_unsigned())
      throw InputError(cat(where, ": dimension ", i, " is negative (", d.get<int64_t>(), ")"));
    dims.push_back(json_int(d, cat(where, ": dimension ", i), 0, std::numeric_limits<int64_t>::max()));
  }
  return dims;
}

bool checked_volume(const std::vector<int64_t>& dims, int64_t& volume) {
  int64_t n = 1;
  for (int64_t d : dims)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return false;
  volume = n;
  return true;
}

}  // namespace keel
