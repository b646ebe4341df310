// The training state of one rank as checkpoints hold it, over a run: the checkpoint folder's
// bookkeeping at start (interrupted saves finished, the run id agreed, a fresh run refused
// where another run's checkpoints are), the checkpoint to start from, every save and its
// outcome, and the weights files. Entries (state_keys.hpp): parameters and persistent buffers
// ("model.<fqn>"), AdamW's moments and step counts ("optim.exp_avg.<fqn>", ...), the clipper's
// state ("clipper.<name>.<tensor>", another clipper's carried through), every rank's CPU
// generator ("rng.cpu.rank<R>") and, in the manifest, the step, the data position and the
// provenance (the run id). One copy of each logical tensor is written (writes()); every holder
// of a copy, REPLICA copies included, loads it, so replicas come back bitwise equal without a
// resync.
//
// Its life follows the trainer's setup: constructed once the parameters exist, load_model()
// before model.post_init, start() once the optimizer and the data stream exist.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint_reader.hpp"
#include "checkpoint/checkpoint_writer.hpp"
#include "data/batch_stream.hpp"
#include "optim/adamw.hpp"
#include "optim/lr_schedule.hpp"
#include "train/job.hpp"

namespace keel {

/// The checkpointed state of this rank's training.
class TrainState {
 public:
  /// Opens checkpoint.dir (rank 0 finishes interrupted saves and draws a run id; every rank
  /// takes its findings) and the checkpoint named by checkpoint.load, if any. `params` are the
  /// parameters of this rank's parts, in the optimizer's order; they must outlive this.
  /// [collective: world]
  TrainState(Job& job, const std::vector<ParamRef>& params);
  ~TrainState();
  TrainState(const TrainState&) = delete;
  TrainState& operator=(const TrainState&) = delete;

  /// Loads the model's entries of the checkpoint (parameters, persistent buffers) after the
  /// ranks together verified every shard; no-op without one. Before model.post_init: loaded
  /// replicas must already be equal. [collective: world]
  void load_model();
  /// Takes the rest of the training state: loads it from the checkpoint (AdamW, clipper,
  /// generator, data position; not with checkpoint.load_model_only), then opens the checkpoint
  /// writer (checkpoint.interval > 0, with the debug fault injection). Returns the step the run
  /// resumes after (0 when it starts fresh). [collective: world]
  int64_t start(AdamW& optimizer, BatchStream& stream, const LrSchedule& schedule);

  /// Keeps the figures of the evaluation after `record.step` for every later checkpoint's
  /// manifest (keel-ckpt ls, checkpoint.keep_best). Called on every rank with the same figures.
  void record_validation(const ValidationRecord& record) { validation_ = record; }
  /// The last evaluation recorded, this run's or, on a resume, the loaded checkpoint's.
  const std::optional<ValidationRecord>& last_validation() const { return validation_; }
  /// Whether this run saves checkpoints.
  bool saves() const { return writer_ != nullptr; }
  /// Saves a checkpoint of the state after `step` (asynchronously with checkpoint.async),
  /// settling the previous save first. [collective: world]
  void save(int64_t step);
  /// Settles the outcome of a save that finished: a success is reported, a failure logged on
  /// every rank (the same step on each) and, with checkpoint.on_save_failure = "stop", kept in
  /// save_failure().
  void settle(int64_t step);
  /// Whether this rank's background save has finished with a failure (not yet settled).
  bool background_failed() const { return writer_ && writer_->background_failed(); }
  /// The failed save that stops the run, or "".
  const std::string& save_failure() const { return save_failure_; }
  /// The last complete checkpoint of this run, or "".
  const std::string& saved_path() const { return saved_path_; }
  /// This run's id: fresh, or the resumed checkpoint's.
  const std::string& run_id() const { return run_id_; }

  /// Writes the logical parameters and persistent buffers (under their FQNs), consolidated on
  /// rank 0, to `path` as safetensors; with `with_optimizer` also AdamW's moments and step
  /// counts. [collective: world]
  void save_weights(const std::string& path, int64_t step, bool with_optimizer) const;

 private:
  void open_checkpoint_dir();
  void refuse_another_runs_checkpoints(const std::vector<std::string>& held) const;
  void open_writer();
  std::vector<TensorPiece> checkpoint_pieces() const;
  bool writes(const ParamRef& p) const;
  /// AdamW's state of `piece` (moments under `key`) as a piece of the logical tensor.
  static TensorPiece moment_piece(const std::string& key, const ParamRef& p, const OptimPiece& piece,
                                  const at::Tensor& moment);
  void load_model_state(CheckpointReader& reader);
  int64_t load_training_state(CheckpointReader& reader);
  void load_clipper_state(CheckpointReader& reader);
  void load_generator(CheckpointReader& reader);
  void settle_outcome(const std::optional<SaveOutcome>& outcome, int64_t step);
  void report_save(const SaveOutcome& outcome) const;

  Job& job_;
  const std::vector<ParamRef>& params_;
  AdamW* optimizer_ = nullptr;  ///< from start()
  BatchStream* stream_ = nullptr;
  const LrSchedule* schedule_ = nullptr;
  std::unique_ptr<CheckpointReader> loaded_;  ///< the checkpoint to start from, until start()
  std::chrono::steady_clock::time_point load_start_;
  std::unique_ptr<CheckpointWriter> writer_;
  std::string run_id_;        ///< this run's id: fresh, or the resumed checkpoint's
  std::string loaded_dir_;    ///< the checkpoint a resumed run continues, or ""
  std::string saved_path_;    ///< the last complete checkpoint of this run
  std::string save_failure_;  ///< a failed save that stops the run
  std::optional<ValidationRecord> validation_;
  /// Another clipper's state found in the loaded checkpoint: carried into every checkpoint
  /// this run saves (rank 0), so swapping clippers back and forth loses nothing.
  std::vector<std::pair<std::string, at::Tensor>> foreign_clipper_state_;
};

}  // namespace keel
