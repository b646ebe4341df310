#include "checkpoint/checkpoint_writer.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "checkpoint/safetensors.hpp"
#include "common/log.hpp"
#include "common/text.hpp"

namespace keel {

namespace fs = std::filesystem;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Makes a rename or a new file in `dir` durable.
void sync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw std::runtime_error(cat("cannot open folder ", dir.string(), " to sync it"));
  ::fsync(fd);
  ::close(fd);
}

void write_durably(const fs::path& path, const std::string& text) {
  fs::path partial = path;
  partial += ".partial";
  {
    std::ofstream out(partial, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw std::runtime_error(cat("cannot write ", partial.string()));
  }
  int fd = ::open(partial.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  fs::rename(partial, path);
}

std::string step_dir(int64_t step) { return "step-" + std::to_string(step); }

int64_t volume(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void barrier(Group& group) {
  at::Tensor token = at::zeros({1}, at::kFloat);
  group.all_reduce(token, KEEL_REDUCE_SUM);
}

}  // namespace

std::string CheckpointWriter::file_name(int rank) { return format("rank-%05d.safetensors", rank); }

CheckpointWriter::CheckpointWriter(std::string root, Group& group, int64_t keep_latest, bool async)
    : root_(std::move(root)), group_(group), keep_latest_(keep_latest), async_(async) {}

CheckpointWriter::~CheckpointWriter() {
  try {
    wait();
  } catch (const std::exception& e) {
    log_line(LogLevel::error, cat("checkpoint: the last save failed: ", e.what()));
  }
}

void CheckpointWriter::wait() {
  if (worker_.joinable()) {
    worker_.join();
    timing_ = pending_timing_;
    last_path_ = pending_path_;
  }
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void CheckpointWriter::save(const Manifest& header, std::vector<TensorPiece> pieces) {
  const double started = now();
  wait();
  const fs::path partial = fs::path(root_) / (step_dir(header.step) + ".partial");
  // A partial folder of this step left by a killed run is cleared before anyone writes into it.
  if (group_.rank() == 0) {
    fs::remove_all(partial);
    fs::create_directories(partial);
  }
  barrier(group_);
  for (TensorPiece& p : pieces) {
    at::Tensor t = p.tensor.detach().to(at::kCPU);
    // Asynchronous: a private copy, since training changes the tensors while the thread writes.
    p.tensor = async_ ? t.clone(at::MemoryFormat::Contiguous) : t.contiguous();
  }
  const double blocked = now() - started;
  if (!async_) {
    write_and_commit(header, pieces, blocked, started);
    timing_ = pending_timing_;
    last_path_ = pending_path_;
    return;
  }
  worker_ = std::thread([this, header, pieces = std::move(pieces), blocked, started] {
    try {
      write_and_commit(header, pieces, blocked, started);
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

void CheckpointWriter::write_and_commit(const Manifest& header, const std::vector<TensorPiece>& pieces, double blocked,
                                        double started) {
  const fs::path partial = fs::path(root_) / (step_dir(header.step) + ".partial");
  const std::string file = file_name(group_.world_ranks()[static_cast<size_t>(group_.rank())]);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  nlohmann::json mine = nlohmann::json::array();
  uint64_t bytes = 0;
  for (const TensorPiece& p : pieces) {
    tensors.emplace_back(p.key, p.tensor);
    mine.push_back({p.key, safetensors_dtype(p.tensor.scalar_type()), p.global_shape(), p.offsets(),
                    p.tensor.sizes().vec(), xxh64_hex(p.tensor.data_ptr(), p.tensor.nbytes())});
    bytes += p.tensor.nbytes();
  }
  write_safetensors((partial / file).string(), tensors, {{"format", "keel-checkpoint-shard"}}, /*durable=*/true);
  if (header.step == crash_step_) ::raise(SIGKILL);
  nlohmann::json message = {{"file", file}, {"entries", mine}};
  // Gathering every rank's entries is also the barrier: all files are on disk after it.
  std::vector<std::string> gathered = all_gather_bytes(group_, message.dump());
  if (group_.rank() == 0) commit(header, gathered);
  pending_timing_ = {blocked, now() - started, bytes};
  pending_path_ = (fs::path(root_) / step_dir(header.step)).string();
}

void CheckpointWriter::commit(Manifest manifest, const std::vector<std::string>& gathered) {
  manifest.entries.clear();
  for (const std::string& text : gathered) {
    nlohmann::json message = nlohmann::json::parse(text);
    const std::string file = message.at("file").get<std::string>();
    for (const auto& e : message.at("entries")) {
      const std::string key = e[0].get<std::string>();
      EntryRecord& entry = manifest.entries[key];
      entry.dtype = e[1].get<std::string>();
      entry.shape = e[2].get<std::vector<int64_t>>();
      entry.shards.push_back(
          {file, e[3].get<std::vector<int64_t>>(), e[4].get<std::vector<int64_t>>(), e[5].get<std::string>()});
    }
  }
  // Every entry must be tiled exactly once by its shards: a gap or a double write is a bug.
  for (const auto& [key, entry] : manifest.entries) {
    int64_t covered = 0;
    for (const ShardRecord& s : entry.shards) covered += volume(s.shape);
    if (covered != volume(entry.shape))
      throw std::runtime_error(cat("checkpoint step ", manifest.step, ": the shards of '", key, "' cover ", covered,
                                   " of ", volume(entry.shape), " elements"));
  }
  const fs::path root(root_), partial = root / (step_dir(manifest.step) + ".partial"),
                              final_dir = root / step_dir(manifest.step);
  write_durably(partial / "manifest.json", manifest_json(manifest));
  sync_dir(partial);
  if (fs::exists(final_dir)) {  // a checkpoint of this step from an earlier run: replaced whole
    fs::path old = root / (step_dir(manifest.step) + ".deleting");
    fs::remove_all(old);
    fs::rename(final_dir, old);
    fs::remove_all(old);
  }
  fs::rename(partial, final_dir);
  sync_dir(root);
  write_durably(root / "latest", step_dir(manifest.step) + "\n");
  sync_dir(root);
  prune();
}

void CheckpointWriter::prune() const {
  static const std::regex complete("step-(\\d+)"), leftover("step-\\d+\\.(partial|deleting)");
  std::vector<std::pair<int64_t, fs::path>> steps;
  for (const auto& item : fs::directory_iterator(root_)) {
    const std::string name = item.path().filename().string();
    std::smatch m;
    if (std::regex_match(name, m, complete) && fs::exists(item.path() / "manifest.json"))
      steps.emplace_back(std::stoll(m[1]), item.path());
    else if (std::regex_match(name, leftover))
      fs::remove_all(item.path());  // a killed save's or prune's remains: never loadable
  }
  if (keep_latest_ <= 0 || static_cast<int64_t>(steps.size()) <= keep_latest_) return;
  std::sort(steps.begin(), steps.end());
  for (size_t i = 0; i + static_cast<size_t>(keep_latest_) < steps.size(); ++i) {
    // Renamed first, so a kill during the removal leaves no half folder under a loadable name.
    fs::path doomed = steps[i].second;
    doomed += ".deleting";
    fs::rename(steps[i].second, doomed);
    fs::remove_all(doomed);
  }
}

}  // namespace keel
