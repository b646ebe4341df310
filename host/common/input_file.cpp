#include "common/input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.hpp"
#include "common/text.hpp"

namespace keel {

namespace fs = std::filesystem;

namespace {

std::string kind_of(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

int64_t mtime_ns(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + static_cast<int64_t>(st.st_mtim.tv_nsec);
}

}  // namespace

std::string file_kind(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return cat("not there (", std::strerror(errno), ")");
  return kind_of(st.st_mode);
}

bool is_regular_input(const fs::path& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

InputFile::InputFile(const fs::path& path, std::string source) : path_(path), source_(std::move(source)) {
  auto refuse = [&](const std::string& why) { throw InputError(cat(source_, ": ", path_.string(), ": ", why)); };
  // Looked at before the open, so that no device is ever opened (opening some has effects);
  // looked at again through the descriptor, so that nothing swapped in between gets through.
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) refuse(cat("cannot open: ", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) refuse(cat("is ", kind_of(st.st_mode), ", expected a regular file"));
  // O_NONBLOCK: a FIFO put in the file's place after the look above opens at once instead of
  // waiting for a writer, and is then refused by fstat.
  fd_ = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd_ < 0) refuse(cat("cannot open: ", std::strerror(errno)));
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 0) {
    const std::string kind = kind_of(st.st_mode);
    ::close(fd_);
    fd_ = -1;
    refuse(cat("is ", kind, ", expected a regular file"));
  }
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
  size_ = static_cast<uint64_t>(st.st_size);
  mtime_ns_ = mtime_ns(st);
  identity_ = FileIdentity{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), size_, mtime_ns_};
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::read_at(uint64_t offset, void* out, size_t n) const {
  auto* bytes = static_cast<char*>(out);
  size_t done = 0;
  while (done < n) {
    uint64_t at = 0;
    if (__builtin_add_overflow(offset, uint64_t{done}, &at) || at > static_cast<uint64_t>(INT64_MAX))
      throw InputError(cat(path_.string(), ": read at offset ", offset, " + ", done, " overflows"));
    const ssize_t got = ::pread(fd_, bytes + done, n - done, static_cast<off_t>(at));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw InputError(cat(path_.string(), ": cannot read at byte ", at, ": ", std::strerror(errno)));
    if (got == 0)
      throw InputError(cat(path_.string(), ": ends at byte ", at, ", before the ", n, " bytes at byte ", offset,
                           " that ", source_, " needs (", size_, " bytes when opened: it shrank since)"));
    done += static_cast<size_t>(got);
  }
}

std::string InputFile::read_all(uint64_t max_bytes) const {
  if (size_ > max_bytes)
    throw InputError(
        cat(source_, ": ", path_.string(), ": ", size_, " bytes, more than it may hold (", max_bytes, ")"));
  std::string text(static_cast<size_t>(size_), '\0');
  read_at(0, text.data(), text.size());
  return text;
}

void InputFile::check_unchanged() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0)
    throw InputError(cat(source_, ": ", path_.string(), ": cannot stat: ", std::strerror(errno)));
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size != size_ || mtime_ns(st) != mtime_ns_)
    throw InputError(
        cat(source_, ": ", path_.string(), " changed while the job read it (",
            size != size_ ? cat(size_, " bytes when opened, ", size, " now") : std::string("modified in place"),
            "): stopping rather than training on other data"));
}

void InputFile::require_identity(const FileIdentity& first) const {
  if (identity_ == first) return;
  const std::string what =
      identity_.device != first.device || identity_.inode != first.inode ? std::string("another file is in its place")
      : identity_.size != first.size ? cat(first.size, " bytes when first opened, ", identity_.size, " now")
                                     : std::string("modified in place");
  throw InputError(cat(source_, ": ", path_.string(), " changed while it was read (", what,
                       "): stopping rather than reading a mixture of two versions"));
}

std::string read_input_file(const fs::path& path, const std::string& source, uint64_t max_bytes) {
  return InputFile(path, source).read_all(max_bytes);
}

void require_input_folder(const fs::path& path, const std::string& source) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw InputError(cat(source, ": ", path.string(), ": ", std::strerror(errno), " (expected a folder)"));
  if (!S_ISDIR(st.st_mode))
    throw InputError(cat(source, ": ", path.string(), " is ", kind_of(st.st_mode), ", expected a folder"));
}

}  // namespace keel
