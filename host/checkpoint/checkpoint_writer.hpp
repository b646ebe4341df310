// Writes checkpoints: `<root>/step-<N>/` with one safetensors file per rank and a manifest.
// Every rank writes its pieces into `step-<N>.partial/`; once all finished (a gather of their
// entries over the checkpoint group), rank 0 writes the manifest, renames the folder into
// place, points `latest` at it and prunes to `keep_latest`. Each of those is atomic (rename)
// and durable (fsync), so a kill at any moment leaves the previous checkpoint loadable and
// never a partial one that loads. An asynchronous save snapshots the pieces to host memory and
// returns; the files are written by a background thread while training goes on.
#pragma once

#include <exception>
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

class CheckpointWriter {
 public:
  /// Saves under `root`, coordinating over `group`: every rank of the job, a group of its own
  /// so that a background save never interleaves with the training's collectives.
  CheckpointWriter(std::string root, Group& group, int64_t keep_latest, bool async);
  /// Waits for a save in flight; its error, if any, is logged.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  /// Saves checkpoint `header.step` with this rank's `pieces` (rank 0's header is written;
  /// its entries are filled here). Waits for the previous save first. [collective: group]
  void save(const Manifest& header, std::vector<TensorPiece> pieces);
  /// Blocks until the save in flight (if any) is complete; rethrows its error.
  void wait();
  /// The timing of the last completed save.
  const SaveTiming& last_timing() const { return timing_; }
  /// The folder of the last completed save.
  const std::string& last_path() const { return last_path_; }

  /// Fault injection for tests: this rank kills itself (SIGKILL) right after writing its file
  /// of checkpoint `step`, before the checkpoint is complete.
  void crash_after_writing(int64_t step) { crash_step_ = step; }

  /// This rank's file in a checkpoint folder.
  static std::string file_name(int rank);

 private:
  void write_and_commit(const Manifest& header, const std::vector<TensorPiece>& pieces, double blocked, double started);
  void commit(Manifest manifest, const std::vector<std::string>& gathered);
  void prune() const;

  std::string root_;
  Group& group_;
  int64_t keep_latest_;
  bool async_;
  std::thread worker_;
  std::exception_ptr error_;
  SaveTiming timing_, pending_timing_;
  std::string last_path_, pending_path_;
  int64_t crash_step_ = -1;
};

}  // namespace keel
