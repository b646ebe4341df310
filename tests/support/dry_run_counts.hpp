// The parameter counts `keel-train --dry-run` reports for a flavor, built on meta tensors in
// this process (nothing is allocated).
#pragma once

#include <map>
#include <string>

#include "test_support.hpp"
#include "train/dry_run.hpp"
#include "train/job.hpp"

namespace keel::test {

/// Counts per module group ("" sums them) of `flavor` of the shipped plugin `plugin`.
inline std::map<std::string, ParamCount> dry_run_counts(const std::string& plugin, const std::string& flavor) {
  TempDir dir;
  write_file(dir / "job.toml", "[model]\nplugin = \"" + plugin + "\"\nflavor = \"" + flavor + "\"\n");
  RunOptions options;
  options.config_path = dir / "job.toml";
  options.plugin_dirs = {plugin_dir()};
  Job job(options, /*meta=*/true);
  return count_parameters(job);
}

}  // namespace keel::test
