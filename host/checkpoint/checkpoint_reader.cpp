#include "checkpoint/checkpoint_reader.hpp"

#include <c10/core/GradMode.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "common/error.hpp"
#include "common/input_file.hpp"
#include "common/text.hpp"

namespace keel {

namespace fs = std::filesystem;

namespace {

bool complete(const fs::path& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::is_regular_file(dir / "manifest.json", ec);
}

std::string shape_text(const std::vector<int64_t>& shape) { return cat(at::IntArrayRef(shape)); }

// The checkpoint folder the pointer file `root`/latest names: "" when there is none; an
// InputError when it is not exactly "step-<N>" (plus a newline): its content is never used as
// a path, only as the number N.
std::string latest_pointer(const fs::path& root) {
  static const std::regex pointer_text("(step-[0-9]{1,18})\n?");
  const fs::path file = root / "latest";
  std::error_code ec;
  const fs::file_status status = fs::status(file, ec);
  if (status.type() == fs::file_type::not_found) return "";
  constexpr uint64_t kMaxPointerBytes = 64;
  std::string text;  // anything but a small regular file is refused below as "not a pointer"
  try {
    text = read_input_file(file, "latest", kMaxPointerBytes);
  } catch (const InputError&) {
  }
  std::smatch m;
  if (!std::regex_match(text, m, pointer_text))
    throw InputError(cat(file.string(), ": not a checkpoint pointer (expected one line \"step-<N>\")"));
  return m[1].str();
}

}  // namespace

std::string resolve_checkpoint(const std::string& root, const std::string& spec) {
  static const std::regex number("(step-)?(\\d+)"), step_name("step-(\\d{1,18})");
  if (spec == "latest") {
    const std::string name = latest_pointer(root);
    if (!name.empty()) {
      // A pointer that names no complete checkpoint is refused rather than replaced by another
      // step: the newest step on disk may belong to another run.
      if (!complete(fs::path(root) / name))
        throw InputError(cat((fs::path(root) / "latest").string(), " names ", name,
                             ", which is not a complete checkpoint (no ", name, "/manifest.json)"));
      return (fs::path(root) / name).string();
    }
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
  std::error_code ec;
  fs::path dir = std::regex_match(spec, m, number) ? fs::path(root) / ("step-" + m[2].str()) : fs::path(spec);
  if (!complete(dir))
    throw InputError(cat("checkpoint.load: ", dir.string(),
                         fs::exists(dir, ec) ? " is not a complete checkpoint (no manifest.json)" : " does not exist"));
  return dir.string();
}

std::string VerifyReport::summary() const {
  constexpr size_t kShown = 20;
  std::vector<std::string> lines = malformed;
  lines.insert(lines.end(), damaged.begin(), damaged.end());
  const size_t total = lines.size();
  if (total > kShown) {
    lines.resize(kShown);
    lines.push_back(cat("... and ", total - kShown, " more problem(s)"));
  }
  return join(lines, "\n");
}

CheckpointReader::CheckpointReader(std::string dir) : dir_(std::move(dir)), manifest_(read_manifest(dir_)) {
  for (const auto& [key, e] : manifest_.entries)
    for (const ShardRecord& s : e.shards) file_keys_[s.file].insert(key);
}

const EntryRecord& CheckpointReader::entry(const std::string& key) const {
  auto it = manifest_.entries.find(key);
  if (it == manifest_.entries.end()) throw InputError(cat("checkpoint ", dir_, ": no entry '", key, "'"));
  return it->second;
}

const SafetensorsReader& CheckpointReader::file(const std::string& name) {
  auto& slot = files_[name];
  if (!slot) {
    if (name.find('/') != std::string::npos) throw InputError(cat("checkpoint ", dir_, ": bad file name '", name, "'"));
    auto opened = std::make_unique<SafetensorsReader>((fs::path(dir_) / name).string());
    // A file holds exactly what the manifest says it holds: anything else in it was not written
    // by the save that wrote the manifest.
    const std::set<std::string>& expected = file_keys_[name];
    for (const std::string& key : opened->keys())
      if (expected.count(key) == 0)
        throw InputError(
            cat("checkpoint ", dir_, ", file ", name, ": tensor '", key, "' is not in the manifest's entries for it"));
    slot = std::move(opened);
  }
  return *slot;
}

const SafetensorsReader& CheckpointReader::checked_file(const std::string& key, const EntryRecord& entry,
                                                        const ShardRecord& shard) {
  const SafetensorsReader& f = file(shard.file);
  const std::string where = cat("checkpoint ", dir_, ", file ", shard.file, ", key '", key, "'");
  if (!f.has(key)) throw InputError(cat(where, ": the file lacks it"));
  if (f.dtype(key) != scalar_type_of(entry.dtype, where))
    throw InputError(
        cat(where, ": dtype ", safetensors_dtype(f.dtype(key)), " in the file, ", entry.dtype, " in the manifest"));
  if (f.shape(key) != shard.shape)
    throw InputError(cat(where, ": shape ", shape_text(f.shape(key)), " in the file, ", shape_text(shard.shape),
                         " in the manifest"));
  return f;
}

at::Tensor CheckpointReader::shard_view(const std::string& key, const EntryRecord& entry, const ShardRecord& shard) {
  const SafetensorsReader& f = checked_file(key, entry, shard);
  const std::string where = cat("checkpoint ", dir_, ", file ", shard.file, ", key '", key, "'");
  at::Tensor data = f.read(key);
  bytes_loaded_ += f.byte_size(key);
  if (verified_.insert({shard.file, key}).second) {
    const auto size = static_cast<size_t>(f.byte_size(key));
    std::string found = xxh64_hex(data.data_ptr(), size);
    bytes_verified_ += size;
    if (found != shard.xxh64) {
      verified_.erase({shard.file, key});
      throw ChecksumMismatch(cat(where, ": damaged (xxh64 ", found, ", the manifest records ", shard.xxh64, ")"));
    }
  }
  return data;
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
    src = shard_view(key, e, s);
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

void CheckpointReader::check_entry(const std::string& key) {
  const EntryRecord& e = entry(key);
  for (const ShardRecord& s : e.shards) shard_view(key, e, s);
}

at::Tensor CheckpointReader::read_whole(const std::string& key) {
  const EntryRecord& e = entry(key);
  // Every shard's file header checked first: the tensor allocated below is then no larger than
  // the bytes on disk that hold it, whatever shape the manifest claims. The data are read and
  // their checksums verified once, by read().
  for (const ShardRecord& s : e.shards) checked_file(key, e, s);
  at::Tensor out;
  try {
    out = at::empty(e.shape, at::TensorOptions().dtype(scalar_type_of(e.dtype, key)));
  } catch (const c10::Error& error) {
    throw InputError(cat("checkpoint ", dir_, ", key '", key, "': ", error.what_without_backtrace()));
  } catch (const std::bad_alloc&) {
    throw InputError(cat("checkpoint ", dir_, ", key '", key, "': out of memory for shape ", shape_text(e.shape)));
  }
  read(key, out);
  return out;
}

VerifyReport CheckpointReader::verify(int index, int count) {
  VerifyReport report;
  if (count < 1 || index < 0 || index >= count) {
    report.malformed.push_back(cat("checkpoint ", dir_, ": bad verification share ", index, " of ", count));
    return report;
  }
  size_t i = 0;
  for (const auto& [key, e] : manifest_.entries)
    for (const ShardRecord& s : e.shards) {
      if (static_cast<int>(i++ % static_cast<size_t>(count)) != index) continue;
      const std::string where = cat("checkpoint ", dir_, ", file ", s.file, ", key '", key, "'");
      ++report.shards;
      // Whatever fails becomes a message: a rank that threw here would leave the others
      // waiting in the exchange of results until the timeout.
      try {
        shard_view(key, e, s);
      } catch (const ChecksumMismatch& error) {
        report.damaged.emplace_back(error.what());
      } catch (const InputError& error) {
        report.malformed.emplace_back(error.what());
      } catch (const c10::Error& error) {
        report.malformed.push_back(cat(where, ": ", error.what_without_backtrace()));
      } catch (const std::bad_alloc&) {
        report.malformed.push_back(cat(where, ": out of memory"));
      } catch (const std::exception& error) {
        report.malformed.push_back(cat(where, ": ", error.what()));
      } catch (...) {
        report.malformed.push_back(cat(where, ": unknown error"));
      }
    }
  return report;
}

size_t CheckpointReader::verify_all() {
  const VerifyReport report = verify();
  if (!report.malformed.empty()) throw InputError(report.summary());
  if (!report.damaged.empty()) throw ChecksumMismatch(report.summary());
  return report.shards;
}

std::string CheckpointReader::verify_share(int index, int count) {
  try {
    return verify(index, count).summary();
  } catch (...) {  // only memory for the messages can fail here
    return cat("checkpoint ", dir_, ": verification failed (out of memory?)");
  }
}

}  // namespace keel
