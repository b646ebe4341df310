#include "common/text.hpp"

#include <cstdarg>
#include <cstdio>

namespace keel {

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += separator;
    out += items[i];
  }
  return out;
}

std::string format(const char* pattern, ...) {
  va_list args;
  va_start(args, pattern);
  va_list copy;
  va_copy(copy, args);
  int needed = std::vsnprintf(nullptr, 0, pattern, copy);
  va_end(copy);
  std::string out(needed > 0 ? static_cast<size_t>(needed) : 0, '\0');
  if (needed > 0) std::vsnprintf(out.data(), out.size() + 1, pattern, args);
  va_end(args);
  return out;
}

std::string human_count(double count) {
  const char* suffixes[] = {"", " K", " M", " B", " T"};
  int i = 0;
  while (count >= 1000.0 && i < 4) {
    count /= 1000.0;
    ++i;
  }
  return i == 0 ? format("%.0f", count) : format("%.2f%s", count, suffixes[i]);
}

std::string human_bytes(double bytes) {
  const char* suffixes[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (bytes >= 1024.0 && i < 4) {
    bytes /= 1024.0;
    ++i;
  }
  return format(i == 0 ? "%.0f %s" : "%.1f %s", bytes, suffixes[i]);
}

std::string human_duration(double seconds) {
  if (seconds < 0 || seconds != seconds) return "?";
  auto total = static_cast<int64_t>(seconds + 0.5);
  if (total >= 3600) return format("%ldh%02ldm", static_cast<long>(total / 3600), static_cast<long>(total % 3600 / 60));
  if (total >= 60) return format("%ldm%02lds", static_cast<long>(total / 60), static_cast<long>(total % 60));
  return format("%lds", static_cast<long>(total));
}

bool glob_match(const std::string& pattern, const std::string& text) {
  // Iterative glob with single backtrack point: linear in practice, no regex needed.
  size_t p = 0, t = 0, star = std::string::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != std::string::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace keel
