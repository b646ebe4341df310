// Files Keel reads from outside (configs, token files, checkpoints, imports, tokenizers). A FIFO,
// socket or device in a file's place must not hang or fault a tool, and a folder must not pass
// for a file: every reader opens its input here, without blocking, and only a regular file gets
// through. Each refusal names the file and the key or record that pointed at it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace keel {

/// A regular file opened for reading; the size and modification time are those at the open.
/// What tells one version of a file from another: a file reopened with another identity was
/// replaced, truncated or rewritten in between.
struct FileIdentity {
  uint64_t device = 0, inode = 0, size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileIdentity&) const = default;
};

class InputFile {
 public:
  /// Opens `path`; throws InputError naming `source` (the key or record that named the file)
  /// and `path` unless it is a regular file that can be read.
  InputFile(const std::filesystem::path& path, std::string source);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  /// The file's size when it was opened.
  uint64_t size() const { return size_; }
  /// The file's name as given.
  const std::filesystem::path& path() const { return path_; }
  /// Reads exactly `n` bytes at `offset`; throws InputError naming the file when fewer arrive
  /// (it shrank since it was opened) or the read fails.
  void read_at(uint64_t offset, void* out, size_t n) const;
  /// The whole file as text; throws InputError when it holds more than `max_bytes`.
  std::string read_all(uint64_t max_bytes) const;
  /// Throws InputError naming the file when its size or modification time is no longer what
  /// it was at the open (it was truncated, rewritten or replaced in place).
  void check_unchanged() const;
  /// The file's identity when it was opened.
  FileIdentity identity() const { return identity_; }
  /// Throws InputError naming the file unless it is, as opened now, the version `first` records
  /// (for a reader that reopens a file per read rather than holding a descriptor open).
  void require_identity(const FileIdentity& first) const;

 private:
  std::filesystem::path path_;
  std::string source_;
  int fd_ = -1;
  uint64_t size_ = 0;
  int64_t mtime_ns_ = 0;
  FileIdentity identity_;
};

/// Reads the whole regular file at `path`, at most `max_bytes`; throws InputError naming
/// `source` and the file otherwise.
std::string read_input_file(const std::filesystem::path& path, const std::string& source, uint64_t max_bytes);

/// Whether `path` names a regular file (following links), without opening it.
bool is_regular_input(const std::filesystem::path& path);

/// Throws InputError naming `source` unless `path` is a folder.
void require_input_folder(const std::filesystem::path& path, const std::string& source);

/// "a FIFO", "a folder", "a character device", ...: what the thing at `path` is, for messages.
std::string file_kind(const std::filesystem::path& path);

}  // namespace keel
