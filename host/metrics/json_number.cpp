#include "metrics/json_number.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace keel {

nlohmann::json json_number(double value) {
  if (std::isfinite(value)) return value;
  if (std::isnan(value)) return "nan";
  return value > 0 ? "inf" : "-inf";
}

double number_from_json(const nlohmann::json& j) {
  if (j.is_number()) return j.get<double>();
  if (j.is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (j.is_string()) {
    const std::string& text = j.get_ref<const std::string&>();
    if (text == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (text == "inf") return std::numeric_limits<double>::infinity();
    if (text == "-inf") return -std::numeric_limits<double>::infinity();
  }
  throw std::invalid_argument("expected a number, \"nan\", \"inf\" or \"-inf\", got " + j.dump());
}

}  // namespace keel
