// Token files: a header and little-endian uint16 or uint32 tokens, read sample by sample.
// Version 2 (written), 48 bytes:
//   bytes 0-7   magic "KEELTOK2"
//   bytes 8-11  uint32 bytes per token (2 or 4)
//   bytes 12-15 uint32 flags: bit 0 = the file records an EOS id; other bits are 0
//   bytes 16-23 uint64 number of tokens
//   bytes 24-31 uint64 vocabulary size (every token is below it)
//   bytes 32-39 uint64 EOS id, the token that ends each document (below the vocabulary; 0 without flag 0)
//   bytes 40-47 uint64 number of documents (at most the number of tokens)
// Version 1 (still read), 32 bytes: "KEELTOK1", uint32 bytes per token, uint32 reserved (0),
// uint64 number of tokens, uint64 vocabulary size; no EOS id, 0 documents.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/input_file.hpp"
#include "data/token_source.hpp"

namespace keel {

/// Writes `tokens` as a version-2 token file (uint16 when the vocabulary fits, else uint32),
/// atomically; `eos_id` and `num_documents` go to the header as given.
void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens, uint64_t vocab_size,
                      std::optional<uint32_t> eos_id = std::nullopt, uint64_t num_documents = 0);

/// Writes a version-2 token file as tokens arrive, without holding them: into `path`.partial,
/// renamed to `path` by close(). A writer destroyed before close() removes the partial file,
/// so a failed build never leaves or replaces anything at `path`.
class TokenFileWriter {
 public:
  /// Opens `path`.partial; throws InputError when the vocabulary or EOS id cannot be recorded.
  TokenFileWriter(std::string path, uint64_t vocab_size, std::optional<uint32_t> eos_id);
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  /// Appends `n` tokens; each must be below the vocabulary size.
  void append(const uint32_t* tokens, size_t n);
  /// Appends the EOS id and counts one document; throws when the file records no EOS id.
  void end_document();
  /// Counts `n` documents whose EOS ids the caller already appended.
  void count_documents(uint64_t n) { num_documents_ += n; }
  /// Writes the header, syncs the partial file to the disk, then renames it to `path` (and
  /// syncs its folder, best effort): a crash leaves the old output or the whole new one.
  void close();

  /// Tokens appended so far.
  uint64_t num_tokens() const { return num_tokens_; }
  /// Documents counted so far.
  uint64_t num_documents() const { return num_documents_; }

 private:
  void flush_buffer();

  std::string path_;
  std::string partial_;
  std::ofstream out_;
  uint64_t vocab_;
  std::optional<uint32_t> eos_;
  uint32_t width_;
  uint64_t num_tokens_ = 0;
  uint64_t num_documents_ = 0;
  std::vector<unsigned char> buffer_;
  bool open_ = false;
};

/// Which part of a token file a source reads. With held_out > 0 the file is cut into blocks of
/// block_tokens tokens and a share of the blocks, chosen by split_seed alone, is held out: the
/// validation side reads only held-out blocks, the training side only the others.
struct TokenFileShare {
  double held_out = 0;          ///< share of the blocks held out, in [0, 1)
  int64_t block_tokens = 8192;  ///< tokens per block (the last block may be shorter)
  uint64_t split_seed = 0;      ///< chooses the held-out blocks
  bool validation = false;      ///< read the held-out blocks (else the training ones)
};

/// A token file; samples are windows at offsets drawn from (seed, index).
class TokenFileSource final : public TokenSource {
 public:
  /// Opens and validates `path`; throws InputError naming `key` (the config key that named
  /// the file), the file and what is wrong.
  TokenFileSource(const std::string& path, uint64_t seed, std::string key = "data.path");
  /// Opens `path` and reads only one side of its held-out split (the whole file when
  /// share.held_out is 0); throws InputError when the split leaves a side without blocks.
  TokenFileSource(const std::string& path, uint64_t seed, const TokenFileShare& share, std::string key = "data.path");
  ~TokenFileSource() override;
  TokenFileSource(const TokenFileSource&) = delete;
  TokenFileSource& operator=(const TokenFileSource&) = delete;

  void sample(uint64_t index, int64_t length, int64_t* out) const override;
  /// The token offset of sample `index`'s window of `length` tokens: uniform over every window
  /// that lies inside this source's side of the split.
  uint64_t sample_start(uint64_t index, int64_t length) const;
  /// Whether block `block` (of share.block_tokens tokens) is held out; false without a split.
  bool held_out(uint64_t block) const { return block < held_out_.size() && held_out_[block]; }
  int64_t vocab_size() const override { return static_cast<int64_t>(vocab_); }
  std::string describe() const override;
  std::optional<int64_t> eos_id() const override { return eos_; }
  /// Number of tokens in the file.
  uint64_t num_tokens() const { return num_tokens_; }
  /// Number of documents the header records (0 when it records none).
  uint64_t num_documents() const { return num_documents_; }

 private:
  std::string path_;
  std::string key_;
  uint64_t seed_;
  std::unique_ptr<InputFile> file_;
  uint64_t header_size_ = 0;
  uint32_t width_ = 0;
  uint64_t num_tokens_ = 0;
  uint64_t vocab_ = 0;
  std::optional<int64_t> eos_;
  uint64_t num_documents_ = 0;

  // The split: one bit per block, the spans (first token, tokens) of this side's runs of
  // consecutive blocks, and per sample length the running count of window starts in them.
  struct Span {
    uint64_t first = 0, tokens = 0;
  };
  const std::vector<uint64_t>& window_starts(uint64_t length) const;
  TokenFileShare share_;
  std::vector<bool> held_out_;
  std::vector<Span> spans_;
  mutable std::mutex starts_mutex_;
  mutable std::map<uint64_t, std::vector<uint64_t>> starts_;
};

}  // namespace keel
