// The loop of a run: step, log, checkpoint, and the stop every rank agrees on; then the end of
// the run (the last checkpoint, the final weights, a failed save's verdict).
#include <csignal>
#include <filesystem>
#include <optional>
#include <stdexcept>

#include "common/log.hpp"
#include "common/text.hpp"
#include "common/trace_scope.hpp"
#include "profiling/trace_window.hpp"
#include "train/data_fault.hpp"
#include "train/source_tally.hpp"
#include "train/step_log.hpp"
#include "train/stop_signal.hpp"
#include "train/trainer.hpp"

namespace keel {

namespace fs = std::filesystem;

namespace {

/// Keeps a logged step's loss and metrics in the summary (the run's first, and the last so far).
void remember(RunSummary& summary, const StepRecord& record, bool first) {
  if (first) {
    summary.first_loss = record.loss;
    summary.first_metrics = record.plugin_metrics;
  }
  summary.final_loss = record.loss;
  summary.final_metrics = record.plugin_metrics;
}

void remember(RunSummary& summary, const Evaluation& evaluation) {
  if (!summary.first_validation) summary.first_validation = evaluation;
  summary.last_validation = evaluation;
}

}  // namespace

Evaluation Trainer::evaluate(int64_t step) {
  if (!evaluator_) throw std::logic_error("evaluate: validation.interval is 0");
  KEEL_TRACE_SCOPE("keel::evaluate");
  Evaluation evaluation = evaluator_->run(step);
  state_->record_validation(ValidationRecord{step, evaluation.figures()});
  return evaluation;
}

RunSummary Trainer::run() {
  const int64_t last = job_.config().training.steps, checkpoint_interval = job_.config().checkpoint.interval;
  RunSummary summary;
  summary.loss_floor = source_->loss_floor();
  summary.steps_done = start_step_;
  log_info(source_->describe());
  StepLog log(job_, start_step_);
  install_stop_handlers();
  if (evaluator_ && job_.mesh().layout().rank == 0) log_info(evaluator_->describe());
  TraceWindow profiler(job_.config().profiling, job_.mesh().layout().rank, job_.device().is_cuda());
  SourceTally tally(*source_, job_.config().training.seq_len);
  for (int64_t s = start_step_ + 1; s <= last; ++s) {
    const bool evaluated = evaluator_ && evaluator_->due(s);
    const bool traced = profiler.closes_at(s);
    // An evaluation's figures and a profiled window's traces join their step's record.
    const bool logged = log.logs(s) || evaluated || traced;
    const double lr = schedule_->at(s);
    std::optional<Evaluation> validation;
    profiler.before_step(s);
    try {
      double loss = 0;
      {
        KEEL_TRACE_SCOPE("keel::step");
        loss = step(s, /*read_loss=*/logged);
      }
      log.count_step();
      summary.steps_done = s;
      if (evaluated) remember(summary, validation.emplace(evaluate(s)));
      if (logged)
        remember(summary,
                 log.write(s, loss, lr, last_norm_, last_found_inf_,
                           {validation ? &*validation : nullptr, traced ? profiler.folder_of(s) : "",
                            tally.tokens_until(stream_->position())}),
                 s == start_step_ + 1);
    } catch (const DataFault& e) {
      // Every rank is here at the same step, before any collective of the step's work: the
      // state after the last whole step is consistent and is saved before the run fails.
      summary.data_failure = e.what();
      log_info(cat("stopping after step ", summary.steps_done, ": a batch of step ", s, " could not be read"));
      break;
    }
    if (checkpoint_interval > 0 && s % checkpoint_interval == 0) checkpoint(s);
    const bool stops = stops_after(s, summary);
    profiler.after_step(s, /*stopping=*/stops || s == last);
    if (stops) {
      if (!logged) summary.final_loss = last_loss_.item<double>();
      break;
    }
  }
  // A run that failed before its first step has nothing new to save.
  if (summary.data_failure.empty() || summary.steps_done > start_step_) finish_checkpoints(summary);
  if (!summary.data_failure.empty()) {
    // No "final" weights: the run did not reach its end. The checkpoint holds its progress.
    if (!summary.checkpoint_path.empty() && job_.mesh().layout().rank == 0)
      log_info(cat("checkpoint of step ", summary.steps_done, ": ", summary.checkpoint_path));
    throw DataFault(summary.data_failure);
  }
  report_replica_checks(summary);
  save_final_weights(summary);
  throw_if_save_failed(summary);
  return summary;
}

Trainer::Stop Trainer::agreed_stop() {
  // A signal reaches one rank (or all, at different steps), a background save's failure is
  // known first to whichever rank's thread finishes first: all stop after the same step.
  Group& world = job_.mesh().group(KEEL_GROUP_WORLD);
  const bool failed = state_->background_failed();
  if (world.size() == 1) return {stop_requested(), failed};
  at::Tensor flags = at::tensor({static_cast<double>(stop_requested()), failed ? 1.0 : 0.0}, at::kDouble);
  world.all_reduce(flags, KEEL_REDUCE_MAX);
  return {static_cast<int>(flags[0].item<double>()), flags[1].item<double>() != 0.0};
}

bool Trainer::stops_after(int64_t step, RunSummary& summary) {
  const Stop stop = agreed_stop();
  if (stop.save_failed) state_->settle(step);
  if (!state_->save_failure().empty()) return true;
  if (stop.signal == 0) return false;
  summary.stop_signal = stop.signal;
  log_info(cat("stopping after step ", step, " (", stop.signal == SIGINT ? "SIGINT" : "SIGTERM", ")"));
  return true;
}

void Trainer::checkpoint(int64_t step) {
  KEEL_TRACE_SCOPE("keel::checkpoint");
  if (state_->saves() && saved_step_ != step) {
    state_->save(step);
    saved_step_ = step;
  }
}

void Trainer::finish_checkpoints(RunSummary& summary) {
  // The end, a stop signal included: the last state is saved (a run of no steps after a load
  // saves the loaded state in this run's layout: a resharded copy).
  if (state_->save_failure().empty()) checkpoint(summary.steps_done);
  if (!state_->saves()) return;
  state_->settle(summary.steps_done);
  summary.checkpoint_path = state_->saved_path();
  summary.run_id = state_->run_id();
}

void Trainer::report_replica_checks(RunSummary& summary) const {
  summary.replica_checks = replica_checks_;
  if (replica_checks_ > 0 && job_.mesh().layout().rank == 0)
    log_info(cat("replica guard: ", replica_checks_, " check(s), every copy of every parameter bitwise equal"));
}

void Trainer::save_final_weights(RunSummary& summary) const {
  const JobConfig& c = job_.config();
  const bool writer = job_.mesh().layout().rank == 0;
  const fs::path run_dir = c.job.run_dir;
  if (c.checkpoint.save_final) {
    summary.weights_path = (run_dir / "final" / "model.safetensors").string();
    save_weights(summary.weights_path, summary.steps_done);
    if (writer) log_info(cat("final weights: ", summary.weights_path));
  }
  if (c.debug.dump_state) {
    std::string path = (run_dir / "final" / "state.safetensors").string();
    save_weights(path, summary.steps_done, /*with_optimizer=*/true);
    if (writer) log_info(cat("final state (parameters, buffers, optimizer): ", path));
  }
}

void Trainer::throw_if_save_failed(RunSummary& summary) const {
  if (state_->save_failure().empty()) return;
  // The weights are safe in run_dir; the job still fails, so nobody mistakes it for a run
  // whose checkpoints are all there.
  summary.save_failure = state_->save_failure();
  throw std::runtime_error(cat("stopped after step ", summary.steps_done, ": ", summary.save_failure));
}

}  // namespace keel
