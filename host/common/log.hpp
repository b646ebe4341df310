// The host's log: one line per message on stderr, prefixed with the rank.
#pragma once

#include <string>

namespace keel {

enum class LogLevel { debug, info, warn, error };

/// Sets the rank shown in every line's prefix.
void set_log_rank(int rank);

/// Writes one line at `level`; `source` names a component ("" for the host itself).
void log_line(LogLevel level, const std::string& message, const std::string& source = "");

/// Writes one info line.
inline void log_info(const std::string& message) { log_line(LogLevel::info, message); }
/// Writes one warning line.
inline void log_warn(const std::string& message) { log_line(LogLevel::warn, message); }

}  // namespace keel
