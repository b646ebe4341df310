// The part of the config targets that runs after parsing: the host's validation, plus one
// property the fuzzer cannot see by itself. A config integer that validation accepts must
// reach the JobConfig unchanged: a value that does not fit its field (training.threads =
// 4294967298 running as 2) is silent narrowing, reported as a finding.
#pragma once

#include <cstdint>
#include <stdexcept>

#include "common/text.hpp"
#include "config/config_tree.hpp"
#include "config/job_config.hpp"

namespace keel::fuzz {

/// Thrown when an accepted integer reached its field changed (a finding: not an InputError).
class SilentNarrowing : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// read_job_config as a dry run does, then the narrowing check, the resolved TOML and unknown keys.
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
  tree.resolved_toml();
  tree.check_all_read();  // last: the plugins' keys ([model], [clipper]) are unread here
}

}  // namespace keel::fuzz
