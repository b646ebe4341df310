// keel-train --dry-run: the model built on the meta device (nothing allocated) and its
// parameter counts per part and module group, total and activated.
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

/// Counts per module group over this rank's parts; key "" holds the sum of every group.
std::map<std::string, ParamCount> count_parameters(const Job& job);

/// Prints the dry-run report of this rank.
void print_dry_run(const Job& job);

}  // namespace keel
