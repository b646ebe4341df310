// JSON read from a file Keel did not write itself (a checkpoint's manifest, a safetensors
// header): parsed and read strictly, so that nothing nlohmann-json would accept silently — a
// repeated key (the last one wins), a float where an integer belongs (truncated), a negative
// number read as unsigned (wrapped) — reaches the code that uses the values. Every refusal is
// an InputError naming the file and the key.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace keel {

/// Parses `text`; refuses invalid JSON, a key repeated within one object and nesting deeper
/// than `max_depth` containers. Errors name `where` (the file).
nlohmann::json parse_untrusted_json(std::string_view text, const std::string& where, int max_depth);

/// `object[key]`; an InputError naming `where` and the key when `object` is not an object or lacks it.
const nlohmann::json& json_field(const nlohmann::json& object, const std::string& key, const std::string& where);

/// Refuses any key of `object` not in `known`, naming `where` and the key.
void json_only_keys(const nlohmann::json& object, std::initializer_list<const char*> known, const std::string& where);

/// An integer in [lo, hi]; a float, a string or an integer out of range is refused.
int64_t json_int(const nlohmann::json& value, const std::string& where, int64_t lo, int64_t hi);

/// A non-negative integer up to `hi`.
uint64_t json_uint(const nlohmann::json& value, const std::string& where, uint64_t hi);

/// A string.
std::string json_string(const nlohmann::json& value, const std::string& where);

/// An array of at most `max_rank` non-negative integers (tensor dimensions or offsets).
std::vector<int64_t> json_dims(const nlohmann::json& value, const std::string& where, size_t max_rank);

/// The product of `dims` (1 for none); false when it exceeds INT64_MAX.
bool checked_volume(const std::vector<int64_t>& dims, int64_t& volume);

}  // namespace keel
