// Reads checkpoints written by CheckpointWriter, in any layout: a tensor asks for the region
// of an entry it holds (the whole tensor, or a slice along one dimension) and receives the
// overlapping parts of whichever shards hold it. Files are memory-mapped, so a rank reads only
// the shards it needs; each shard's xxh64 is verified the first time it is read. Every
// refusal is an InputError naming the checkpoint, the file and the key.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <set>
#include <string>

#include "checkpoint/manifest.hpp"
#include "checkpoint/safetensors.hpp"

namespace keel {

/// The folder `spec` names under `root`: "latest" (the folder `root`/latest points to, or the
/// newest complete step-<N>/ when that pointer is missing or broken), a step number
/// ("120" -> `root`/step-120) or a path. "latest" of a root without checkpoints gives "";
/// a missing step or path is an InputError.
std::string resolve_checkpoint(const std::string& root, const std::string& spec);

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
  /// The whole of entry `key` as a CPU tensor.
  at::Tensor read_whole(const std::string& key);
  /// Verifies the checksum of every shard of every entry; returns how many were checked.
  size_t verify_all();
  /// Verifies share `index` of `count` of the shards (every count-th one, in manifest order),
  /// so `count` ranks together check every byte once; returns the first problem, or "".
  std::string verify_share(int index, int count);
  /// Bytes copied into tensors so far.
  uint64_t bytes_read() const { return bytes_read_; }
  /// Bytes whose checksum was verified so far.
  uint64_t bytes_verified() const { return bytes_verified_; }

 private:
  const EntryRecord& entry(const std::string& key) const;
  const MappedSafetensors& file(const std::string& name);
  at::Tensor shard_view(const std::string& key, const ShardRecord& shard);

  std::string dir_;
  Manifest manifest_;
  std::map<std::string, std::unique_ptr<MappedSafetensors>> files_;
  std::set<std::pair<std::string, std::string>> verified_;  // (file, key)
  uint64_t bytes_read_ = 0, bytes_verified_ = 0;
};

}  // namespace keel
