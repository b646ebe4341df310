// Small text helpers: message building and number formatting.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace keel {

/// Concatenates the streamed form of every argument.
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

/// Joins `items` with `separator`.
std::string join(const std::vector<std::string>& items, const std::string& separator);

/// printf-style formatting into a std::string (g++ 12 has no std::format).
std::string format(const char* pattern, ...) __attribute__((format(printf, 1, 2)));

/// "8.03 B", "15.7 M", "512" — a count with an SI-like suffix.
std::string human_count(double count);

/// "1.2 GiB" — a byte size.
std::string human_bytes(double bytes);

/// "1h02m", "3m20s", "12s" — a duration.
std::string human_duration(double seconds);

/// Whether `text` matches the glob `pattern` ('*' any run, '?' one character).
bool glob_match(const std::string& pattern, const std::string& text);

}  // namespace keel
