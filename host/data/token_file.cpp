#include "data/token_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <utility>

#include "common/durable_file.hpp"
#include "common/error.hpp"
#include "common/input_file.hpp"
#include "common/text.hpp"

namespace keel {

namespace {
constexpr char kMagicV1[8] = {'K', 'E', 'E', 'L', 'T', 'O', 'K', '1'};
constexpr char kMagicV2[8] = {'K', 'E', 'E', 'L', 'T', 'O', 'K', '2'};
constexpr uint32_t kFlagEos = 1;
// Tokens are buffered and written in blocks: one write call per token is the slow part of a
// multi-gigabyte build.
constexpr size_t kBufferBytes = size_t{1} << 20;

struct HeaderV1 {
  char magic[8];
  uint32_t width;
  uint32_t reserved;
  uint64_t num_tokens;
  uint64_t vocab_size;
};
static_assert(sizeof(HeaderV1) == 32);

struct HeaderV2 {
  char magic[8];
  uint32_t width;
  uint32_t flags;
  uint64_t num_tokens;
  uint64_t vocab_size;
  uint64_t eos_id;
  uint64_t num_documents;
};
static_assert(sizeof(HeaderV2) == 48);

// The largest vocabulary whose every id fits a token of `width` bytes.
uint64_t max_vocab(uint32_t width) { return width == 2 ? (uint64_t{1} << 16) : (uint64_t{1} << 32); }

// Puts the file's data on the disk, so the rename that publishes it cannot outlive them in a
// power loss (which would replace a good output with an empty file).
void sync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error(cat("cannot open token file ", path, " to sync it: ", std::strerror(errno)));
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    throw std::runtime_error(cat("cannot sync token file ", path, ": ", std::strerror(err)));
  }
  ::close(fd);
}
}  // namespace

TokenFileWriter::TokenFileWriter(std::string path, uint64_t vocab_size, std::optional<uint32_t> eos_id)
    : path_(std::move(path)),
      partial_(path_ + ".partial"),
      vocab_(vocab_size),
      eos_(eos_id),
      width_(vocab_size <= max_vocab(2) ? 2 : 4) {
  if (vocab_ == 0) throw InputError(cat("token file ", path_, ": vocabulary size is 0"));
  if (vocab_ > max_vocab(4))
    throw InputError(cat("token file ", path_, ": vocabulary size ", vocab_, " does not fit 4-byte tokens (at most ",
                         max_vocab(4), ")"));
  if (eos_ && *eos_ >= vocab_)
    throw InputError(cat("token file ", path_, ": EOS id ", *eos_, " is not below the vocabulary size ", vocab_));
  out_.open(partial_, std::ios::binary | std::ios::trunc);
  if (!out_) throw InputError(cat("cannot write token file ", partial_, ": ", std::strerror(errno)));
  open_ = true;
  // The header's place; close() writes it once the counts are known.
  const HeaderV2 blank{};
  out_.write(reinterpret_cast<const char*>(&blank), sizeof(blank));
  buffer_.reserve(kBufferBytes);
}

TokenFileWriter::~TokenFileWriter() {
  if (!open_) return;
  out_.close();
  std::error_code ec;
  std::filesystem::remove(partial_, ec);
}

void TokenFileWriter::append(const uint32_t* tokens, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t token = tokens[i];
    if (token >= vocab_) throw InputError(cat("token ", token, " is not below the vocabulary size ", vocab_));
    if (buffer_.size() + width_ > kBufferBytes) flush_buffer();
    const auto* bytes = reinterpret_cast<const unsigned char*>(&token);
    buffer_.insert(buffer_.end(), bytes, bytes + width_);  // little-endian: the low bytes first
  }
  num_tokens_ += n;
}

void TokenFileWriter::end_document() {
  if (!eos_) throw InputError(cat("token file ", path_, ": a document end needs an EOS id, and this file has none"));
  append(&*eos_, 1);
  ++num_documents_;
}

void TokenFileWriter::flush_buffer() {
  out_.write(reinterpret_cast<const char*>(buffer_.data()), static_cast<std::streamsize>(buffer_.size()));
  buffer_.clear();
  if (!out_) throw std::runtime_error(cat("cannot write token file ", partial_, ": ", std::strerror(errno)));
}

void TokenFileWriter::close() {
  if (!open_) throw std::logic_error(cat("token file ", path_, " is already closed"));
  if (num_documents_ > num_tokens_)
    throw InputError(cat("token file ", path_, ": ", num_documents_, " documents in ", num_tokens_, " tokens"));
  flush_buffer();
  HeaderV2 header{};
  std::memcpy(header.magic, kMagicV2, sizeof(kMagicV2));
  header.width = width_;
  header.flags = eos_ ? kFlagEos : 0;
  header.num_tokens = num_tokens_;
  header.vocab_size = vocab_;
  header.eos_id = eos_.value_or(0);
  header.num_documents = num_documents_;
  out_.seekp(0);
  out_.write(reinterpret_cast<const char*>(&header), sizeof(header));
  out_.close();
  if (!out_) throw std::runtime_error(cat("cannot write token file ", partial_, ": ", std::strerror(errno)));
  sync_file(partial_);
  std::filesystem::rename(partial_, path_);
  open_ = false;
  // The rename itself reaches the disk with the folder; the file is complete either way, so a
  // folder that cannot be synced does not fail the write.
  const std::filesystem::path folder = std::filesystem::path(path_).parent_path();
  try {
    sync_dir(folder.empty() ? std::filesystem::path(".") : folder);
  } catch (const std::exception&) {
  }
}

void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens, uint64_t vocab_size,
                      std::optional<uint32_t> eos_id, uint64_t num_documents) {
  TokenFileWriter writer(path, vocab_size, eos_id);
  writer.append(tokens.data(), tokens.size());
  writer.count_documents(num_documents);
  writer.close();
}

TokenFileSource::TokenFileSource(const std::string& path, uint64_t seed, std::string key)
    : path_(path), key_(std::move(key)), seed_(seed), file_(std::make_unique<InputFile>(path, key_)) {
  const uint64_t file_size = file_->size();
  if (file_size < sizeof(HeaderV1))
    throw InputError(cat(key_, ": token file ", path, " is ", file_size, " bytes, smaller than its 32-byte header"));
  auto fail = [&](const std::string& why) { throw InputError(cat(key_, ": token file ", path, ": ", why)); };
  unsigned char head[sizeof(HeaderV2)] = {};
  file_->read_at(0, head, std::min<uint64_t>(file_size, sizeof(head)));
  // Both versions read into the version-2 fields; a version-1 file records no EOS id and no
  // documents.
  HeaderV2 header{};
  size_t header_size = 0;
  if (std::memcmp(head, kMagicV1, sizeof(kMagicV1)) == 0) {
    HeaderV1 v1{};
    std::memcpy(&v1, head, sizeof(v1));
    if (v1.reserved != 0) fail(cat("reserved header field is ", v1.reserved, ", expected 0"));
    header.width = v1.width;
    header.num_tokens = v1.num_tokens;
    header.vocab_size = v1.vocab_size;
    header_size = sizeof(HeaderV1);
  } else if (std::memcmp(head, kMagicV2, sizeof(kMagicV2)) == 0) {
    if (file_size < sizeof(HeaderV2))
      fail(cat("the file is ", file_size, " bytes, smaller than its 48-byte KEELTOK2 header"));
    std::memcpy(&header, head, sizeof(header));
    header_size = sizeof(HeaderV2);
  } else {
    fail("bad magic (not a KEELTOK1 or KEELTOK2 file; build one with keel-data)");
  }
  if (header.width != 2 && header.width != 4)
    fail(cat("width: bytes per token is ", header.width, ", expected 2 or 4"));
  // The size check in arithmetic that cannot wrap: a header claiming 2^63 tokens must not
  // pass as a small file.
  uint64_t payload = 0, expected = 0;
  if (__builtin_mul_overflow(header.num_tokens, uint64_t{header.width}, &payload) ||
      __builtin_add_overflow(payload, uint64_t{header_size}, &expected) || expected != file_size)
    fail(cat("num_tokens: header promises ", header.num_tokens, " tokens of ", header.width, " bytes but the file has ",
             file_size - header_size, " bytes after its header"));
  if (header.vocab_size == 0) fail("vocab_size: vocabulary size is 0");
  // Every token of the width must be able to be below the vocabulary, and the vocabulary must
  // be representable as a token id of the model (int64).
  if (header.vocab_size > max_vocab(header.width))
    fail(cat("vocab_size: vocabulary size ", header.vocab_size, " does not fit ", header.width,
             "-byte tokens (at most ", max_vocab(header.width), ")"));
  if ((header.flags & ~kFlagEos) != 0)
    fail(cat("flags: unknown bits set (flags ", header.flags, "; only bit 0, the EOS id, is defined)"));
  if ((header.flags & kFlagEos) != 0) {
    if (header.eos_id >= header.vocab_size)
      fail(cat("eos_id: EOS id ", header.eos_id, " is not below the vocabulary size ", header.vocab_size));
    eos_ = static_cast<int64_t>(header.eos_id);
  } else if (header.eos_id != 0) {
    fail(cat("eos_id: is ", header.eos_id, " but the flags record no EOS id (expected 0)"));
  }
  // Not counted against the EOS ids here: the file may be far larger than memory, and opening
  // it must not read every token.
  if (header.num_documents > header.num_tokens)
    fail(cat("num_documents: ", header.num_documents, " documents in ", header.num_tokens, " tokens"));
  width_ = header.width;
  num_tokens_ = header.num_tokens;
  vocab_ = header.vocab_size;
  num_documents_ = header.num_documents;
  header_size_ = header_size;
}

TokenFileSource::~TokenFileSource() = default;

TokenFileSource::TokenFileSource(const std::string& path, uint64_t seed, const TokenFileShare& share, std::string key)
    : TokenFileSource(path, seed, std::move(key)) {
  share_ = share;
  if (share.held_out == 0) return;
  if (!(share.held_out > 0 && share.held_out < 1) || share.block_tokens < 1)
    throw std::invalid_argument(cat("token file share: held_out ", share.held_out, " must lie in [0, 1), block_tokens ",
                                    share.block_tokens, " must be positive"));
  const auto block = static_cast<uint64_t>(share.block_tokens);
  const uint64_t blocks = num_tokens_ / block + (num_tokens_ % block != 0 ? 1 : 0);
  // Rounded to the nearest block, and a split that rounds to no block is refused: a "held-out"
  // side of nothing would make validation read training data.
  const double wanted = share.held_out * static_cast<double>(blocks);
  const auto held = static_cast<uint64_t>(std::llround(wanted));
  if (held == 0)
    throw InputError(cat("validation.split: ", share.held_out, " of token file ", path, " (", num_tokens_,
                         " tokens in ", blocks, " block(s) of ", block, ") holds out no block (", wanted,
                         " rounds to 0): raise validation.split to at least ", 0.5 / static_cast<double>(blocks),
                         " or lower validation.split_block"));
  if (held >= blocks)
    throw InputError(cat("validation.split: holding out ", share.held_out, " of token file ", path, " (", num_tokens_,
                         " tokens in ", blocks, " block(s) of ", block, ") leaves no block for training: lower ",
                         "validation.split_block or validation.split"));
  // Robert Floyd's sampling of `held` distinct blocks: one draw per held-out block and one bit
  // per block, where a shuffled list of every block would cost 8 bytes each.
  held_out_.assign(blocks, false);
  uint64_t state = share.split_seed ^ 0x5B17B10C5ULL;
  for (uint64_t j = blocks - held; j < blocks; ++j) {
    const uint64_t t = splitmix64(state) % (j + 1);
    held_out_[held_out_[t] ? j : t] = true;
  }
  for (uint64_t b = 0; b < blocks; ++b) {
    if (held_out_[b] != share.validation) continue;
    const uint64_t first = b * block, tokens = std::min(block, num_tokens_ - first);
    if (!spans_.empty() && spans_.back().first + spans_.back().tokens == first)
      spans_.back().tokens += tokens;
    else
      spans_.push_back({first, tokens});
  }
}

const std::vector<uint64_t>& TokenFileSource::window_starts(uint64_t length) const {
  std::lock_guard<std::mutex> lock(starts_mutex_);
  auto [it, fresh] = starts_.try_emplace(length);
  if (!fresh) return it->second;
  // The running count stays below the token count, so it cannot wrap.
  uint64_t total = 0;
  for (const Span& span : spans_) {
    if (span.tokens >= length) total += span.tokens - length + 1;
    it->second.push_back(total);
  }
  if (total == 0) {
    starts_.erase(it);
    uint64_t longest = 0;
    for (const Span& span : spans_) longest = std::max(longest, span.tokens);
    throw InputError(cat(key_, ": token file ", path_, ": no ", share_.validation ? "held-out" : "training",
                         " run of blocks holds a sample of ", length, " tokens (the longest has ", longest,
                         "): raise validation.split_block or lower the sequence length"));
  }
  return it->second;
}

uint64_t TokenFileSource::sample_start(uint64_t index, int64_t length) const {
  auto len = static_cast<uint64_t>(length);
  if (length < 1 || len > num_tokens_)
    throw InputError(
        cat(key_, ": token file ", path_, " holds ", num_tokens_, " tokens, fewer than one sample of ", len));
  uint64_t state = seed_ * 0x9E3779B97F4A7C15ULL + index;
  const uint64_t draw = splitmix64(state);
  if (share_.held_out == 0) return draw % (num_tokens_ - len + 1);
  const std::vector<uint64_t>& starts = window_starts(len);
  const uint64_t u = draw % starts.back();
  const auto span = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), u) - starts.begin());
  return spans_[span].first + (u - (span == 0 ? 0 : starts[span - 1]));
}

void TokenFileSource::sample(uint64_t index, int64_t length, int64_t* out) const {
  auto len = static_cast<uint64_t>(length);
  const uint64_t start = sample_start(index, length);
  // Read, not mapped: a file truncated under a running job gives a short read and a message,
  // where a mapping would fault the process with SIGBUS. The look at its size and time first
  // also refuses a file rewritten in place, whose tokens are no longer the run's.
  file_->check_unchanged();
  thread_local std::vector<unsigned char> bytes;
  bytes.resize(static_cast<size_t>(len * width_));
  file_->read_at(header_size_ + start * width_, bytes.data(), bytes.size());
  for (uint64_t t = 0; t < len; ++t) {
    const unsigned char* p = bytes.data() + t * width_;
    if (width_ == 2) {
      uint16_t v;
      std::memcpy(&v, p, sizeof(v));
      out[t] = v;
    } else {
      uint32_t v;
      std::memcpy(&v, p, sizeof(v));
      out[t] = v;
    }
    if (static_cast<uint64_t>(out[t]) >= vocab_)
      throw InputError(cat(key_, ": token file ", path_, ": token ", out[t], " at position ", start + t,
                           " is not below its vocabulary size ", vocab_));
  }
}

std::string TokenFileSource::describe() const {
  std::string text = cat("token file ", path_, ": ", num_tokens_, " tokens of ", width_ * 8, " bits, vocab ", vocab_);
  if (eos_)
    text += cat(", EOS id ", *eos_, ", ", num_documents_, " documents");
  else if (num_documents_ > 0)
    text += cat(", ", num_documents_, " documents");
  if (share_.held_out > 0) {
    size_t held = 0;
    for (bool b : held_out_) held += b ? 1 : 0;
    text += cat("; ", share_.validation ? "held-out share: " : "training share: ",
                share_.validation ? held : held_out_.size() - held, " of ", held_out_.size(), " blocks of ",
                share_.block_tokens, " tokens");
  }
  return text;
}

}  // namespace keel
