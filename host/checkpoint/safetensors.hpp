// Safetensors files (the Hugging Face format: an 8-byte little-endian header length, a JSON
// header of dtype/shape/data_offsets per tensor plus "__metadata__", then raw data).
// Written by hand with nlohmann-json: Debian ships no C++ safetensors library and the format
// is a page long.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/input_file.hpp"

namespace keel {

/// The place of one tensor in a safetensors file.
struct SafetensorsLayout {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
};

/// The bytes before the data of a file holding `layout` in order (the 8-byte length and the
/// JSON header, padded to 8); `offsets` receives where each tensor's data starts in the data.
/// The shapes must be valid (non-negative, their byte counts not overflowing).
std::string safetensors_header(const std::vector<SafetensorsLayout>& layout,
                               const std::map<std::string, std::string>& metadata, std::vector<uint64_t>& offsets);

/// Writes `tensors` (name -> tensor, any device; stored contiguous little-endian) and
/// `metadata` to `path` atomically (a temporary file renamed into place); with `durable` the
/// data reach the disk (fsync) before the rename.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {}, bool durable = false);

/// The safetensors dtype code of a scalar type ("F32", "BF16", ...).
std::string safetensors_dtype(at::ScalarType type);
/// The scalar type of a safetensors dtype code; InputError naming `where` when unknown.
at::ScalarType scalar_type_of(const std::string& code, const std::string& where);

/// A safetensors file read tensor by tensor. The header is validated on open, before any
/// tensor is made: each tensor's byte count (shape x dtype, overflow-checked) equals its
/// data_offsets' span, which lies in the data section, and the tensors tile that section
/// exactly; a key appears once. Every error is an InputError naming the file and the key.
/// Tensors are read with pread, not mapped: a file truncated or replaced while it is read is a
/// named error, never SIGBUS. The file is reopened per read (a checkpoint of a thousand ranks'
/// shards holds no thousand descriptors), and each reopening must find the version first opened.
class SafetensorsReader {
 public:
  /// Opens `path` and validates its header; `source` names what pointed at it, in refusals.
  explicit SafetensorsReader(const std::string& path, const std::string& source = "checkpoint shard");

  /// Whether the file holds `key`.
  bool has(const std::string& key) const { return entries_.count(key) != 0; }
  /// A new CPU tensor holding `key`'s bytes, read from the file now.
  at::Tensor read(const std::string& key) const;
  /// The byte count of `key`'s data.
  uint64_t byte_size(const std::string& key) const;
  /// The file's path.
  const std::string& path() const { return path_; }
  /// The tensors' names, sorted.
  std::vector<std::string> keys() const;
  /// The dtype of `key`.
  at::ScalarType dtype(const std::string& key) const { return entry(key).dtype; }
  /// The shape of `key`.
  const std::vector<int64_t>& shape(const std::string& key) const { return entry(key).shape; }
  /// The header's "__metadata__".
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  struct Entry {
    at::ScalarType dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // absolute file offsets
  };
  const Entry& entry(const std::string& key) const;

  std::string path_, source_;
  FileIdentity identity_;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

/// A read safetensors file.
struct SafetensorsFile {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

/// Reads a whole safetensors file into CPU tensors, validated as SafetensorsReader does before
/// anything is allocated; throws InputError naming file and key.
SafetensorsFile read_safetensors(const std::string& path, const std::string& source = "safetensors file");

}  // namespace keel
