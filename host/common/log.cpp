#include "common/log.hpp"

#include <cstdio>
#include <mutex>

namespace keel {

namespace {
int log_rank = 0;
std::mutex log_mutex;
}  // namespace

void set_log_rank(int rank) { log_rank = rank; }

void log_line(LogLevel level, const std::string& message, const std::string& source) {
  const char* tag = level == LogLevel::warn ? "warning: " : level == LogLevel::error ? "error: " : "";
  std::lock_guard<std::mutex> lock(log_mutex);
  if (source.empty())
    std::fprintf(stderr, "[keel %d] %s%s\n", log_rank, tag, message.c_str());
  else
    std::fprintf(stderr, "[keel %d] [%s] %s%s\n", log_rank, source.c_str(), tag, message.c_str());
  std::fflush(stderr);
}

}  // namespace keel
