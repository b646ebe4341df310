// A bound on TOML nesting, checked before toml11 parses: toml11 recurses once per nested
// array, inline table and dotted-key segment, so a hostile file (or --set value, or the config
// text of a checkpoint's manifest) nested 100 000 deep overflows the stack.
#pragma once

#include <cstddef>
#include <string>

namespace keel {

/// The deepest nesting a job's TOML may have: Keel's own configs need three levels.
inline constexpr size_t kMaxTomlDepth = 64;

/// Throws an InputError "<name>:<line>: ..." when `text` nests arrays, inline tables, table
/// headers and dotted keys deeper than kMaxTomlDepth. Strings and comments are skipped, so the
/// count is the one toml11's recursion would reach (or more; never less).
void check_toml_depth(const std::string& text, const std::string& name);

}  // namespace keel
