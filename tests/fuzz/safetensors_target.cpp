// Fuzz target: a safetensors shard (header, dtypes, shapes, data offsets), read both ways the
// host reads one: SafetensorsReader (keel-ckpt verify and a resume: every tensor read and its
// bytes hashed) and read_safetensors (whole-file reads).
#include <xxhash.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.hpp"
#include "fuzz_support.hpp"

namespace {

// The keys the header names, if it is JSON at all (SafetensorsReader lists only accepted ones).
std::vector<std::string> header_keys(const uint8_t* data, size_t size) {
  std::vector<std::string> keys;
  uint64_t header_size = 0;
  if (size < 8) return keys;
  std::memcpy(&header_size, data, 8);
  if (header_size > size - 8) return keys;
  nlohmann::json header = nlohmann::json::parse(data + 8, data + 8 + header_size, nullptr, false);
  if (!header.is_object()) return keys;
  for (const auto& item : header.items()) keys.push_back(item.key());
  return keys;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = keel::fuzz::write_file("shard.safetensors", data, size);
  keel::fuzz::guarded("safetensors (SafetensorsReader)", [&] {
    keel::SafetensorsReader file(path);
    for (const std::string& key : header_keys(data, size)) {
      if (!file.has(key)) continue;
      const at::Tensor t = file.read(key);
      // What verify does with the bytes.
      volatile XXH64_hash_t sink = XXH64(t.data_ptr(), static_cast<size_t>(file.byte_size(key)), 0);
      (void)sink;
    }
  });
  keel::fuzz::guarded("safetensors (read_safetensors)", [&] { keel::read_safetensors(path); });
  return 0;
}
