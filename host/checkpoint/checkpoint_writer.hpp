// Writes checkpoints: `<root>/step-<N>/` with one safetensors file per rank and a manifest.
// Every rank writes its pieces into `step-<N>.partial/`; once all finished (a gather of their
// entries, or of their failure, over the checkpoint group), rank 0 writes the manifest, renames
// the folder into place, points `latest` at it and prunes to `keep_latest`; its commit status
// is gathered too, so every rank knows the same outcome of every save. Each step of the commit
// is atomic (rename) and durable (fsync), so a kill at any moment leaves a complete copy of
// every checkpoint that was complete, under its own name or (while a step is being replaced)
// as `step-<N>.old` / a complete `step-<N>.partial`, which recover_interrupted_saves puts back.
// An asynchronous save snapshots the pieces to host memory and returns; the files are written
// by a background thread while training goes on.
//
// Provenance: each save records the run id (in the manifest) and this run's save order (in
// `step-<N>/save.json`), so `keep_latest` prunes only this run's checkpoints, oldest saved
// first, never the one `latest` names nor the one the run loaded from; `keep_best` keeps, on top,
// the run's checkpoints of lowest val_loss (best_checkpoints).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/manifest.hpp"
#include "checkpoint/tensor_piece.hpp"
#include "mesh/group.hpp"

namespace keel {

/// Where a save's time went on this rank.
struct SaveTiming {
  double blocked_seconds = 0;  ///< the training loop waited this long (snapshot, previous save)
  double total_seconds = 0;    ///< from the call to the checkpoint being complete on this rank
  uint64_t bytes = 0;          ///< written by this rank
};

/// What became of one save: the same on every rank of the group.
struct SaveOutcome {
  int64_t step = 0;
  std::string path;     ///< the checkpoint folder
  std::string failure;  ///< "" when complete; else every failure ("rank R: <file>: <cause>"), by rank
  SaveTiming timing;
  bool ok() const { return failure.empty(); }
};

/// The moments of a save at which fault injection can kill a rank.
enum class SavePhase {
  none,
  written,    ///< this rank's file is written (the last rank dies)
  gathered,   ///< every rank's file is written, no manifest yet (rank 0)
  manifest,   ///< the manifest is in `step-<N>.partial/`
  displaced,  ///< a replaced step moved to `step-<N>.old/`, the new one not yet in place
  renamed,    ///< `step-<N>/` in place, `latest` not yet updated
  latest,     ///< `latest` names the new checkpoint, nothing pruned yet
  pruned,     ///< the save is complete
};

/// The phase named `name` ("written", ..., "pruned").
SavePhase save_phase(const std::string& name);

/// How a CheckpointWriter saves.
struct CheckpointWriterOptions {
  std::string root;         ///< the checkpoint folder
  int64_t keep_latest = 0;  ///< this run's checkpoints kept; 0 = all
  bool async = false;
  std::string run_id;      ///< recorded in every manifest; pruning touches only checkpoints with this id
  std::string loaded_dir;  ///< the checkpoint this run loaded, never pruned ("" = none)
  int64_t keep_best = 0;   ///< also kept: this run's N checkpoints of lowest val_loss (best_checkpoints)
};

/// A checkpoint of the run and the validation figures its manifest records.
struct RankedCheckpoint {
  std::string dir;
  int64_t step = 0;
  std::optional<ValidationRecord> validation;
};

/// The `keep` checkpoints of lowest val_loss among `checkpoints`: only those whose evaluation
/// was of their own weights (validation.step == step) and whose val_loss is finite; a tie
/// goes to the earlier step. Returns their folders.
std::vector<std::string> best_checkpoints(const std::vector<RankedCheckpoint>& checkpoints, int64_t keep);

class CheckpointWriter {
 public:
  /// Saves under `options.root`, coordinating over `group`: every rank of the job, a group of
  /// its own so that a background save never interleaves with the training's collectives.
  CheckpointWriter(CheckpointWriterOptions options, Group& group);
  /// Waits for a save in flight; a failure not yet taken is logged.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  /// Saves checkpoint `header.step` with this rank's `pieces` (rank 0's header is written;
  /// its entries, run id and save order are filled here). Waits for the previous save first.
  /// I/O failures do not throw: they become the save's outcome (take_outcome). [collective: group]
  void save(const Manifest& header, std::vector<TensorPiece> pieces);
  /// Whether a background save has finished and failed on this rank (its outcome is ready and
  /// every other rank's will be the same). Never blocks.
  bool background_failed() const { return worker_.joinable() && done_.load() && failed_.load(); }
  /// Waits for the save in flight (if any) and returns the oldest outcome not yet taken.
  std::optional<SaveOutcome> take_outcome();

  /// Fault injection for tests: this rank kills itself (SIGKILL) at `phase` of saving `step`.
  void crash_at(int64_t step, SavePhase phase) {
    crash_step_ = step;
    crash_phase_ = phase;
  }
  /// Fault injection for tests: this rank's file of checkpoint `step` fails to be written.
  void fail_write_at(int64_t step) { fail_write_step_ = step; }
  /// Fault injection for tests: rank 0's commit of checkpoint `step` fails.
  void fail_commit_at(int64_t step) { fail_commit_step_ = step; }

  /// This rank's file in a checkpoint folder.
  static std::string file_name(int rank);

 private:
  SaveOutcome write_and_commit(const Manifest& header, const std::vector<TensorPiece>& pieces, double blocked,
                               double started);
  void commit(Manifest manifest, const std::vector<std::string>& gathered);
  void prune() const;
  int64_t next_save_number() const;
  void crash_if(int64_t step, SavePhase phase) const;
  void join();

  CheckpointWriterOptions options_;
  Group& group_;
  std::thread worker_;
  std::atomic<bool> done_{false}, failed_{false};
  SaveOutcome background_;
  std::deque<SaveOutcome> outcomes_;
  int64_t crash_step_ = -1, fail_write_step_ = -1, fail_commit_step_ = -1;
  SavePhase crash_phase_ = SavePhase::none;
};

/// Finishes saves a kill interrupted under `root`: a step whose folder is missing gets back its
/// complete `step-<N>.partial/` (the newer copy) or else its `step-<N>.old/`. Returns what it
/// did, one line per step. Run by one rank before anyone resolves a checkpoint of `root`.
std::vector<std::string> recover_interrupted_saves(const std::string& root);

/// The complete checkpoints (`step-<N>/` with a manifest) under `root`, by name.
std::vector<std::string> complete_checkpoints(const std::string& root);

/// A fresh run id: 16 hex digits from std::random_device.
std::string new_run_id();

/// Whether `id` has the shape of a run id (1 to 64 hex digits).
bool valid_run_id(const std::string& id);

}  // namespace keel
