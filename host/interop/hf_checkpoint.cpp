#include "interop/hf_checkpoint.hpp"

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "checkpoint/strict_json.hpp"
#include "common/error.hpp"
#include "common/input_file.hpp"
#include "common/text.hpp"

namespace keel {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMaxJsonBytes = uint64_t{64} << 20;  // an index of a million tensors fits
constexpr int kMaxJsonDepth = 16;

nlohmann::json read_json(const fs::path& path) {
  return parse_untrusted_json(read_input_file(path, "--hf", kMaxJsonBytes), path.string(), kMaxJsonDepth);
}

// A shard name from the index: a plain file name in the folder, never a path out of it.
bool plain_shard_name(const std::string& name) {
  static const std::regex pattern("[A-Za-z0-9_.-]{1,255}");
  return std::regex_match(name, pattern) && name != "." && name != ".." && name.ends_with(".safetensors");
}

}  // namespace

HfCheckpoint::HfCheckpoint(const std::string& dir) : dir_(dir) {
  const fs::path root(dir);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) throw InputError(cat(dir, ": not a folder"));
  config_ = read_json(root / "config.json");
  if (!config_.is_object()) throw InputError(cat((root / "config.json").string(), ": not a JSON object"));

  const fs::path index_path = root / "model.safetensors.index.json", single = root / "model.safetensors";
  std::map<std::string, std::string> listed;  // tensor -> shard file, from the index
  std::vector<std::string> files;
  if (fs::exists(index_path, ec)) {
    const std::string where = index_path.string();
    const nlohmann::json index = read_json(index_path);
    const nlohmann::json& map = json_field(index, "weight_map", where);
    if (!map.is_object() || map.empty()) throw InputError(cat(where, ": weight_map is not a non-empty object"));
    std::set<std::string> seen;
    for (const auto& [name, file] : map.items()) {
      const std::string shard = json_string(file, cat(where, ": weight_map.", name));
      if (!plain_shard_name(shard))
        throw InputError(
            cat(where, ": weight_map.", name, " names '", shard, "', not a .safetensors file name in the folder"));
      listed[name] = shard;
      if (seen.insert(shard).second) files.push_back(shard);
    }
  } else if (fs::exists(single, ec)) {
    files.push_back("model.safetensors");
  } else {
    throw InputError(cat(dir, ": neither model.safetensors nor model.safetensors.index.json"));
  }
  for (const std::string& file : files) {
    const fs::path path = root / file;
    if (!fs::exists(path, ec)) {
      std::string first;  // a tensor the index places in it, to say what is lost
      for (const auto& [name, shard] : listed)
        if (shard == file && first.empty()) first = name;
      throw InputError(cat(path.string(), ": missing shard (", index_path.filename().string(), " places '", first,
                           "' and others there)"));
    }
    shards_.push_back(std::make_unique<SafetensorsReader>(path.string(), "--hf shard"));
    const size_t shard = shards_.size() - 1;
    for (const std::string& name : shards_.back()->keys()) {
      if (!where_.emplace(name, shard).second)
        throw InputError(cat(path.string(), ": tensor '", name, "' is also in ", file_of(name)));
      data_bytes_ += shards_.back()->byte_size(name);
    }
  }
  for (const auto& [name, file] : listed) {
    auto it = where_.find(name);
    if (it == where_.end() || file_of(name) != file)
      throw InputError(cat((root / file).string(), ": no tensor '", name, "' (", index_path.filename().string(),
                           " places it there)"));
  }
}

std::string HfCheckpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) return "";
  return fs::path(shards_[it->second]->path()).filename().string();
}

at::Tensor HfCheckpoint::read(const std::string& name) {
  auto it = where_.find(name);
  if (it == where_.end()) throw InputError(cat(dir_, ": no tensor '", name, "' in the checkpoint"));
  read_.insert(name);
  return shards_[it->second]->read(name);
}

std::vector<std::string> HfCheckpoint::unread() const {
  std::vector<std::string> out;
  for (const auto& [name, shard] : where_)
    if (read_.count(name) == 0) out.push_back(cat(name, " (", file_of(name), ")"));
  return out;
}

}  // namespace keel
