// The part of the config targets that runs after parsing: the host's validation, plus one
// property the fuzzer cannot see by itself. A config integer that validation accepts must
// reach the JobConfig unchanged: a value that does not fit its field (training.threads =
// 4294967298 running as 2) is silent narrowing, reported as a finding.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "common/text.hpp"
#include "config/component_table.hpp"
#include "config/config_tree.hpp"
#include "config/job_config.hpp"

namespace keel::fuzz {

/// Thrown when an accepted integer reached its field changed (a finding: not an InputError).
class SilentNarrowing : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// Thrown when the resolved configuration of an accepted job does not parse again (a finding:
/// it is saved as config.toml and in every checkpoint's manifest).
class UnparsableResolved : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// read_job_config as a dry run does, then the narrowing check, the component tables, the
/// resolved TOML (which must parse again) and unknown keys.
inline void validate_job_config(ConfigTree& tree) {
  JobConfig config = read_job_config(tree, /*world_size=*/0, /*cuda_available=*/false);
  struct Field {
    const char* section;
    const char* key;
    int64_t fallback;
    int64_t stored;
  };
  const Field fields[] = {{"parallelism", "pp", 1, config.parallelism.pp},
                          {"parallelism", "dp", 1, config.parallelism.dp},
                          {"parallelism", "ep", 1, config.parallelism.ep},
                          {"parallelism", "microbatches", 1, config.parallelism.microbatches},
                          {"parallelism", "timeout_s", 300, config.parallelism.timeout_s},
                          {"training", "threads", 0, config.training.threads}};
  for (const Field& f : fields) {
    int64_t given = tree.section(f.section).integer(f.key, f.fallback);
    if (given != f.stored)
      throw SilentNarrowing(cat(f.section, ".", f.key, " = ", given, " was accepted and stored as ", f.stored));
  }
  // Where the components' keys live, as Job finds them (tables of other components are kept).
  for (const auto& [role, choice] : {std::pair{"model", &config.model}, std::pair{"clipper", &config.clipper}})
    ignored_tables_notice(role, choice->component, component_table(tree, role, choice->component));
  const std::string resolved = tree.resolved_toml();
  try {
    ConfigTree::from_string(resolved, "resolved.toml");
  } catch (const InputError& e) {
    throw UnparsableResolved(cat("the resolved configuration does not parse again: ", e.what(), "\n", resolved));
  }
  tree.check_all_read();  // last: the components' own keys are unread here
}

}  // namespace keel::fuzz
