#include "checkpoint/streamed_checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "checkpoint/checkpoint_writer.hpp"
#include "checkpoint/strict_json.hpp"
#include "common/durable_file.hpp"
#include "common/error.hpp"
#include "common/text.hpp"

namespace keel {

namespace fs = std::filesystem;

namespace {

void write_at(int fd, const char* data, uint64_t size, uint64_t offset, const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, data, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error(cat("cannot write ", path, ": ", std::strerror(errno), " (disk full?)"));
    data += n;
    size -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

}  // namespace

StreamedCheckpoint::StreamedCheckpoint(const std::string& root, int64_t step, std::vector<SafetensorsLayout> layout)
    : root_(root) {
  const std::string name = "step-" + std::to_string(step);
  final_ = (fs::path(root) / name).string();
  partial_ = final_ + ".partial";
  std::error_code ec;
  if (fs::exists(final_, ec)) throw InputError(cat(final_, " already exists: nothing is replaced"));
  fs::create_directories(root);
  fs::remove_all(partial_);  // a previous import's leftover, never a complete checkpoint
  fs::create_directories(partial_);
  // A constructor that throws runs no destructor: what it made is removed here.
  try {
    file_ = (fs::path(partial_) / CheckpointWriter::file_name(0)).string();
    std::vector<uint64_t> offsets;
    const std::string header = safetensors_header(layout, {{"format", "keel-checkpoint-shard"}}, offsets);
    data_start_ = header.size();
    uint64_t total = data_start_;
    for (size_t i = 0; i < layout.size(); ++i) {
      int64_t volume = 0;
      uint64_t bytes = 0;
      if (!checked_volume(layout[i].shape, volume) ||
          __builtin_mul_overflow(static_cast<uint64_t>(volume), c10::elementSize(layout[i].dtype), &bytes) ||
          __builtin_add_overflow(total, bytes, &total) ||
          total > static_cast<uint64_t>(std::numeric_limits<off_t>::max()))
        throw InputError(
            cat("'", layout[i].name, "' of shape ", at::IntArrayRef(layout[i].shape), " does not fit in a file"));
      Slot slot{std::move(layout[i]), offsets[i], ""};
      const std::string key = slot.layout.name;
      if (!slots_.emplace(key, std::move(slot)).second) throw std::logic_error(cat("layout lists '", key, "' twice"));
    }
    fd_ = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd_ < 0) throw std::runtime_error(cat("cannot create ", file_, ": ", std::strerror(errno)));
    write_at(fd_, header.data(), header.size(), 0, file_);
    if (::ftruncate(fd_, static_cast<off_t>(total)) != 0)
      throw std::runtime_error(cat("cannot size ", file_, " to ", total, " bytes: ", std::strerror(errno)));
  } catch (...) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    fs::remove_all(partial_, ec);
    throw;
  }
}

StreamedCheckpoint::~StreamedCheckpoint() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(partial_, ec);
  }
}

void StreamedCheckpoint::write(const std::string& key, const at::Tensor& value) {
  auto it = slots_.find(key);
  if (it == slots_.end()) throw InputError(cat("'", key, "' is not a tensor of this model"));
  Slot& slot = it->second;
  if (!slot.xxh64.empty()) throw InputError(cat("'", key, "' given twice"));
  if (value.sizes().vec() != slot.layout.shape)
    throw InputError(cat("'", key, "' has shape ", value.sizes(), ", the model's config gives ",
                         at::IntArrayRef(slot.layout.shape)));
  const at::Tensor data = value.to(at::kCPU, slot.layout.dtype).contiguous();
  const auto bytes = static_cast<uint64_t>(data.nbytes());
  write_at(fd_, static_cast<const char*>(data.data_ptr()), bytes, data_start_ + slot.offset, file_);
  slot.xxh64 = xxh64_hex(data.data_ptr(), data.nbytes());
  bytes_written_ += bytes;
}

std::vector<std::string> StreamedCheckpoint::missing() const {
  std::vector<std::string> out;
  for (const auto& [key, slot] : slots_)
    if (slot.xxh64.empty()) out.push_back(key);
  return out;
}

std::string StreamedCheckpoint::commit(Manifest header) {
  const std::vector<std::string> absent = missing();
  if (!absent.empty())
    throw InputError(
        cat(absent.size(), " tensor(s) of the model were not produced: ",
            join(std::vector<std::string>(absent.begin(), absent.begin() + std::min<size_t>(absent.size(), 5)), ", "),
            absent.size() > 5 ? ", ..." : ""));
  if (::fsync(fd_) != 0) throw std::runtime_error(cat("cannot sync ", file_, ": ", std::strerror(errno)));
  ::close(fd_);
  fd_ = -1;
  header.entries.clear();
  const std::string file = fs::path(file_).filename().string();
  for (const auto& [key, slot] : slots_) {
    EntryRecord& entry = header.entries[key];
    entry.dtype = safetensors_dtype(slot.layout.dtype);
    entry.shape = slot.layout.shape;
    entry.shards.push_back({file, std::vector<int64_t>(slot.layout.shape.size(), 0), slot.layout.shape, slot.xxh64});
  }
  write_durably(fs::path(partial_) / "manifest.json", manifest_json(header));
  sync_dir(partial_);
  fs::rename(partial_, final_);
  try {
    sync_dir(root_);
    write_durably(fs::path(root_) / "latest", fs::path(final_).filename().string() + "\n");
    sync_dir(root_);
  } catch (...) {
    // A commit that cannot finish (a full disk writing the pointer) takes the checkpoint back
    // to its staging name, which the destructor removes: nothing that looks complete remains.
    std::error_code ec;
    fs::rename(final_, partial_, ec);
    fs::remove(fs::path(root_) / "latest.partial", ec);
    throw;
  }
  committed_ = true;
  return final_;
}

}  // namespace keel
