// A checkpoint's manifest.json: what the checkpoint holds and where. Every entry (a logical
// tensor under its canonical key: "model.<fqn>", "optim.exp_avg.<fqn>", "clipper.<name>.<x>")
// records its dtype, global shape and shards; each shard names its file, its place in the
// global tensor and the xxh64 of its bytes. The rest is the training state that is not a
// tensor (step, data position) and the provenance (mesh, plugins, resolved config).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace keel {

/// One shard of an entry: `shape` elements at `offsets` of the global tensor, in `file`.
struct ShardRecord {
  std::string file;
  std::vector<int64_t> offsets, shape;
  std::string xxh64;  ///< 16 hex digits of the shard's bytes
};

/// One logical tensor.
struct EntryRecord {
  std::string dtype;  ///< safetensors code: "F32", "I64", ...
  std::vector<int64_t> shape;
  std::vector<ShardRecord> shards;
};

/// The figures of the last evaluation before a save ([validation]): "val_loss" and the model's
/// "val_<name>" figures, after step `step` (at most the checkpoint's step).
struct ValidationRecord {
  int64_t step = 0;
  std::map<std::string, double> metrics;
};

struct Manifest {
  /// 2: the manifest carries its own checksum. Version 1 (no checksum) is still read.
  static constexpr int kVersion = 2;
  int64_t step = 0;
  std::string run_id;          ///< the run that saved it (a fresh id per run started without `load`)
  uint64_t data_position = 0;  ///< global samples consumed (the stream is split over dp)
  int64_t tokens_seen = 0;
  double lr = 0;  ///< the learning rate of the next step
  int pp = 1, dp = 1, ep = 1;
  std::string model_plugin, model_component, clipper_plugin, clipper_component;
  std::string config;  ///< the resolved TOML of the run that saved it
  std::map<std::string, EntryRecord> entries;
  std::optional<ValidationRecord> validation;  ///< absent when the run had not evaluated yet
};

/// The manifest as JSON text, with its checksum: the xxh64 of its canonical body (the JSON
/// without "checksum", keys sorted, no whitespace) in the field "checksum".
std::string manifest_json(const Manifest& manifest);
/// Reads `dir`/manifest.json; an InputError names the file and what is wrong.
Manifest read_manifest(const std::string& dir);
/// Parses and validates manifest text (`where` names it in errors): the checksum, every field's
/// type and range, plugin and component names [a-z0-9_]+, and each entry's shards — files named
/// rank-NNNNN.safetensors, inside the global shape, tiling it exactly. A version-1 manifest
/// (no checksum) is accepted with a warning; anything else without a checksum is refused.
Manifest parse_manifest(const std::string& text, const std::string& where);

/// The xxh64 of `size` bytes as 16 hex digits.
std::string xxh64_hex(const void* data, size_t size);

}  // namespace keel
