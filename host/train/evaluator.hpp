// Held-out evaluation during training ([validation]): every `interval` steps and after the last
// one, `steps` batches of the validation source go through the model, forward only, over the
// run's pp x dp x ep layout (PipelineRunner::evaluate). An evaluation leaves no trace in
// training: no autograd graph and no gradient, no optimizer step or post_step (DeepSeek-V3's
// expert bias routes but is not moved), every model buffer and the CPU generator put back as
// they were, the training stream's position untouched, and the model's metric reports of the
// evaluation kept apart from the step's.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "data/batch_stream.hpp"
#include "data/token_source.hpp"
#include "pipeline/pipeline_runner.hpp"
#include "train/job.hpp"

namespace keel {

/// The figures of one evaluation, the same on every rank.
struct Evaluation {
  int64_t step = 0;
  double loss = 0;                        ///< the training objective, token-weighted over every batch and dp rank
  std::map<std::string, double> metrics;  ///< the model's reports during the evaluation, named "val_<name>"
  int64_t tokens = 0;                     ///< labelled tokens evaluated (all dp ranks)
  double seconds = 0;                     ///< wall time of the evaluation on this rank
  /// "val_loss" and the model's figures, as logs and manifests record them.
  std::map<std::string, double> figures() const;
};

/// Evaluates the model of a Job on its validation source.
class Evaluator {
 public:
  /// `runner` runs this rank's part; `source` is the validation source (data_sources.hpp) and
  /// `document_end` the EOS id whose labels are ignored, as in training.
  Evaluator(Job& job, PipelineRunner& runner, std::unique_ptr<TokenSource> source, std::optional<int64_t> document_end);
  /// Whether an evaluation follows `step`: a multiple of validation.interval or the last step.
  bool due(int64_t step) const;
  /// Evaluates the weights after `step` on the validation batches (the same batches each
  /// time). [collective: world]
  Evaluation run(int64_t step);
  /// One line describing the evaluation's data.
  std::string describe() const;

 private:
  Job& job_;
  PipelineRunner& runner_;
  std::unique_ptr<TokenSource> source_;
  std::unique_ptr<BatchStream> stream_;
  std::string data_origin_;  // where the batches come from, for a failed read's message
};

}  // namespace keel
