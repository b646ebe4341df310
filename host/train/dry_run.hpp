// keel-train --dry-run: the configured layout built on the meta device (nothing allocated),
// one view per distinct rank part (pipeline stage x expert shard), with the logical model's
// parameter counts per module group, total and activated.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "train/job.hpp"

namespace keel {

/// Parameter counts of one module group (or of everything).
struct ParamCount {
  int64_t total = 0;
  double activated = 0;
  int64_t replicas = 0;  ///< elements held as REPLICA copies (not counted in total)
};

/// Counts per module group over this rank's parts, expert shards counted at their global
/// size; key "" holds the sum of every group.
std::map<std::string, ParamCount> count_parameters(const Job& job);

/// Builds every rank part of the configured layout from this one process and prints each
/// (stage, layers, expert shard, local parameters, replicas) and the logical totals.
void print_dry_run(const RunOptions& options);

}  // namespace keel
