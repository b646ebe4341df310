#include "data/token_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "common/error.hpp"
#include "common/text.hpp"

namespace keel {

namespace {
constexpr char kMagic[8] = {'K', 'E', 'E', 'L', 'T', 'O', 'K', '1'};
constexpr size_t kHeaderSize = 32;

struct Header {
  char magic[8];
  uint32_t width;
  uint32_t reserved;
  uint64_t num_tokens;
  uint64_t vocab_size;
};
static_assert(sizeof(Header) == kHeaderSize);
}  // namespace

void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens, uint64_t vocab_size) {
  Header header{};
  std::memcpy(header.magic, kMagic, sizeof(kMagic));
  header.width = vocab_size <= 65536 ? 2 : 4;
  header.num_tokens = tokens.size();
  header.vocab_size = vocab_size;
  std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out) throw InputError(cat("cannot write token file ", partial));
    out.write(reinterpret_cast<const char*>(&header), sizeof(header));
    for (uint32_t token : tokens) {
      if (token >= vocab_size) throw InputError(cat("token ", token, " is not below the vocabulary size ", vocab_size));
      if (header.width == 2) {
        auto narrow = static_cast<uint16_t>(token);
        out.write(reinterpret_cast<const char*>(&narrow), sizeof(narrow));
      } else {
        out.write(reinterpret_cast<const char*>(&token), sizeof(token));
      }
    }
    if (!out) throw InputError(cat("cannot write token file ", partial));
  }
  std::filesystem::rename(partial, path);
}

TokenFileSource::TokenFileSource(const std::string& path, uint64_t seed) : path_(path), seed_(seed) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw InputError(cat("data.path: cannot open token file ", path, ": ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < 0) {
    const int err = errno;
    ::close(fd);
    throw InputError(cat("data.path: cannot stat token file ", path, ": ", std::strerror(err)));
  }
  map_size_ = static_cast<size_t>(st.st_size);
  if (map_size_ < kHeaderSize) {
    ::close(fd);
    throw InputError(cat("token file ", path, " is ", map_size_, " bytes, smaller than its 32-byte header"));
  }
  map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw InputError(cat("cannot memory-map token file ", path, ": ", std::strerror(errno)));
  }
  Header header{};
  std::memcpy(&header, map_, sizeof(header));
  auto fail = [&](const std::string& why) {
    ::munmap(map_, map_size_);
    map_ = nullptr;
    throw InputError(cat("token file ", path, ": ", why));
  };
  if (std::memcmp(header.magic, kMagic, sizeof(kMagic)) != 0)
    fail("bad magic (not a KEELTOK1 file; build one with keel-data)");
  if (header.width != 2 && header.width != 4) fail(cat("bytes per token is ", header.width, ", expected 2 or 4"));
  if (header.reserved != 0) fail(cat("reserved header field is ", header.reserved, ", expected 0"));
  // The size check in arithmetic that cannot wrap: a header claiming 2^63 tokens must not
  // pass as a small file.
  uint64_t payload = 0, expected = 0;
  if (__builtin_mul_overflow(header.num_tokens, uint64_t{header.width}, &payload) ||
      __builtin_add_overflow(payload, uint64_t{kHeaderSize}, &expected) || expected != map_size_)
    fail(cat("header promises ", header.num_tokens, " tokens of ", header.width, " bytes but the file has ",
             map_size_ - kHeaderSize, " bytes after its header"));
  if (header.vocab_size == 0) fail("vocabulary size is 0");
  // Every token of the width must be able to be below the vocabulary, and the vocabulary must
  // be representable as a token id of the model (int64).
  const uint64_t max_vocab = header.width == 2 ? (uint64_t{1} << 16) : (uint64_t{1} << 32);
  if (header.vocab_size > max_vocab)
    fail(cat("vocabulary size ", header.vocab_size, " does not fit ", header.width, "-byte tokens (at most ", max_vocab,
             ")"));
  width_ = header.width;
  num_tokens_ = header.num_tokens;
  vocab_ = header.vocab_size;
  tokens_ = static_cast<const unsigned char*>(map_) + kHeaderSize;
}

TokenFileSource::~TokenFileSource() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

void TokenFileSource::sample(uint64_t index, int64_t length, int64_t* out) const {
  auto len = static_cast<uint64_t>(length);
  if (len > num_tokens_)
    throw InputError(cat("token file ", path_, " holds ", num_tokens_, " tokens, fewer than one sample of ", len));
  uint64_t state = seed_ * 0x9E3779B97F4A7C15ULL + index;
  uint64_t start = splitmix64(state) % (num_tokens_ - len + 1);
  for (uint64_t t = 0; t < len; ++t) {
    const unsigned char* p = tokens_ + (start + t) * width_;
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
      throw InputError(cat("token file ", path_, ": token ", out[t], " at position ", start + t,
                           " is not below its vocabulary size ", vocab_));
  }
}

std::string TokenFileSource::describe() const {
  return cat("token file ", path_, ": ", num_tokens_, " tokens of ", width_ * 8, " bits, vocab ", vocab_);
}

}  // namespace keel
