// The step as a person reads it in the log, on a 120-column terminal: the host's figures on one
// line, the plugins' figures after them or on continuation lines. A family of per-layer figures
// (two or more metrics sharing the name before the first '.', such as
// load_max_over_mean.layers.3) shows as its maximum; metrics.jsonl keeps every one.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "metrics/metrics_log.hpp"

namespace keel {

/// One figure of the log line.
struct LogFigure {
  std::string label;
  double value;
};

/// The plugin metrics as the log shows them, in name order: a family of two or more dotted names
/// sharing the part before the first '.' (per-layer figures) becomes one "<name> max" figure (NaN
/// if any is NaN), unless each member is simply numbered ("mtp_loss.1": per depth, all shown).
std::vector<LogFigure> log_figures(const std::map<std::string, double>& metrics);

/// The log lines of `record`: the host's figures (step first), then the plugins' (and a
/// skipped update), packed on lines of at most `width` characters; continuation lines start
/// with two spaces.
std::vector<std::string> step_lines(const StepRecord& record, size_t width = 100);

}  // namespace keel
