#include "checkpoint/checkpoint_writer.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <sstream>

#include "checkpoint/safetensors.hpp"
#include "common/durable_file.hpp"
#include "common/error.hpp"
#include "common/input_file.hpp"
#include "common/log.hpp"
#include "common/text.hpp"

namespace keel {

namespace fs = std::filesystem;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string step_dir(int64_t step) { return "step-" + std::to_string(step); }

bool complete(const fs::path& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::is_regular_file(dir / "manifest.json", ec);
}

int64_t volume(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// A checkpoint's save record (`save.json`): which run saved it, and as its how-manyth save.
// Written next to the manifest by rank 0; read only to order and select what to prune.
struct SaveRecord {
  std::string run_id;
  int64_t number = 0;
};

const char* const kSaveRecord = "save.json";

std::optional<SaveRecord> read_save_record(const fs::path& dir) {
  // Another run's folder may hold anything under this name (a FIFO, a folder, a huge file): only
  // a small regular file is read, and anything else is "unknown", so its checkpoint is kept.
  constexpr uint64_t kMaxSaveRecordBytes = 64 << 10;
  const fs::path path = dir / kSaveRecord;
  std::string text;
  try {
    text = read_input_file(path, "save record", kMaxSaveRecordBytes);
  } catch (const InputError&) {
    return std::nullopt;
  }
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    SaveRecord r{j.at("run_id").get<std::string>(), j.at("save").get<int64_t>()};
    if (!valid_run_id(r.run_id) || r.number < 1) return std::nullopt;
    return r;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;  // unreadable: the checkpoint is not known to be this run's, so it is kept
  }
}

// `dir`'s manifest, or nullopt when it is unreadable.
std::optional<Manifest> manifest_of(const fs::path& dir) {
  try {
    return read_manifest(dir.string());
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// The run id in `dir`'s manifest, or nullopt when the manifest is unreadable.
std::optional<std::string> manifest_run_id(const fs::path& dir) {
  std::optional<Manifest> m = manifest_of(dir);
  if (!m) return std::nullopt;
  return m->run_id;
}

bool same_folder(const fs::path& a, const std::string& b) {
  std::error_code ec;
  return !b.empty() && fs::equivalent(a, b, ec) && !ec;
}

// Leftovers of saves and prunes under `root`: `step-<N>.<suffix>` folders, by N.
struct Leftover {
  fs::path path;
  int64_t step;
  std::string suffix;  // "partial", "old" or "deleting"
};

std::vector<Leftover> leftovers(const fs::path& root) {
  static const std::regex name("step-(\\d{1,18})\\.(partial|old|deleting)");
  std::vector<Leftover> found;
  for (const auto& item : fs::directory_iterator(root)) {
    const std::string base = item.path().filename().string();
    std::smatch m;
    if (std::regex_match(base, m, name)) found.push_back({item.path(), std::stoll(m[1]), m[2]});
  }
  return found;
}

}  // namespace

std::vector<std::string> best_checkpoints(const std::vector<RankedCheckpoint>& checkpoints, int64_t keep) {
  std::vector<std::pair<double, int64_t>> ranked;  // (val_loss, step), with the index via step order
  std::map<int64_t, std::string> dir_of;
  for (const RankedCheckpoint& c : checkpoints) {
    if (!c.validation || c.validation->step != c.step) continue;
    const auto loss = c.validation->metrics.find("val_loss");
    if (loss == c.validation->metrics.end() || !std::isfinite(loss->second)) continue;
    if (!dir_of.emplace(c.step, c.dir).second) continue;  // one folder per step
    ranked.emplace_back(loss->second, c.step);
  }
  std::sort(ranked.begin(), ranked.end());  // by val_loss, then the earlier step
  std::vector<std::string> best;
  for (size_t i = 0; i < ranked.size() && static_cast<int64_t>(i) < keep; ++i)
    best.push_back(dir_of.at(ranked[i].second));
  return best;
}

SavePhase save_phase(const std::string& name) {
  static const std::map<std::string, SavePhase> phases = {
      {"written", SavePhase::written},     {"gathered", SavePhase::gathered}, {"manifest", SavePhase::manifest},
      {"displaced", SavePhase::displaced}, {"renamed", SavePhase::renamed},   {"latest", SavePhase::latest},
      {"pruned", SavePhase::pruned}};
  auto it = phases.find(name);
  return it == phases.end() ? SavePhase::none : it->second;
}

std::string new_run_id() {
  std::random_device device;
  const uint64_t id = (static_cast<uint64_t>(device()) << 32) ^ static_cast<uint64_t>(device());
  return format("%016llx", static_cast<unsigned long long>(id));
}

bool valid_run_id(const std::string& id) {
  static const std::regex hex("[0-9a-f]{1,64}");
  return std::regex_match(id, hex);
}

std::vector<std::string> complete_checkpoints(const std::string& root) {
  static const std::regex name("step-\\d{1,18}");
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& item : fs::directory_iterator(root, ec))
    if (std::regex_match(item.path().filename().string(), name) && complete(item.path()))
      found.push_back(item.path().filename().string());
  std::sort(found.begin(), found.end());
  return found;
}

std::vector<std::string> recover_interrupted_saves(const std::string& root_name) {
  const fs::path root(root_name);
  std::vector<std::string> done;
  if (!fs::is_directory(root)) return done;
  for (const Leftover& l : leftovers(root)) {
    const fs::path target = root / step_dir(l.step);
    if (l.suffix == "deleting" || complete(target) || !complete(l.path)) continue;
    // A complete `.partial` is the newer copy (every rank wrote, the manifest followed); an
    // `.old` is the step a replacement moved aside. The newer wins when both are there.
    const fs::path newer = root / (step_dir(l.step) + ".partial");
    const fs::path source = complete(newer) ? newer : l.path;
    if (fs::exists(target)) {  // a folder without manifest under the name: never loadable
      fs::path doomed = target;
      doomed += ".deleting";
      fs::remove_all(doomed);
      fs::rename(target, doomed);
    }
    fs::rename(source, target);
    done.push_back(cat(target.string(), " restored from ", source.filename().string()));
  }
  if (!done.empty()) sync_dir(root);
  return done;
}

std::string CheckpointWriter::file_name(int rank) { return format("rank-%05d.safetensors", rank); }

CheckpointWriter::CheckpointWriter(CheckpointWriterOptions options, Group& group)
    : options_(std::move(options)), group_(group) {}

CheckpointWriter::~CheckpointWriter() {
  join();
  for (const SaveOutcome& o : outcomes_)
    if (!o.ok()) log_line(LogLevel::error, cat("checkpoint ", o.path, " failed: ", o.failure));
}

void CheckpointWriter::join() {
  if (!worker_.joinable()) return;
  worker_.join();
  outcomes_.push_back(background_);
}

std::optional<SaveOutcome> CheckpointWriter::take_outcome() {
  join();
  if (outcomes_.empty()) return std::nullopt;
  SaveOutcome o = std::move(outcomes_.front());
  outcomes_.pop_front();
  return o;
}

void CheckpointWriter::crash_if(int64_t step, SavePhase phase) const {
  if (step == crash_step_ && phase == crash_phase_) ::raise(SIGKILL);
}

void CheckpointWriter::save(const Manifest& header, std::vector<TensorPiece> pieces) {
  const double started = now();
  join();
  const fs::path root(options_.root), partial = root / (step_dir(header.step) + ".partial");
  const std::string path = (root / step_dir(header.step)).string();
  // Rank 0 prepares the folder (a partial folder of this step left by a killed run is cleared
  // before anyone writes into it, unless it is the only complete copy of the step); its status
  // is gathered, so a failure here stops this save on every rank at once.
  std::string prepared;
  if (group_.rank() == 0) {
    try {
      fs::create_directories(root);
      recover_interrupted_saves(options_.root);
      fs::remove_all(partial);
      fs::create_directories(partial);
    } catch (const std::exception& e) {
      prepared = cat("rank ", group_.world_ranks()[0], ": ", e.what());
    }
  }
  prepared = all_gather_bytes(group_, prepared)[0];
  if (!prepared.empty()) {
    outcomes_.push_back({header.step, path, prepared, {}});
    return;
  }
  for (TensorPiece& p : pieces) {
    at::Tensor t = p.tensor.detach().to(at::kCPU);
    // Asynchronous: a private copy, since training changes the tensors while the thread writes.
    p.tensor = options_.async ? t.clone(at::MemoryFormat::Contiguous) : t.contiguous();
  }
  const double blocked = now() - started;
  if (!options_.async) {
    outcomes_.push_back(write_and_commit(header, pieces, blocked, started));
    return;
  }
  done_ = false;
  failed_ = false;
  worker_ = std::thread([this, header, pieces = std::move(pieces), blocked, started] {
    background_ = write_and_commit(header, pieces, blocked, started);
    failed_ = !background_.ok();
    done_ = true;
  });
}

SaveOutcome CheckpointWriter::write_and_commit(const Manifest& header, const std::vector<TensorPiece>& pieces,
                                               double blocked, double started) {
  SaveOutcome outcome;
  outcome.step = header.step;
  const fs::path root(options_.root), partial = root / (step_dir(header.step) + ".partial");
  outcome.path = (root / step_dir(header.step)).string();
  const int world_rank = group_.world_ranks()[static_cast<size_t>(group_.rank())];
  const std::string file = file_name(world_rank);
  nlohmann::json message = {{"file", file}};
  uint64_t bytes = 0;
  // A failure is this rank's message in the gather: the others learn it there instead of
  // waiting for entries that never come.
  try {
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    nlohmann::json mine = nlohmann::json::array();
    for (const TensorPiece& p : pieces) {
      tensors.emplace_back(p.key, p.tensor);
      mine.push_back({p.key, safetensors_dtype(p.tensor.scalar_type()), p.global_shape(), p.offsets(),
                      p.tensor.sizes().vec(), xxh64_hex(p.tensor.data_ptr(), p.tensor.nbytes())});
      bytes += p.tensor.nbytes();
    }
    if (header.step == fail_write_step_)
      throw std::runtime_error(
          cat("cannot write ", (partial / file).string(), ": injected failure (debug.fail_checkpoint_write)"));
    write_safetensors((partial / file).string(), tensors, {{"format", "keel-checkpoint-shard"}}, /*durable=*/true);
    message["entries"] = std::move(mine);
  } catch (const std::exception& e) {
    message["error"] = e.what();
  }
  crash_if(header.step, SavePhase::written);
  std::vector<std::string> failures;
  bool lost_group = false;
  try {
    // Gathering every rank's entries is also the barrier: all files are on disk after it.
    std::vector<std::string> gathered = all_gather_bytes(group_, message.dump());
    for (size_t r = 0; r < gathered.size(); ++r) {
      nlohmann::json m = nlohmann::json::parse(gathered[r]);
      if (m.contains("error"))
        failures.push_back(cat("rank ", group_.world_ranks()[r], ": ", m.at("error").get<std::string>()));
    }
    // The same list on every rank: either all ranks take the commit's status or none does.
    if (failures.empty()) {
      std::string committed;
      if (group_.rank() == 0) {
        try {
          commit(header, gathered);
        } catch (const std::exception& e) {
          committed = cat("rank ", world_rank, ": ", e.what());
        }
      }
      committed = all_gather_bytes(group_, committed)[0];
      if (!committed.empty()) failures.push_back(committed);
    }
  } catch (const std::exception& e) {
    // The group itself failed (a rank died): the folder is left as it is, for the next save.
    failures.push_back(cat("rank ", world_rank, ": ", e.what()));
    lost_group = true;
  }
  if (!failures.empty() && !lost_group && group_.rank() == 0) {
    // Space back: the failed save's partial folder, unless it is the only complete copy.
    std::error_code ec;
    if (!complete(partial) || complete(outcome.path)) fs::remove_all(partial, ec);
  }
  outcome.failure = keel::join(failures, "; ");
  outcome.timing = {blocked, now() - started, bytes};
  return outcome;
}

int64_t CheckpointWriter::next_save_number() const {
  int64_t last = 0;
  for (const std::string& name : complete_checkpoints(options_.root)) {
    std::optional<SaveRecord> r = read_save_record(fs::path(options_.root) / name);
    if (r && r->run_id == options_.run_id) last = std::max(last, r->number);
  }
  return last + 1;
}

void CheckpointWriter::commit(Manifest manifest, const std::vector<std::string>& gathered) {
  manifest.entries.clear();
  manifest.run_id = options_.run_id;
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
  crash_if(manifest.step, SavePhase::gathered);
  const fs::path root(options_.root), partial = root / (step_dir(manifest.step) + ".partial"),
                                      final_dir = root / step_dir(manifest.step),
                                      old = root / (step_dir(manifest.step) + ".old");
  if (manifest.step == fail_commit_step_)
    throw std::runtime_error(
        cat("cannot commit ", final_dir.string(), ": injected failure (debug.fail_checkpoint_commit)"));
  const bool replacing = complete(final_dir);
  if (replacing) {
    // Only this run's own checkpoint (or the one it loaded) is replaced: another run's stays.
    std::optional<std::string> owner = manifest_run_id(final_dir);
    if (owner != options_.run_id && !same_folder(final_dir, options_.loaded_dir))
      throw std::runtime_error(cat("cannot replace ", final_dir.string(), ": it holds a checkpoint of run '",
                                   owner.value_or("(unreadable manifest)"), "', this is run '", options_.run_id, "'"));
  }
  write_durably(
      partial / kSaveRecord,
      nlohmann::json{{"run_id", options_.run_id}, {"save", next_save_number()}, {"step", manifest.step}}.dump());
  write_durably(partial / "manifest.json", manifest_json(manifest));
  sync_dir(partial);
  crash_if(manifest.step, SavePhase::manifest);
  if (replacing) {
    // The old copy steps aside under `.old` and is removed only once the new one is in place:
    // at every instant one complete copy exists (recover_interrupted_saves restores a name).
    fs::remove_all(old);
    fs::rename(final_dir, old);
    sync_dir(root);
    crash_if(manifest.step, SavePhase::displaced);
  }
  fs::rename(partial, final_dir);
  sync_dir(root);
  crash_if(manifest.step, SavePhase::renamed);
  write_durably(root / "latest", step_dir(manifest.step) + "\n");
  sync_dir(root);
  crash_if(manifest.step, SavePhase::latest);
  prune();
  crash_if(manifest.step, SavePhase::pruned);
}

void CheckpointWriter::prune() const {
  const fs::path root(options_.root);
  // Remains of killed saves and prunes: removed where a complete copy of the step exists under
  // its own name; a complete `.partial`/`.old` that is the only copy stays for recovery.
  for (const Leftover& l : leftovers(root))
    if (l.suffix == "deleting" || !complete(l.path) || complete(root / step_dir(l.step))) fs::remove_all(l.path);
  if (options_.keep_latest <= 0) return;
  std::string named;
  try {
    std::istringstream(read_input_file(root / "latest", "latest", 64)) >> named;
  } catch (const InputError&) {
    // absent, or not a pointer: no checkpoint is protected as the one it names
  }
  // This run's checkpoints (save record and manifest agree on the id), newest save first. A
  // checkpoint whose manifest cannot be read is not known to be this run's: it is kept.
  std::vector<std::pair<int64_t, fs::path>> mine;
  std::vector<RankedCheckpoint> ranked;
  for (const std::string& name : complete_checkpoints(options_.root)) {
    const fs::path dir = root / name;
    std::optional<SaveRecord> r = read_save_record(dir);
    if (!r || r->run_id != options_.run_id) continue;
    std::optional<Manifest> m = manifest_of(dir);
    if (!m) log_warn(cat("keeping ", dir.string(), ": its manifest cannot be read (keel-ckpt verify says why)"));
    if (!m || m->run_id != options_.run_id) continue;
    mine.emplace_back(r->number, dir);
    ranked.push_back({dir.string(), m->step, m->validation});
  }
  std::set<std::string> best;
  for (const std::string& dir : best_checkpoints(ranked, options_.keep_best)) best.insert(dir);
  std::sort(mine.begin(), mine.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = static_cast<size_t>(options_.keep_latest); i < mine.size(); ++i) {
    const fs::path& dir = mine[i].second;
    if (dir.filename() == named || same_folder(dir, options_.loaded_dir) || best.count(dir.string())) continue;
    // Renamed first, so a kill during the removal leaves no half folder under a loadable name.
    fs::path doomed = dir;
    doomed += ".deleting";
    fs::rename(dir, doomed);
    sync_dir(root);
    fs::remove_all(doomed);
  }
}

}  // namespace keel
