// Fuzz target: a checkpoint's manifest.json, read as every tool reads a checkpoint: the
// manifest and the config text it carries (keel-ckpt export parses it), keel-ckpt verify
// (verify_all), diff and export (read_whole of every entry), and a resume (reads into the
// tensors of a fixed model, one of them sharded along dimension 0). The checkpoint folder
// also holds two small valid shards (written once per process, see checkpoint_dir()), and the
// seed manifests name them, so mutations get past the file checks into checksums, shard
// shapes, tiling and the copies.
#include <ATen/ATen.h>

#include <filesystem>

#include "checkpoint/checkpoint_reader.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/safetensors.hpp"
#include "config/config_tree.hpp"
#include "fuzz_support.hpp"

namespace {

// a.safetensors: model.w rows 0-1 of a 4x3 F32 arange, and model.b (I64 0..4);
// b.safetensors: model.w rows 2-3.
const std::string& checkpoint_dir() {
  static const std::string dir = [] {
    std::string path = keel::fuzz::scratch_dir() + "/checkpoint";
    std::filesystem::create_directories(path);
    at::Tensor w = at::arange(12, at::kFloat).reshape({4, 3});
    keel::write_safetensors(path + "/a.safetensors", {{"model.w", w.narrow(0, 0, 2)}, {"model.b", at::arange(5)}});
    keel::write_safetensors(path + "/b.safetensors", {{"model.w", w.narrow(0, 2, 2)}});
    return path;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = checkpoint_dir();
  keel::fuzz::write_file("checkpoint/manifest.json", data, size);
  keel::fuzz::guarded("manifest (read_manifest)", [&] {
    // keel-ckpt export parses the config the manifest carries.
    keel::ConfigTree::from_string(keel::read_manifest(dir).config, dir + "/manifest.json: config");
  });
  keel::fuzz::guarded("manifest (verify)", [&] {
    keel::CheckpointReader reader(dir);
    reader.verify_share(0, 1);
    reader.verify_all();
  });
  keel::fuzz::guarded("manifest (diff, export)", [&] {
    keel::CheckpointReader reader(dir);
    for (const auto& [key, entry] : reader.manifest().entries) reader.read_whole(key);
  });
  keel::fuzz::guarded("manifest (resume)", [&] {
    keel::CheckpointReader reader(dir);
    if (reader.has("model.w")) reader.read("model.w", at::empty({2, 3}), /*shard_dim=*/0, /*shard_offset=*/2, 4);
    if (reader.has("model.b")) reader.read("model.b", at::empty({5}, at::kLong));
  });
  return 0;
}
