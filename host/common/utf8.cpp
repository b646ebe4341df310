#include "common/utf8.hpp"

#include <cstdint>

#include "common/error.hpp"
#include "common/text.hpp"

namespace keel {

namespace {

// The length of the well-formed sequence at `s[i]`, or 0. Hand-written (the table of RFC 3629,
// section 4) because none of the libraries Keel already links offers a validator.
size_t sequence_length(const std::string& s, size_t i) {
  auto byte = [&](size_t k) { return i + k < s.size() ? static_cast<uint8_t>(s[i + k]) : uint8_t{0}; };
  auto tail = [&](size_t k, uint8_t lo = 0x80, uint8_t hi = 0xBF) { return byte(k) >= lo && byte(k) <= hi; };
  const uint8_t b = byte(0);
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return tail(1) ? 2 : 0;
  if (b == 0xE0) return tail(1, 0xA0) && tail(2) ? 3 : 0;
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return tail(1) && tail(2) ? 3 : 0;
  if (b == 0xED) return tail(1, 0x80, 0x9F) && tail(2) ? 3 : 0;  // no surrogates
  if (b == 0xF0) return tail(1, 0x90) && tail(2) && tail(3) ? 4 : 0;
  if (b >= 0xF1 && b <= 0xF3) return tail(1) && tail(2) && tail(3) ? 4 : 0;
  if (b == 0xF4) return tail(1, 0x80, 0x8F) && tail(2) && tail(3) ? 4 : 0;  // up to U+10FFFF
  return 0;
}

}  // namespace

void check_utf8(const std::string& text, const std::string& name) {
  size_t line = 1;
  for (size_t i = 0; i < text.size();) {
    const size_t n = sequence_length(text, i);
    if (n == 0)
      throw InputError(cat(name, ":", line, ": not valid UTF-8 (byte 0x",
                           format("%02x", static_cast<unsigned>(static_cast<uint8_t>(text[i]))), " at offset ", i,
                           "); TOML text must be UTF-8"));
    if (text[i] == '\n') ++line;
    i += n;
  }
}

}  // namespace keel
