// UTF-8 validation of outside text before a parser sees it: TOML must be valid UTF-8, and
// toml11 reads past the end of its buffer on some invalid sequences inside strings.
#pragma once

#include <string>

namespace keel {

/// Throws an InputError "<name>:<line>: ..." unless `text` is well-formed UTF-8 (RFC 3629: no
/// overlong forms, no surrogates, nothing above U+10FFFF, no truncated sequence).
void check_utf8(const std::string& text, const std::string& name);

}  // namespace keel
