// Local ranks of one job, started as keel-launch starts them: torchrun's environment, rank 0
// handed a socket already listening on MASTER_PORT, each rank's output in a file of its own.
#pragma once

#include <string>
#include <vector>

namespace keel {

/// How one job of `world` ranks ended.
struct LaunchResult {
  bool ok = false;        ///< every rank exited 0
  int status = 0;         ///< the first failed rank's exit status (128 + N for a signal N)
  int failed_rank = -1;   ///< that rank, or -1
  std::string rank0_log;  ///< rank 0's output file
};

/// Runs `program` with `args` as `world` local ranks (RANK, LOCAL_RANK, WORLD_SIZE,
/// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, KEEL_MASTER_LISTEN_FD for rank 0), rank r's
/// output to `log_prefix`r.log. When a rank fails, the others are stopped (SIGTERM, then
/// SIGKILL after 10 s). Returns when every rank has exited.
LaunchResult launch_ranks(const std::string& program, const std::vector<std::string>& args, int world,
                          const std::string& log_prefix);

}  // namespace keel
