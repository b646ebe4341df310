// A Hugging Face checkpoint folder opened for import: its config.json and its tensors, in
// model.safetensors or in the shards model.safetensors.index.json names. Everything is
// validated when the folder is opened, before a tensor is read: the index (plain file names,
// every shard present, every tensor it lists in the shard it names, none in two shards) and
// each shard's header (SafetensorsReader). The folder is untrusted: a name in it never becomes
// a path outside it. Every error is an InputError naming the file and the tensor.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/safetensors.hpp"

namespace keel {

class HfCheckpoint {
 public:
  /// Opens and validates the folder `dir`.
  explicit HfCheckpoint(const std::string& dir);

  /// The folder.
  const std::string& dir() const { return dir_; }
  /// config.json, parsed strictly.
  const nlohmann::json& config() const { return config_; }
  /// Whether a shard holds `name`.
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  /// The tensor `name` as stored, read from its shard now; recorded as read.
  at::Tensor read(const std::string& name);
  /// The file holding `name` ("model-00001-of-00002.safetensors").
  std::string file_of(const std::string& name) const;
  /// Tensors never read, sorted, each as "name (file)".
  std::vector<std::string> unread() const;
  /// Number of tensors.
  size_t size() const { return where_.size(); }
  /// Bytes of tensor data in all shards.
  uint64_t data_bytes() const { return data_bytes_; }

 private:
  std::string dir_;
  nlohmann::json config_;
  std::vector<std::unique_ptr<SafetensorsReader>> shards_;
  std::map<std::string, size_t> where_;  // tensor -> shard index
  std::set<std::string> read_;
  uint64_t data_bytes_ = 0;
};

}  // namespace keel
