// Reads checkpoints written by CheckpointWriter, in any layout: a tensor asks for the region
// of an entry it holds (the whole tensor, or a slice along one dimension) and receives the
// overlapping parts of whichever shards hold it. A rank reads only the shard tensors it needs
// (with pread, through SafetensorsReader); each shard's xxh64 is verified the first time it is read. A checkpoint
// is untrusted input: the manifest is validated whole on open (read_manifest), each file's
// header when the file is first opened, and a file's tensor must have the dtype and shape the
// manifest records; a tensor in a file that the manifest does not name is refused (a file
// holds exactly what its manifest says). Every refusal is an InputError naming the checkpoint,
// the file and the key.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/manifest.hpp"
#include "checkpoint/safetensors.hpp"
#include "common/error.hpp"

namespace keel {

/// The folder `spec` names under `root`: "latest" (the folder named by the pointer file
/// `root`/latest, or the newest complete step-<N>/ when there is no pointer), a step number
/// ("120" -> `root`/step-120) or a path. "latest" of a root without checkpoints gives "".
/// A pointer that is not exactly "step-<N>" (a trailing newline allowed), or that names no
/// complete checkpoint, is an InputError naming it; so is a missing step or path.
std::string resolve_checkpoint(const std::string& root, const std::string& spec);

/// A shard whose bytes differ from the xxh64 its manifest records: the structure is sound, the
/// data are damaged.
class ChecksumMismatch : public InputError {
 public:
  using InputError::InputError;
};

/// What a verification found: every problem, each naming the file and key.
struct VerifyReport {
  size_t shards = 0;                   ///< shards checked
  std::vector<std::string> damaged;    ///< checksum mismatches
  std::vector<std::string> malformed;  ///< anything else: a missing or malformed file, a mismatch with the manifest
  bool ok() const { return damaged.empty() && malformed.empty(); }
  /// Every problem, one per line (at most 20, then how many more).
  std::string summary() const;
};

class CheckpointReader {
 public:
  /// Opens the checkpoint folder `dir` (reads and checks its manifest).
  explicit CheckpointReader(std::string dir);

  const Manifest& manifest() const { return manifest_; }
  const std::string& dir() const { return dir_; }
  /// Whether the checkpoint has entry `key`.
  bool has(const std::string& key) const { return manifest_.entries.count(key) != 0; }

  /// Fills `target` (any device) with its region of entry `key`: the whole tensor when
  /// `shard_dim` < 0, else global[shard_offset : shard_offset + size] along `shard_dim` of a
  /// global dimension of `global_dim_size`. The dtype and global shape must match.
  void read(const std::string& key, const at::Tensor& target, int32_t shard_dim = -1, int64_t shard_offset = 0,
            int64_t global_dim_size = 0);
  /// The whole of entry `key` as a CPU tensor; each shard read and its checksum verified once.
  at::Tensor read_whole(const std::string& key);
  /// Checks every shard of entry `key` — its file's header, its dtype and shape against the
  /// manifest, its checksum — without copying it; throws InputError naming file and key.
  void check_entry(const std::string& key);
  /// Verifies share `index` of `count` of the shards (every count-th one, in manifest order):
  /// each file's header, the tensor's dtype and shape, its checksum. Never throws: whatever
  /// goes wrong (LibTorch, memory, the file system included) is reported.
  VerifyReport verify(int index = 0, int count = 1);
  /// Verifies every shard of every entry; returns how many were checked. Throws an InputError
  /// listing every problem (a ChecksumMismatch when they all are checksum mismatches).
  size_t verify_all();
  /// verify(index, count) as one message ("" when sound), so `count` ranks together check
  /// every byte once and exchange what they found. Never throws.
  std::string verify_share(int index, int count);
  /// Bytes copied into tensors so far.
  uint64_t bytes_read() const { return bytes_read_; }
  /// Bytes whose checksum was verified so far.
  uint64_t bytes_verified() const { return bytes_verified_; }
  /// Bytes read from the shard files so far.
  uint64_t bytes_loaded() const { return bytes_loaded_; }

 private:
  const EntryRecord& entry(const std::string& key) const;
  const SafetensorsReader& file(const std::string& name);
  // The file holding `shard`, its entry for `key` checked against the manifest (no data read).
  const SafetensorsReader& checked_file(const std::string& key, const EntryRecord& entry, const ShardRecord& shard);
  at::Tensor shard_view(const std::string& key, const EntryRecord& entry, const ShardRecord& shard);

  std::string dir_;
  Manifest manifest_;
  std::map<std::string, std::set<std::string>> file_keys_;  // file -> the keys the manifest puts in it
  std::map<std::string, std::unique_ptr<SafetensorsReader>> files_;
  std::set<std::pair<std::string, std::string>> verified_;  // (file, key)
  uint64_t bytes_read_ = 0, bytes_verified_ = 0, bytes_loaded_ = 0;
};

}  // namespace keel
