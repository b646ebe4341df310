// Fuzz target: a safetensors shard (header, dtypes, shapes, data offsets), read both ways the
// host reads one: MappedSafetensors (keel-ckpt verify and a resume: every tensor's bytes are
// hashed and its view copied) and read_safetensors (whole-file reads).
#include <xxhash.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.hpp"
#include "fuzz_support.hpp"

namespace {

// The keys the header names, if it is JSON at all (MappedSafetensors lists no keys).
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
  keel::fuzz::guarded("safetensors (MappedSafetensors)", [&] {
    keel::MappedSafetensors file(path);
    for (const std::string& key : header_keys(data, size)) {
      if (!file.has(key)) continue;
      auto [bytes, length] = file.bytes(key);
      volatile XXH64_hash_t sink = XXH64(bytes, length, 0);  // what verify does with them
      (void)sink;
      file.view(key).clone();  // what a resume does: copy the view out of the mapping
    }
  });
  keel::fuzz::guarded("safetensors (read_safetensors)", [&] { keel::read_safetensors(path); });
  return 0;
}
