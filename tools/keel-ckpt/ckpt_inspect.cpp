// keel-ckpt ls and verify.
#include <cstdio>
#include <filesystem>
#include <set>

#include "ckpt_commands.hpp"
#include "common/error.hpp"
#include "common/text.hpp"

namespace keel::ckpt {

namespace fs = std::filesystem;

namespace {

std::string shape_text(const std::vector<int64_t>& shape) { return cat(at::IntArrayRef(shape)); }

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

}  // namespace

std::string checkpoint_dir(const std::string& path) {
  if (fs::exists(fs::path(path) / "manifest.json")) return path;
  if (!fs::is_directory(path)) throw InputError(cat(path, ": no such checkpoint folder"));
  std::string latest = resolve_checkpoint(path, "latest");
  if (latest.empty())
    throw InputError(cat(path, ": neither a checkpoint (no manifest.json) nor a folder of complete step-<N>/ ones"));
  return latest;
}

int list(const std::string& path) {
  CheckpointReader reader(checkpoint_dir(path));
  const Manifest& m = reader.manifest();
  std::set<std::string> files;
  for (const auto& [key, e] : m.entries)
    for (const ShardRecord& s : e.shards) files.insert(s.file);
  std::printf("checkpoint  %s\n", reader.dir().c_str());
  std::printf("step        %ld (tokens seen %ld, next lr %.6g)\n", static_cast<long>(m.step),
              static_cast<long>(m.tokens_seen), m.lr);
  std::printf("data        position %lu (global samples consumed)\n", static_cast<unsigned long>(m.data_position));
  std::printf("mesh        pp %d x dp %d, ep %d (%d rank%s)\n", m.pp, m.dp, m.ep, m.pp * m.dp,
              m.pp * m.dp == 1 ? "" : "s");
  std::printf("model       %s (plugin %s)\n", m.model_component.c_str(), m.model_plugin.c_str());
  std::printf("clipper     %s (plugin %s)\n", m.clipper_component.c_str(), m.clipper_plugin.c_str());
  if (m.validation) {
    // val_loss first, then the model's figures in name order.
    std::string figures = format("val_loss %.4f", m.validation->metrics.at("val_loss"));
    for (const auto& [name, value] : m.validation->metrics)
      if (name != "val_loss") figures += format(", %s %.4f", name.c_str(), value);
    std::printf("validation  %s (after step %ld%s)\n", figures.c_str(), static_cast<long>(m.validation->step),
                m.validation->step == m.step ? "" : ", before this checkpoint");
  }
  std::printf("entries     %zu in %zu file%s\n", m.entries.size(), files.size(), files.size() == 1 ? "" : "s");
  for (const auto& [key, e] : m.entries) {
    std::vector<std::string> shards;
    for (const ShardRecord& s : e.shards) shards.push_back(cat(s.file, " @ ", shape_text(s.offsets)));
    std::printf("%s  %s %s  %zu shard%s: %s\n", key.c_str(), e.dtype.c_str(), shape_text(e.shape).c_str(),
                e.shards.size(), e.shards.size() == 1 ? "" : "s", join(shards, ", ").c_str());
  }
  return 0;
}

int verify(const std::string& path) {
  CheckpointReader reader(checkpoint_dir(path));  // the manifest, validated whole
  const VerifyReport report = reader.verify();
  if (!report.ok()) {
    for (const std::string& line : split_lines(report.summary()))
      std::fprintf(stderr, "keel-ckpt verify: %s\n", line.c_str());
    // Bytes that fail their checksum are damage (1); anything else is a malformed checkpoint (2).
    return report.malformed.empty() ? 1 : 2;
  }
  std::printf("ok: %zu shards of %zu entries verified (%s)\n", report.shards, reader.manifest().entries.size(),
              reader.dir().c_str());
  return 0;
}

}  // namespace keel::ckpt
