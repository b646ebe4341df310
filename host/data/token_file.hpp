// Token files: a 32-byte header and little-endian uint16 or uint32 tokens, memory-mapped.
//   bytes 0-7   magic "KEELTOK1"
//   bytes 8-11  uint32 bytes per token (2 or 4)
//   bytes 12-15 uint32 reserved (0)
//   bytes 16-23 uint64 number of tokens
//   bytes 24-31 uint64 vocabulary size (every token is below it)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/token_source.hpp"

namespace keel {

/// Writes `tokens` as a token file (uint16 when the vocabulary fits, else uint32), atomically.
void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens, uint64_t vocab_size);

/// A memory-mapped token file; samples are windows at offsets drawn from (seed, index).
class TokenFileSource final : public TokenSource {
 public:
  /// Opens and validates `path`; throws InputError naming the file and what is wrong.
  TokenFileSource(const std::string& path, uint64_t seed);
  ~TokenFileSource() override;
  TokenFileSource(const TokenFileSource&) = delete;
  TokenFileSource& operator=(const TokenFileSource&) = delete;

  void sample(uint64_t index, int64_t length, int64_t* out) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(vocab_); }
  std::string describe() const override;
  /// Number of tokens in the file.
  uint64_t num_tokens() const { return num_tokens_; }

 private:
  std::string path_;
  uint64_t seed_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const unsigned char* tokens_ = nullptr;
  uint32_t width_ = 0;
  uint64_t num_tokens_ = 0;
  uint64_t vocab_ = 0;
};

}  // namespace keel
