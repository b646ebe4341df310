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

namespace keel {

/// Writes `tensors` (name -> tensor, any device; stored contiguous little-endian) and
/// `metadata` to `path` atomically (a temporary file renamed into place).
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// A read safetensors file.
struct SafetensorsFile {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

/// Reads a whole safetensors file into CPU tensors; throws InputError naming file and key.
SafetensorsFile read_safetensors(const std::string& path);

}  // namespace keel
