// The trainer's state as checkpoint entries and back: parameters and persistent buffers
// ("model.<fqn>"), AdamW's moments and step counts ("optim.exp_avg.<fqn>", ...), the clipper's
// state ("clipper.<name>.<tensor>"), every rank's CPU generator ("rng.cpu.rank<R>") and, in the
// manifest, the step, the data position and the provenance (the run id). Also the checkpoint
// folder's bookkeeping at start (interrupted saves finished, the run id agreed, a fresh run
// refused where another run's checkpoints are) and the outcome of every save. One copy of each logical tensor is
// written (Trainer::writes); every holder of a copy — REPLICA copies included — loads it, so
// replicas come back bitwise equal without a resync.
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/text.hpp"
#include "train/replica_guard.hpp"
#include "train/trainer.hpp"

namespace keel {

namespace {

const std::string kModel = "model.", kExpAvg = "optim.exp_avg.", kExpAvgSq = "optim.exp_avg_sq.", kStep = "optim.step.",
                  kClipper = "clipper.";

std::string rng_key(int rank) { return "rng.cpu.rank" + std::to_string(rank); }

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

}  // namespace

std::vector<TensorPiece> Trainer::checkpoint_pieces() const {
  std::vector<TensorPiece> pieces;
  auto add = [&](const std::string& key, const ParamRef& p, const at::Tensor& t) {
    pieces.push_back({key, t, p.shard_dim, p.shard_offset, p.global_dim_size});
  };
  for (ModelPart* part : job_.parts())
    for (const ParamRef& b : part->buffers())
      if (b.persistent() && writes(b)) add(kModel + b.fqn, b, *b.tensor);
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamRef& p = params_[i];
    if (!writes(p)) continue;
    add(kModel + p.fqn, p, *p.tensor);
    add(kExpAvg + p.fqn, p, optimizer_->exp_avg()[i]);
    add(kExpAvgSq + p.fqn, p, optimizer_->exp_avg_sq()[i]);
    // Every shard of a parameter counts the same steps: the first shard's count stands for all.
    if (p.shard_dim < 0 || p.shard_offset == 0) pieces.push_back({kStep + p.fqn, optimizer_->steps()[i]});
  }
  const int rank = job_.mesh().layout().rank;
  if (rank == 0) {
    // The clipper's state is global (the same on every rank): rank 0 writes it.
    for (const auto& [name, tensor] : job_.clipper().state())
      pieces.push_back({kClipper + job_.config().clipper.component + "." + name, *tensor});
    for (const auto& [key, tensor] : foreign_clipper_state_) pieces.push_back({key, tensor});
  }
  pieces.push_back({rng_key(rank), at::detail::getDefaultCPUGenerator().get_state()});
  return pieces;
}

void Trainer::open_checkpoint_dir() {
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
  const std::vector<std::string> held = found["held"].get<std::vector<std::string>>();
  if (!resumes && c.checkpoint.interval > 0 && !held.empty()) {
    std::vector<std::string> shown(held.begin(),
                                   held.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(held.size(), 3)));
    throw InputError(cat("checkpoint.dir ", c.checkpoint.dir, " holds checkpoints of another run (", join(shown, ", "),
                         held.size() > shown.size() ? ", ..." : "", "); this run starts at step 0",
                         loaded_ ? " (checkpoint.load_model_only)" : "",
                         ": set checkpoint.load (\"latest\" resumes the newest) or choose another checkpoint.dir"));
  }
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

void Trainer::save_checkpoint(int64_t step) {
  const JobConfig& c = job_.config();
  const MeshLayout& mesh = job_.mesh().layout();
  // The previous asynchronous save first: its outcome is every rank's at this step.
  settle(checkpoints_->take_outcome(), step);
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
  checkpoints_->save(header, checkpoint_pieces());
  if (!c.checkpoint.async) settle(checkpoints_->take_outcome(), step);
}

void Trainer::settle(const std::optional<SaveOutcome>& outcome, int64_t step) {
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

void Trainer::report_save(const SaveOutcome& outcome) {
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

void Trainer::load_model_state(CheckpointReader& reader) {
  const JobConfig& c = job_.config();
  const Manifest& m = reader.manifest();
  if (m.model_component != c.model.component)
    throw InputError(cat("checkpoint ", reader.dir(), " holds model '", m.model_component, "' (plugin ", m.model_plugin,
                         "); this job trains '", c.model.component, "'"));
  // Each rank reads its parts; what failed and which keys were taken are then agreed across
  // the world, so a refusal on one rank is every rank's (none waits in a later collective), and
  // a model entry no rank took (a checkpoint of a larger model: weights that would silently be
  // dropped) is refused too.
  std::string problem;
  nlohmann::json taken = nlohmann::json::array();
  try {
    for (ModelPart* part : job_.parts()) {
      for (const ParamRef& p : part->parameters()) {
        reader.read(kModel + p.fqn, *p.tensor, p.shard_dim, p.shard_offset, p.global_dim_size);
        taken.push_back(kModel + p.fqn);
      }
      for (const ParamRef& b : part->buffers())
        if (b.persistent()) {
          reader.read(kModel + b.fqn, *b.tensor, b.shard_dim, b.shard_offset, b.global_dim_size);
          taken.push_back(kModel + b.fqn);
        }
    }
  } catch (const InputError& e) {
    problem = e.what();
  }
  std::set<std::string> read_somewhere;
  const std::vector<std::string> reports = all_gather_bytes(
      job_.mesh().group(KEEL_GROUP_WORLD), nlohmann::json{{"problem", problem}, {"taken", taken}}.dump());
  for (size_t rank = 0; rank < reports.size(); ++rank) {
    const nlohmann::json report = nlohmann::json::parse(reports[rank]);
    if (!report.at("problem").get<std::string>().empty())
      throw InputError(cat("rank ", rank, ": ", report.at("problem").get<std::string>()));
    for (const auto& key : report.at("taken")) read_somewhere.insert(key.get<std::string>());
  }
  std::vector<std::string> unused;
  for (const auto& [key, entry] : m.entries)
    if (starts_with(key, kModel) && read_somewhere.count(key) == 0) unused.push_back(key);
  if (!unused.empty())
    throw InputError(
        cat("checkpoint ", reader.dir(), ": ", unused.size(), " model entr", unused.size() == 1 ? "y" : "ies",
            " this model has no place for (",
            join(std::vector<std::string>(unused.begin(), unused.begin() + std::min<size_t>(unused.size(), 5)), ", "),
            unused.size() > 5 ? ", ..." : "", "): a checkpoint of another model shape?"));
  if (job_.mesh().layout().rank == 0)
    log_info(format("loaded the model of %s (step %ld, saved under pp %d x dp %d, ep %d)", reader.dir().c_str(),
                    static_cast<long>(m.step), m.pp, m.dp, m.ep));
  if (c.debug.replica_check_interval > 0) {
    // Before post_init: the loaded copies must already be equal, with no resync.
    check_replicas(params_, job_.mesh().group(KEEL_GROUP_WORLD), m.step);
    if (job_.mesh().layout().rank == 0) log_info("replica guard after load: every copy bitwise equal");
  }
}

void Trainer::load_training_state(CheckpointReader& reader) {
  const JobConfig& c = job_.config();
  const Manifest& m = reader.manifest();
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamRef& p = params_[i];
    reader.read(kExpAvg + p.fqn, optimizer_->exp_avg()[i], p.shard_dim, p.shard_offset, p.global_dim_size);
    reader.read(kExpAvgSq + p.fqn, optimizer_->exp_avg_sq()[i], p.shard_dim, p.shard_offset, p.global_dim_size);
    reader.read(kStep + p.fqn, optimizer_->steps()[i]);
  }
  // The clipper: its own state when the checkpoint has it (saved by this clipper, or carried
  // through a run with another one); another clipper's state is kept for this run's
  // checkpoints but not used.
  const std::string mine = kClipper + c.clipper.component + ".";
  const bool first_rank = job_.mesh().layout().rank == 0;
  std::vector<std::pair<std::string, at::Tensor*>> state = job_.clipper().state();
  bool restored = !state.empty();
  for (const auto& [name, tensor] : state) restored = restored && reader.has(mine + name);
  if (restored)
    for (const auto& [name, tensor] : state) reader.read(mine + name, *tensor);
  size_t foreign = 0;
  for (const auto& [key, entry] : m.entries)
    if (starts_with(key, kClipper) && !starts_with(key, mine)) {
      ++foreign;
      if (first_rank) foreign_clipper_state_.emplace_back(key, reader.read_whole(key));
    }
  if (m.clipper_component == c.clipper.component && !restored && !state.empty())
    log_warn(cat("checkpoint ", reader.dir(), " has no state for clipper '", c.clipper.component,
                 "' (saved by an older version?); it starts fresh"));
  if (m.clipper_component != c.clipper.component && first_rank)
    log_info(cat("checkpoint saved with clipper '", m.clipper_component, "'; this run clips with '",
                 c.clipper.component, "', whose state ",
                 restored        ? "is restored from the checkpoint"
                 : state.empty() ? "is empty"
                                 : "starts fresh",
                 foreign > 0 ? cat("; ", foreign, " other clipper state tensor(s) kept, unused") : std::string()));
  // Random state: each rank its own when the world is the same; none is used by Keel itself.
  const MeshLayout& mesh = job_.mesh().layout();
  if (m.pp * m.dp == mesh.world() && reader.has(rng_key(mesh.rank))) {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    // The state is read into a tensor shaped like this generator's own, so a crafted entry of
    // another dtype or size is an InputError naming it, never LibTorch's own refusal.
    at::Tensor state = generator.get_state();
    reader.read(rng_key(mesh.rank), state);
    generator.set_state(state);
  }
  stream_->seek(m.data_position);
  start_step_ = m.step;
  lr_.fill_(schedule_->at(m.step + 1));
  if (mesh.rank == 0)
    log_info(cat("resuming after step ", m.step, " at sample ", m.data_position, " of the data stream (", m.tokens_seen,
                 " tokens seen)"));
}

}  // namespace keel
