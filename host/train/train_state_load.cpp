// TrainState from a checkpoint: the model's entries before post_init, the rest of the training
// state once the optimizer and the data stream exist. Refusals are agreed across the world, so
// a problem one rank finds is every rank's and none waits in a later collective.
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/text.hpp"
#include "train/replica_guard.hpp"
#include "train/state_keys.hpp"
#include "train/train_state.hpp"

namespace keel {

void TrainState::load_model() {
  if (!loaded_) return;
  // The ranks share the verification: together they check every shard's bytes once, and
  // all refuse a damaged checkpoint, whichever rank found the damage.
  const MeshLayout& mesh = job_.mesh().layout();
  for (const std::string& problem :
       all_gather_bytes(job_.mesh().group(KEEL_GROUP_WORLD), loaded_->verify_share(mesh.rank, mesh.world())))
    if (!problem.empty()) throw InputError(problem);
  load_model_state(*loaded_);
}

void TrainState::load_model_state(CheckpointReader& reader) {
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
        reader.read(state_keys::model + p.fqn(), p.tensor(), p.shard_dim(), p.shard_offset(), p.global_dim_size());
        taken.push_back(state_keys::model + p.fqn());
      }
      for (const ParamRef& b : part->buffers())
        if (b.persistent()) {
          reader.read(state_keys::model + b.fqn(), b.tensor(), b.shard_dim(), b.shard_offset(), b.global_dim_size());
          taken.push_back(state_keys::model + b.fqn());
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
    if (key.starts_with(state_keys::model) && read_somewhere.count(key) == 0) unused.push_back(key);
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

int64_t TrainState::load_training_state(CheckpointReader& reader) {
  const Manifest& m = reader.manifest();
  for (size_t i = 0; i < params_.size(); ++i) reader.read(state_keys::step + params_[i].fqn(), optimizer_->steps()[i]);
  // The moments of the rows this rank steps, whatever layout or sharding saved them.
  for (size_t k = 0; k < optimizer_->pieces().size(); ++k) {
    const OptimPiece& piece = optimizer_->pieces()[k];
    const ParamRef& p = params_[piece.param];
    for (const auto& [key, moment] : {std::pair{state_keys::exp_avg, optimizer_->exp_avg()[k]},
                                      std::pair{state_keys::exp_avg_sq, optimizer_->exp_avg_sq()[k]}}) {
      const TensorPiece where = moment_piece(key + p.fqn(), p, piece, moment);
      reader.read(where.key, where.tensor, where.shard_dim, where.shard_offset, where.global_dim_size);
    }
  }
  load_clipper_state(reader);
  load_generator(reader);
  stream_->seek(m.data_position);
  // The figures go on into the checkpoints saved before this run's first evaluation.
  validation_ = m.validation;
  if (job_.mesh().layout().rank == 0)
    log_info(cat("resuming after step ", m.step, " at sample ", m.data_position, " of the data stream (", m.tokens_seen,
                 " tokens seen)"));
  return m.step;
}

void TrainState::load_clipper_state(CheckpointReader& reader) {
  // The clipper: its own state when the checkpoint has it (saved by this clipper, or carried
  // through a run with another one); another clipper's state is kept for this run's
  // checkpoints but not used.
  const JobConfig& c = job_.config();
  const Manifest& m = reader.manifest();
  const std::string mine = state_keys::clipper + c.clipper.component + ".";
  const bool first_rank = job_.mesh().layout().rank == 0;
  std::vector<std::pair<std::string, at::Tensor*>> state = job_.clipper().state();
  bool restored = !state.empty();
  for (const auto& [name, tensor] : state) restored = restored && reader.has(mine + name);
  if (restored)
    for (const auto& [name, tensor] : state) reader.read(mine + name, *tensor);
  size_t foreign = 0;
  for (const auto& [key, entry] : m.entries)
    if (key.starts_with(state_keys::clipper) && !key.starts_with(mine)) {
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
}

void TrainState::load_generator(CheckpointReader& reader) {
  // Random state: each rank its own when the world is the same; none is used by Keel itself.
  const Manifest& m = reader.manifest();
  const MeshLayout& mesh = job_.mesh().layout();
  if (m.pp * m.dp != mesh.world() || !reader.has(state_keys::rng(mesh.rank))) return;
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  // The state is read into a tensor shaped like this generator's own, so a crafted entry of
  // another dtype or size is an InputError naming it, never LibTorch's own refusal.
  at::Tensor state = generator.get_state();
  reader.read(state_keys::rng(mesh.rank), state);
  generator.set_state(state);
}

}  // namespace keel
