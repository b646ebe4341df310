#include "checkpoint/checkpoint_reader.hpp"

#include <c10/core/GradMode.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "common/error.hpp"
#include "common/text.hpp"

namespace keel {

namespace fs = std::filesystem;

namespace {

bool complete(const fs::path& dir) { return fs::is_directory(dir) && fs::exists(dir / "manifest.json"); }

std::string shape_text(const std::vector<int64_t>& shape) { return cat(at::IntArrayRef(shape)); }

}  // namespace

std::string resolve_checkpoint(const std::string& root, const std::string& spec) {
  static const std::regex number("(step-)?(\\d+)"), step_name("step-(\\d+)");
  if (spec == "latest") {
    std::ifstream pointer(fs::path(root) / "latest");
    std::string name;
    if (pointer >> name && complete(fs::path(root) / name)) return (fs::path(root) / name).string();
    int64_t newest = -1;
    std::error_code ec;
    for (const auto& item : fs::directory_iterator(root, ec)) {
      std::smatch m;
      std::string base = item.path().filename().string();
      if (std::regex_match(base, m, step_name) && complete(item.path()))
        newest = std::max<int64_t>(newest, std::stoll(m[1]));
    }
    return newest < 0 ? std::string() : (fs::path(root) / ("step-" + std::to_string(newest))).string();
  }
  std::smatch m;
  fs::path dir = std::regex_match(spec, m, number) ? fs::path(root) / ("step-" + m[2].str()) : fs::path(spec);
  if (!complete(dir))
    throw InputError(cat("checkpoint.load: ", dir.string(),
                         fs::exists(dir) ? " is not a complete checkpoint (no manifest.json)" : " does not exist"));
  return dir.string();
}

CheckpointReader::CheckpointReader(std::string dir) : dir_(std::move(dir)), manifest_(read_manifest(dir_)) {}

const EntryRecord& CheckpointReader::entry(const std::string& key) const {
  auto it = manifest_.entries.find(key);
  if (it == manifest_.entries.end()) throw InputError(cat("checkpoint ", dir_, ": no entry '", key, "'"));
  return it->second;
}

const MappedSafetensors& CheckpointReader::file(const std::string& name) {
  auto& slot = files_[name];
  if (!slot) {
    if (name.find('/') != std::string::npos) throw InputError(cat("checkpoint ", dir_, ": bad file name '", name, "'"));
    slot = std::make_unique<MappedSafetensors>((fs::path(dir_) / name).string());
  }
  return *slot;
}

at::Tensor CheckpointReader::shard_view(const std::string& key, const ShardRecord& shard) {
  const MappedSafetensors& f = file(shard.file);
  const std::string where = cat("checkpoint ", dir_, ", file ", shard.file, ", key '", key, "'");
  if (!f.has(key)) throw InputError(cat(where, ": the file lacks it"));
  at::Tensor view = f.view(key);
  if (view.sizes().vec() != shard.shape)
    throw InputError(
        cat(where, ": shape ", view.sizes(), " in the file, ", shape_text(shard.shape), " in the manifest"));
  if (verified_.insert({shard.file, key}).second) {
    auto [data, size] = f.bytes(key);
    std::string found = xxh64_hex(data, size);
    bytes_verified_ += size;
    if (found != shard.xxh64) {
      verified_.erase({shard.file, key});
      throw InputError(cat(where, ": damaged (xxh64 ", found, ", the manifest records ", shard.xxh64, ")"));
    }
  }
  return view;
}

void CheckpointReader::read(const std::string& key, const at::Tensor& target, int32_t shard_dim, int64_t shard_offset,
                            int64_t global_dim_size) {
  const EntryRecord& e = entry(key);
  std::vector<int64_t> global = target.sizes().vec(), lo(global.size(), 0);
  if (shard_dim >= 0) {
    global[static_cast<size_t>(shard_dim)] = global_dim_size;
    lo[static_cast<size_t>(shard_dim)] = shard_offset;
  }
  const std::string where = cat("checkpoint ", dir_, ", key '", key, "'");
  if (e.shape != global)
    throw InputError(cat(where, ": global shape ", shape_text(e.shape), " in the checkpoint, ", shape_text(global),
                         " in this model"));
  if (scalar_type_of(e.dtype, where) != target.scalar_type())
    throw InputError(cat(where, ": dtype ", e.dtype, " in the checkpoint, ", safetensors_dtype(target.scalar_type()),
                         " in this model"));
  c10::NoGradGuard no_grad;
  at::Tensor destination = target.detach();
  int64_t copied = 0;
  for (const ShardRecord& s : e.shards) {
    // The intersection of this shard's box with the target's box, per dimension.
    at::Tensor src, dst;
    bool empty = false;
    std::vector<std::pair<int64_t, int64_t>> spans;
    for (size_t d = 0; d < global.size(); ++d) {
      int64_t begin = std::max(lo[d], s.offsets[d]);
      int64_t end = std::min(lo[d] + target.size(static_cast<int64_t>(d)), s.offsets[d] + s.shape[d]);
      if (begin >= end) empty = true;
      spans.emplace_back(begin, end);
    }
    if (empty && !global.empty()) continue;
    src = shard_view(key, s);
    dst = destination;
    for (size_t d = 0; d < spans.size(); ++d) {
      const auto [begin, end] = spans[d];
      src = src.narrow(static_cast<int64_t>(d), begin - s.offsets[d], end - begin);
      dst = dst.narrow(static_cast<int64_t>(d), begin - lo[d], end - begin);
    }
    dst.copy_(src);
    copied += dst.numel();
    bytes_read_ += static_cast<uint64_t>(dst.numel()) * dst.element_size();
  }
  if (copied != target.numel())
    throw InputError(cat(where, ": the shards cover ", copied, " of the ", target.numel(), " elements needed"));
}

at::Tensor CheckpointReader::read_whole(const std::string& key) {
  const EntryRecord& e = entry(key);
  at::Tensor out = at::empty(e.shape, at::TensorOptions().dtype(scalar_type_of(e.dtype, key)));
  read(key, out);
  return out;
}

size_t CheckpointReader::verify_all() {
  size_t n = 0;
  for (const auto& [key, e] : manifest_.entries)
    for (const ShardRecord& s : e.shards) {
      shard_view(key, s);
      ++n;
    }
  return n;
}

std::string CheckpointReader::verify_share(int index, int count) {
  size_t i = 0;
  try {
    for (const auto& [key, e] : manifest_.entries)
      for (const ShardRecord& s : e.shards)
        if (static_cast<int>(i++ % static_cast<size_t>(count)) == index) shard_view(key, s);
  } catch (const InputError& error) {
    return error.what();
  }
  return "";
}

}  // namespace keel
