// The training loop of one rank, in keel.h's call sequence:
//   schedule (forward/backward over microbatches and pipeline stages) -> DP gradient reduction
//   -> the step program (model.pre_clip -> clipper.clip -> non-finite check -> AdamW; a CUDA
//   graph on CUDA) -> model.post_step
//   -> LR update -> replica guard -> metrics -> (final) weights.
// Beside it: TrainState (what checkpoints hold, loading and saving it) and StepLog (the logged
// steps).
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/batch_stream.hpp"
#include "data/token_source.hpp"
#include "grad_sync/grad_buckets.hpp"
#include "metrics/metrics_log.hpp"
#include "optim/adamw.hpp"
#include "optim/lr_schedule.hpp"
#include "optim/param_gather.hpp"
#include "optim/step_program.hpp"
#include "pipeline/pipeline_runner.hpp"
#include "train/evaluator.hpp"
#include "train/gradient_scatter.hpp"
#include "train/job.hpp"
#include "train/train_state.hpp"

namespace keel {

/// What a finished run reports.
struct RunSummary {
  int64_t steps_done = 0;
  double first_loss = 0, final_loss = 0;
  std::map<std::string, double> first_metrics, final_metrics;  ///< plugin metrics of the logged steps
  std::optional<double> loss_floor;
  int stop_signal = 0;  ///< the signal that stopped the run early, or 0
  std::string weights_path;
  std::string checkpoint_path;  ///< the last checkpoint saved, or ""
  std::string run_id;           ///< recorded in every checkpoint this run saves
  std::string save_failure;     ///< the failed save that stopped the run (checkpoint.on_save_failure = "stop")
  std::string data_failure;     ///< the batch no rank could train on: run() saves the last step, then throws it
  int64_t replica_checks = 0;   ///< replica-guard passes (each compared every copy of every parameter)
  std::optional<Evaluation> first_validation, last_validation;  ///< this run's first and last evaluations
};

/// Trains a built Job.
class Trainer {
 public:
  /// Initialises weights (or loads them with the rest of the training state from
  /// checkpoint.load), synchronises replicas (model.post_init), lays out gradients, binds the
  /// clipper, allocates optimizer state.
  explicit Trainer(Job& job);
  ~Trainer();
  /// Runs every step (or until SIGINT/SIGTERM, or a failed save), then saves final weights. A
  /// failed save stops the run after the step at which every rank learnt of it (with
  /// checkpoint.on_save_failure = "stop"); the final weights are still written, then run()
  /// throws, naming the failure, on every rank. A batch that some rank cannot read (DataFault)
  /// stops every rank before that step: the last whole step is checkpointed (when checkpoints
  /// are saved), then run() throws the DataFault on every rank.
  RunSummary run();
  /// Runs one step; returns its loss when `read_loss` (otherwise 0, avoiding a device sync).
  double step(int64_t step, bool read_loss);
  /// Saves a checkpoint of the state after `step` (asynchronously with checkpoint.async).
  /// [collective: world]
  void save_checkpoint(int64_t step) { state_->save(step); }
  /// The total gradient norm of the last step (reads the device).
  double last_grad_norm() const { return last_norm_.item<double>(); }
  /// Evaluates the weights after `step` on the validation data (needs validation.interval > 0).
  /// [collective: world]
  Evaluation evaluate(int64_t step);
  /// The optimizer (for tests and checkpoints).
  const AdamW& optimizer() const { return *optimizer_; }
  /// With `on`, every step waits for the device around the step program and times it (for
  /// benchmarks; it adds two synchronisations per step).
  void time_step_program(bool on) { time_program_ = on; }
  /// The step program's duration in the last step, when timed.
  double step_program_seconds() const { return program_seconds_; }
  /// Whether the step program now replays a captured CUDA graph.
  bool step_program_captured() const { return program_->captured(); }
  /// Writes the logical parameters and persistent buffers (under their FQNs), consolidated on
  /// rank 0, to `path` as safetensors; with `with_optimizer` also AdamW's moments and step
  /// counts ("optim.exp_avg.<fqn>", ...). [collective: world]
  void save_weights(const std::string& path, int64_t step, bool with_optimizer = false) const {
    state_->save_weights(path, step, with_optimizer);
  }

 private:
  /// What stops the run after a step, agreed by every rank.
  struct Stop {
    int signal = 0;            ///< SIGINT/SIGTERM reached some rank
    bool save_failed = false;  ///< some rank's background save finished with a failure
  };
  // Setup, in order.
  void init_parameters();
  void post_init();
  void build_optimizer();
  void scatter_gradients();  // [collective: world]
  void log_state_memory();   // [collective: world]
  void build_step_program();
  void open_data();
  // The step.
  std::vector<at::Tensor> keep_buffers() const;
  void put_back_buffers_if_skipped(const std::vector<at::Tensor>& kept, const at::Tensor& found_inf);
  void report_pipeline_bubble();
  void poison_gradient(int64_t step);
  // The loop and the end of the run.
  Stop agreed_stop();
  bool stops_after(int64_t step, RunSummary& summary);
  void checkpoint(int64_t step);
  void finish_checkpoints(RunSummary& summary);
  void report_replica_checks(RunSummary& summary) const;
  void save_final_weights(RunSummary& summary) const;
  void throw_if_save_failed(RunSummary& summary) const;

  Job& job_;
  std::vector<ParamRef> params_;
  std::vector<size_t> chunk_params_;  ///< part k's parameters are params_[chunk_params_[k], chunk_params_[k + 1])
  std::vector<ParamRef> persistent_buffers_;  ///< restored after a skipped step
  std::vector<const keel_param_info*> param_infos_;
  std::unique_ptr<GradientBuckets> grads_;
  std::unique_ptr<PipelineRunner> runner_;
  std::unique_ptr<Evaluator> evaluator_;  ///< with validation.interval > 0
  std::unique_ptr<TokenSource> source_;
  std::unique_ptr<BatchStream> stream_;
  std::string data_origin_;  // where the batches come from, for a failed read's message
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<ParameterGather> gather_;  ///< with parallelism.shard_optimizer
  bool scatter_grads_ = false;               ///< the clipper clips owned rows (buckets may be reduce-scattered)
  OwnedGradients owned_grads_;               ///< those rows
  std::unique_ptr<LrSchedule> schedule_;
  std::unique_ptr<StepProgram> program_;
  at::Tensor lr_;
  at::Tensor last_norm_, last_found_inf_, last_loss_;
  int64_t replica_checks_ = 0;
  bool time_program_ = false;
  double program_seconds_ = 0;
  int64_t start_step_ = 0;
  bool poisons_ = false;     ///< this step poisons a gradient after the backward (debug.nan_grad_step)
  int64_t saved_step_ = -1;  ///< the step this run last saved a checkpoint of
  /// Declared last, destroyed first: a background save finishes before what it saves goes.
  std::unique_ptr<TrainState> state_;
};

}  // namespace keel
