// TrainState at start (the checkpoint folder's bookkeeping, the writer) and over the run (the
// pieces of each save, the outcomes, the weights files). Loading is train_state_load.cpp.
#include "train/train_state.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/consolidate.hpp"
#include "checkpoint/safetensors.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/text.hpp"
#include "train/state_keys.hpp"

namespace keel {

namespace fs = std::filesystem;

TrainState::TrainState(Job& job, const std::vector<ParamRef>& params) : job_(job), params_(params) {
  open_checkpoint_dir();
  load_start_ = std::chrono::steady_clock::now();
}

TrainState::~TrainState() = default;

void TrainState::open_checkpoint_dir() {
  const JobConfig& c = job_.config();
  Group& world = job_.mesh().group(KEEL_GROUP_WORLD);
  const bool first_rank = job_.mesh().layout().rank == 0;
  // Rank 0 finishes saves a kill interrupted, looks at what the folder holds and draws a run
  // id; every rank takes its findings, so all resolve the same checkpoint and agree.
  nlohmann::json found = {{"run_id", ""}, {"recovered", nlohmann::json::array()}, {"held", nlohmann::json::array()}};
  if (first_rank) {
    found["run_id"] = new_run_id();
    try {
      found["recovered"] = recover_interrupted_saves(c.checkpoint.dir);
      found["held"] = complete_checkpoints(c.checkpoint.dir);
    } catch (const std::exception& e) {
      found["error"] = cat("checkpoint.dir ", c.checkpoint.dir, ": ", e.what());
    }
  }
  found = nlohmann::json::parse(all_gather_bytes(world, found.dump())[0]);
  if (found.contains("error")) throw std::runtime_error(found["error"].get<std::string>());
  if (first_rank)
    for (const auto& line : found["recovered"])
      log_warn(cat("checkpoint: an interrupted save was finished: ", line.get<std::string>()));
  if (!c.checkpoint.load.empty()) {
    std::string dir = resolve_checkpoint(c.checkpoint.dir, c.checkpoint.load);
    if (dir.empty())
      log_info(cat("checkpoint.load = \"latest\": no checkpoint in ", c.checkpoint.dir, " yet; starting fresh"));
    else
      loaded_ = std::make_unique<CheckpointReader>(dir);
  }
  // A resumed run continues the loaded checkpoint's run (its lineage: keep_latest goes on
  // pruning it); a run that starts at step 0 is a new run, and must not mix its checkpoints
  // with another run's in one folder.
  const bool resumes = loaded_ && !c.checkpoint.load_model_only;
  if (!resumes) refuse_another_runs_checkpoints(found["held"].get<std::vector<std::string>>());
  run_id_ = found["run_id"].get<std::string>();
  if (resumes) {
    loaded_dir_ = loaded_->dir();
    const std::string& loaded_id = loaded_->manifest().run_id;
    if (valid_run_id(loaded_id))
      run_id_ = loaded_id;
    else if (first_rank)
      log_warn(cat("checkpoint ", loaded_->dir(), " records no valid run id; this run continues it as run ", run_id_));
  }
  if (first_rank && c.checkpoint.interval > 0)
    log_info(cat("run id ", run_id_, resumes ? " (continued from the loaded checkpoint)" : " (new)"));
}

void TrainState::refuse_another_runs_checkpoints(const std::vector<std::string>& held) const {
  const CheckpointSection& ck = job_.config().checkpoint;
  if (ck.interval <= 0 || held.empty()) return;
  std::vector<std::string> shown(held.begin(),
                                 held.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(held.size(), 3)));
  throw InputError(cat("checkpoint.dir ", ck.dir, " holds checkpoints of another run (", join(shown, ", "),
                       held.size() > shown.size() ? ", ..." : "", "); this run starts at step 0",
                       loaded_ ? " (checkpoint.load_model_only)" : "",
                       ": set checkpoint.load (\"latest\" resumes the newest) or choose another checkpoint.dir"));
}

int64_t TrainState::start(AdamW& optimizer, BatchStream& stream, const LrSchedule& schedule) {
  optimizer_ = &optimizer;
  stream_ = &stream;
  schedule_ = &schedule;
  int64_t resumed_after = 0;
  if (loaded_) {
    if (!job_.config().checkpoint.load_model_only) resumed_after = load_training_state(*loaded_);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start_).count();
    if (job_.mesh().layout().rank == 0)
      log_info(format("loaded %s in %.3f s: %.1f MB read and %.1f MB verified by this rank (%.0f MB/s)",
                      loaded_->dir().c_str(), seconds, static_cast<double>(loaded_->bytes_read()) / 1e6,
                      static_cast<double>(loaded_->bytes_verified()) / 1e6,
                      static_cast<double>(loaded_->bytes_read()) / 1e6 / std::max(seconds, 1e-9)));
    loaded_.reset();  // unmaps the files
  }
  if (job_.config().checkpoint.interval > 0) open_writer();
  return resumed_after;
}

void TrainState::open_writer() {
  const JobConfig& c = job_.config();
  const MeshLayout& layout = job_.mesh().layout();
  // Checkpoint I/O gets a group of its own (every rank): a background save's collectives
  // never interleave with the training's.
  std::vector<int> everyone;
  for (int r = 0; r < layout.world(); ++r) everyone.push_back(r);
  Group* io_group = job_.mesh().new_group(everyone);
  writer_ = std::make_unique<CheckpointWriter>(
      CheckpointWriterOptions{c.checkpoint.dir, c.checkpoint.keep_latest, c.checkpoint.async, run_id_, loaded_dir_,
                              c.checkpoint.keep_best},
      *io_group);
  // Fault injection: a rank's own file is the last rank's business, the commit rank 0's.
  const SavePhase phase = save_phase(c.debug.crash_in_checkpoint_phase);
  if (c.debug.crash_in_checkpoint > 0 && layout.rank == (phase == SavePhase::written ? layout.world() - 1 : 0))
    writer_->crash_at(c.debug.crash_in_checkpoint, phase);
  const int64_t failing =
      c.debug.fail_checkpoint_write_rank < 0 ? layout.world() - 1 : c.debug.fail_checkpoint_write_rank;
  if (c.debug.fail_checkpoint_write > 0 && layout.rank == failing)
    writer_->fail_write_at(c.debug.fail_checkpoint_write);
  if (c.debug.fail_checkpoint_commit > 0 && layout.rank == 0) writer_->fail_commit_at(c.debug.fail_checkpoint_commit);
}

bool TrainState::writes(const ParamRef& p) const {
  // One copy of each logical tensor is written: the owner's (not a REPLICA), from the first
  // data-parallel replica of dense tensors and the first edp replica of an expert shard.
  const MeshLayout& m = job_.mesh().layout();
  return !p.replica() && (p.expert() ? m.edp_index == 0 : m.dp_index == 0);
}

std::vector<TensorPiece> TrainState::checkpoint_pieces() const {
  std::vector<TensorPiece> pieces;
  auto add = [&](const std::string& key, const ParamRef& p, const at::Tensor& t) {
    pieces.push_back({key, t, p.shard_dim(), p.shard_offset(), p.global_dim_size()});
  };
  for (ModelPart* part : job_.parts())
    for (const ParamRef& b : part->buffers())
      if (b.persistent() && writes(b)) add(state_keys::model + b.fqn(), b, b.tensor());
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamRef& p = params_[i];
    if (!writes(p)) continue;
    add(state_keys::model + p.fqn(), p, p.tensor());
    // Every shard of a parameter counts the same steps: the first shard's count stands for all.
    if (p.shard_dim() < 0 || p.shard_offset() == 0)
      pieces.push_back({state_keys::step + p.fqn(), optimizer_->steps()[i]});
  }
  // AdamW's moments: with a sharded optimizer every member of a group writes the rows it steps
  // (together they cover each tensor once); else the writer of the parameter writes them.
  const bool sharded = job_.config().parallelism.shard_optimizer;
  for (size_t k = 0; k < optimizer_->pieces().size(); ++k) {
    const OptimPiece& piece = optimizer_->pieces()[k];
    const ParamRef& p = params_[piece.param];
    if (p.replica() || !(sharded || writes(p))) continue;
    pieces.push_back(moment_piece(state_keys::exp_avg + p.fqn(), p, piece, optimizer_->exp_avg()[k]));
    pieces.push_back(moment_piece(state_keys::exp_avg_sq + p.fqn(), p, piece, optimizer_->exp_avg_sq()[k]));
  }
  const int rank = job_.mesh().layout().rank;
  if (rank == 0) {
    // The clipper's state is global (the same on every rank): rank 0 writes it.
    for (const auto& [name, tensor] : job_.clipper().state())
      pieces.push_back({state_keys::clipper + job_.config().clipper.component + "." + name, *tensor});
    for (const auto& [key, tensor] : foreign_clipper_state_) pieces.push_back({key, tensor});
  }
  pieces.push_back({state_keys::rng(rank), at::detail::getDefaultCPUGenerator().get_state()});
  return pieces;
}

TensorPiece TrainState::moment_piece(const std::string& key, const ParamRef& p, const OptimPiece& piece,
                                     const at::Tensor& moment) {
  if (piece.whole) return {key, moment, p.shard_dim(), p.shard_offset(), p.global_dim_size()};
  // Rows of dim 0: of the global tensor, or of this rank's expert shard of it (also along dim 0).
  const bool shard = p.shard_dim() == 0;
  return {key, moment, 0, (shard ? p.shard_offset() : 0) + piece.first_row,
          shard ? p.global_dim_size() : p.tensor().size(0)};
}

void TrainState::save(int64_t step) {
  const JobConfig& c = job_.config();
  const MeshLayout& mesh = job_.mesh().layout();
  // The previous asynchronous save first: its outcome is every rank's at this step.
  settle(step);
  if (!save_failure_.empty()) return;
  Manifest header;
  header.step = step;
  header.run_id = run_id_;
  header.data_position = stream_->position();
  header.tokens_seen = static_cast<int64_t>(stream_->position()) * c.training.seq_len;
  header.lr = schedule_->at(step + 1);
  header.pp = mesh.pp;
  header.dp = mesh.dp;
  header.ep = mesh.ep;
  header.model_plugin = c.model.plugin;
  header.model_component = c.model.component;
  header.clipper_plugin = c.clipper.plugin;
  header.clipper_component = c.clipper.component;
  header.config = job_.tree().resolved_toml();
  header.validation = validation_;
  writer_->save(header, checkpoint_pieces());
  if (!c.checkpoint.async) settle(step);
}

void TrainState::settle(int64_t step) { settle_outcome(writer_->take_outcome(), step); }

void TrainState::settle_outcome(const std::optional<SaveOutcome>& outcome, int64_t step) {
  if (!outcome) return;
  if (outcome->ok()) {
    saved_path_ = outcome->path;
    report_save(*outcome);
    return;
  }
  // Every rank holds the same outcome (the failures travel with the save's gathers) and
  // settles it at the same step, so every rank reports it and all stop together.
  const bool stop = job_.config().checkpoint.on_save_failure == "stop";
  log_line(LogLevel::error,
           cat("checkpoint ", outcome->path, " failed (known to every rank after step ", step, "): ", outcome->failure,
               stop ? "; stopping (checkpoint.on_save_failure = \"stop\")"
                    : "; training continues (checkpoint.on_save_failure = \"continue\")"));
  if (stop && save_failure_.empty()) save_failure_ = cat("checkpoint ", outcome->path, " failed: ", outcome->failure);
}

void TrainState::report_save(const SaveOutcome& outcome) const {
  const SaveTiming& t = outcome.timing;
  const double mb = static_cast<double>(t.bytes) / 1e6;
  std::string how = job_.config().checkpoint.async
                        ? format("training blocked %.3f s of %.3f s (%.0f%% hidden)", t.blocked_seconds,
                                 t.total_seconds, 100.0 * (1.0 - t.blocked_seconds / std::max(t.total_seconds, 1e-9)))
                        : format("%.3f s", t.total_seconds);
  if (job_.mesh().layout().rank == 0)
    log_info(format("checkpoint %s: %.1f MB from this rank, %s, %.0f MB/s", outcome.path.c_str(), mb, how.c_str(),
                    mb / std::max(t.total_seconds, 1e-9)));
}

void TrainState::save_weights(const std::string& path, int64_t step, bool with_optimizer) const {
  // The checkpoint's pieces under the file's names: "model.<fqn>" as the bare FQN, AdamW's
  // state kept when asked for; clipper and random state are a checkpoint's business only.
  std::vector<TensorPiece> pieces;
  for (TensorPiece& piece : checkpoint_pieces()) {
    if (piece.key.starts_with(state_keys::model))
      piece.key.erase(0, state_keys::model.size());
    else if (!with_optimizer || !piece.key.starts_with("optim."))
      continue;
    pieces.push_back(std::move(piece));
  }
  std::vector<std::pair<std::string, at::Tensor>> whole = consolidate(pieces, job_.mesh().group(KEEL_GROUP_WORLD));
  if (job_.mesh().layout().rank != 0) return;
  fs::create_directories(fs::path(path).parent_path());
  write_safetensors(
      path, whole, {{"format", "keel-weights"}, {"step", std::to_string(step)}, {"model", job_.config().model.plugin}});
}

}  // namespace keel
