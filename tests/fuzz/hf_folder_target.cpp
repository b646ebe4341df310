// Fuzz target: a Hugging Face folder's config.json and model.safetensors.index.json (the input,
// the two texts separated by the first NUL; no NUL: config.json alone, with the one shard
// model.safetensors), opened as `keel-ckpt import --hf` opens a folder: the JSON read strictly,
// the index's names checked against two small valid shards, then every tensor it accepted read.
#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "checkpoint/safetensors.hpp"
#include "fuzz_support.hpp"
#include "interop/hf_checkpoint.hpp"

namespace {

// Two shards whose names an index may point at, and a single-file checkpoint: written once.
const std::string& folder() {
  static const std::string dir = [] {
    const std::string path = keel::fuzz::scratch_dir() + "/hf";
    std::filesystem::create_directories(path);
    const at::Tensor small = at::arange(6, at::kFloat).reshape({2, 3});
    keel::write_safetensors(path + "/model-00001-of-00002.safetensors",
                            {{"model.embed_tokens.weight", small}, {"model.norm.weight", at::ones({3})}});
    keel::write_safetensors(path + "/model-00002-of-00002.safetensors", {{"lm_head.weight", small.to(at::kBFloat16)}});
    return path;
  }();
  return dir;
}

void write_text(const std::string& path, const uint8_t* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = folder();
  const auto* nul = std::find(data, data + size, uint8_t{0});
  write_text(dir + "/config.json", data, static_cast<size_t>(nul - data));
  const std::string index = dir + "/model.safetensors.index.json";
  std::filesystem::remove(index);
  std::filesystem::remove(dir + "/model.safetensors");
  if (nul != data + size)
    write_text(index, nul + 1, static_cast<size_t>(data + size - nul - 1));
  else
    std::filesystem::copy_file(dir + "/model-00001-of-00002.safetensors", dir + "/model.safetensors");
  keel::fuzz::guarded("hf_folder", [&] {
    keel::HfCheckpoint hf(dir);
    for (const char* name : {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"})
      if (hf.has(name)) hf.read(name).sum().item<double>();
    hf.unread();
  });
  return 0;
}
