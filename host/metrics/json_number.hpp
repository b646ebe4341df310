// Numbers in Keel's JSON (metrics.jsonl, metrics gathered across ranks). JSON has no NaN or
// infinity (nlohmann writes null and then refuses to read it back as a number), so a
// non-finite value is written as the string "nan", "inf" or "-inf": unambiguous, and what
// Python's float() reads.
#pragma once

#include <nlohmann/json.hpp>

namespace keel {

/// `value` as JSON: a number when finite, else "nan", "inf" or "-inf".
nlohmann::json json_number(double value);

/// The number `j` holds: a JSON number, or "nan" / "inf" / "-inf" (null reads as nan). Anything
/// else throws std::invalid_argument.
double number_from_json(const nlohmann::json& j);

}  // namespace keel
