// The step log: a human line every metrics.log_interval steps (metrics/log_line.hpp) and the
// same record, every figure of it, as one JSON object per line in <run_dir>/metrics.jsonl. A non-finite value is "nan"
// in the line and the string "nan" / "inf" / "-inf" in the JSON (metrics/json_number.hpp): never fatal.
#pragma once

#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace keel {

/// One logged step.
struct StepRecord {
  int64_t step = 0, total_steps = 0;
  double loss = 0, grad_norm = 0, lr = 0;
  double tokens_per_second = 0, eta_seconds = 0;
  double peak_memory_bytes = 0;             ///< the largest of peak_memory_by_rank
  std::vector<double> peak_memory_by_rank;  ///< each rank's peak so far, by world rank
  bool skipped = false;                     ///< the update was skipped (non-finite gradients)
  std::map<std::string, double> plugin_metrics;
  /// The evaluation after this step, if any: "val_loss", the model's "val_<name>" figures,
  /// "val_tokens" and "val_seconds".
  std::map<std::string, double> validation;
  /// The folder of the profiler traces (one per rank) of the window this step closes, or "".
  std::string profile_traces;
  /// With [[data.sources]]: the tokens drawn from each source since the run's first step.
  std::map<std::string, double> source_tokens;
};

/// Writes step records to the log and to metrics.jsonl.
class MetricsLog {
 public:
  /// `jsonl_path` empty disables the JSON lines file. An existing file is continued: records
  /// of steps after `resume_after_step` (a run that died after its last checkpoint) are dropped,
  /// so a resumed run's records follow without duplicates.
  explicit MetricsLog(const std::string& jsonl_path, int64_t resume_after_step = 0);
  /// Logs one step.
  void write(const StepRecord& record);

 private:
  std::optional<std::ofstream> jsonl_;
};

}  // namespace keel
