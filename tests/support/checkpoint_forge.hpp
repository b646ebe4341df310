// Builds small, valid Keel checkpoints programmatically and damages them the ways a hostile or
// broken file would: a manifest rewritten consistently (its checksum recomputed, as a crafted
// download would be) or changed in place (a flipped byte), a shard file's header rewritten
// around its unchanged data.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/manifest.hpp"
#include "checkpoint/safetensors.hpp"
#include "test_support.hpp"

namespace keel::test {

/// The forged checkpoint's tensors: "model.w" F32 [4, 3] (rows 0-1 in rank-00000, rows 2-3 in
/// rank-00001) and "model.b" F32 [3] (whole, in rank-00000).
inline at::Tensor forged_w() { return at::arange(12, at::kFloat).reshape({4, 3}); }
inline at::Tensor forged_b() { return at::arange(3, at::kFloat) + 100; }

/// Writes `manifest` to `dir`/manifest.json (with its checksum, as the writer does).
inline void write_manifest(const std::string& dir, const Manifest& manifest) {
  std::ofstream(std::filesystem::path(dir) / "manifest.json", std::ios::binary | std::ios::trunc)
      << manifest_json(manifest);
}

/// Writes a valid two-file checkpoint to `root`/step-`step`/ and points `root`/latest at it;
/// returns its manifest (a test changes it and writes it back with write_manifest).
inline Manifest forge_checkpoint(const std::string& root, int64_t step = 1) {
  const std::string dir = root + "/step-" + std::to_string(step);
  std::filesystem::create_directories(dir);
  const at::Tensor w = forged_w(), b = forged_b();
  const at::Tensor w0 = w.narrow(0, 0, 2).contiguous(), w1 = w.narrow(0, 2, 2).contiguous();
  write_safetensors(dir + "/rank-00000.safetensors", {{"model.b", b}, {"model.w", w0}},
                    {{"format", "keel-checkpoint-shard"}});
  write_safetensors(dir + "/rank-00001.safetensors", {{"model.w", w1}}, {{"format", "keel-checkpoint-shard"}});
  auto hash = [](const at::Tensor& t) { return xxh64_hex(t.data_ptr(), t.nbytes()); };
  Manifest m;
  m.step = step;
  m.run_id = "forged";
  m.data_position = 8;
  m.tokens_seen = 128;
  m.lr = 1e-4;
  m.pp = 1;
  m.dp = 2;
  m.ep = 1;
  m.model_plugin = m.model_component = "llama3";
  m.clipper_plugin = m.clipper_component = "norm_clipper";
  m.config = "[model]\nplugin = \"llama3\"\n";
  m.entries["model.w"] = {
      "F32",
      {4, 3},
      {{"rank-00000.safetensors", {0, 0}, {2, 3}, hash(w0)}, {"rank-00001.safetensors", {2, 0}, {2, 3}, hash(w1)}}};
  m.entries["model.b"] = {"F32", {3}, {{"rank-00000.safetensors", {0}, {3}, hash(b)}}};
  write_manifest(dir, m);
  write_file(root + "/latest", "step-" + std::to_string(step) + "\n");
  return m;
}

/// Replaces the first occurrence of `from` in `path` by `to` (same length: a changed byte).
inline void replace_in_file(const std::string& path, const std::string& from, const std::string& to) {
  std::string text = read_file(path);
  const size_t at = text.find(from);
  if (at == std::string::npos) throw std::runtime_error("replace_in_file: '" + from + "' not in " + path);
  text.replace(at, from.size(), to);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

/// Rewrites the header of the safetensors file `path` with `edit` applied and the data bytes
/// unchanged. The header is padded to a size fixed before `edit` runs, which receives the
/// offset where the data will start (to craft offsets relative to it).
inline void edit_safetensors_header(const std::string& path,
                                    const std::function<void(nlohmann::ordered_json&, uint64_t)>& edit) {
  std::string bytes = read_file(path);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | static_cast<unsigned char>(bytes[i]);
  nlohmann::ordered_json header = nlohmann::ordered_json::parse(bytes.substr(8, header_size));
  const std::string data = bytes.substr(8 + header_size);
  const uint64_t padded = (header_size + 256 + 4095) / 4096 * 4096;  // room for what an edit adds
  edit(header, 8 + padded);
  std::string text = header.dump();
  if (text.size() > padded) throw std::runtime_error("edit_safetensors_header: the edit grew the header too much");
  text.resize(padded, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((padded >> (8 * i)) & 0xff);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << out << text << data;
}

/// A test with a freshly forged checkpoint at root()/step-1 and the tools to craft it.
class ForgedCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override { manifest_ = forge_checkpoint(root()); }
  std::string root() const { return dir_.path() + "/ckpt"; }
  std::string step() const { return root() + "/step-1"; }
  std::string shard(int rank) const {
    return step() + (rank == 0 ? "/rank-00000.safetensors" : "/rank-00001.safetensors");
  }
  /// Writes the manifest back after `edit` (with a fresh checksum: a consistent, crafted file).
  template <typename Edit>
  void craft(Edit&& edit) {
    Manifest m = manifest_;
    edit(m);
    write_manifest(step(), m);
  }

  TempDir dir_;
  Manifest manifest_;
};

}  // namespace keel::test
