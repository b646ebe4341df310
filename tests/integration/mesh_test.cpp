// Real multi-process meshes on Gloo over loopback: every host-API collective on every group
// of the layout, from separate processes that meet through torchrun's environment.
#include <gtest/gtest.h>

#include <string>

#include "test_support.hpp"

namespace keel {
namespace {

// Runs `world` workers of layout pp x dp (ep) and returns their combined output and status.
test::CommandResult run_mesh(int pp, int dp, int ep) {
  int world = pp * dp, port = test::free_port();
  std::string cmd =
      "pids=''; for r in $(seq 0 " + std::to_string(world - 1) + "); do RANK=$r WORLD_SIZE=" + std::to_string(world) +
      " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) + " OMP_NUM_THREADS=1 timeout 120 " +
      test::bin_dir() + "/mesh_worker " + std::to_string(pp) + " " + std::to_string(dp) + " " + std::to_string(ep) +
      " & pids=\"$pids $!\"; done; rc=0; for p in $pids; do wait $p || rc=1; done; exit $rc";
  return test::run_command(cmd);
}

TEST(Mesh, TwoDataParallelRanksWithExpertParallelismRunEveryCollective) {
  auto r = run_mesh(1, 2, 2);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("rank 0: ok"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1: ok"), std::string::npos) << r.output;
}

TEST(Mesh, TwoPipelineStagesSendAndReceive) {
  auto r = run_mesh(2, 1, 1);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1: ok"), std::string::npos) << r.output;
}

TEST(Mesh, FourRanksPp2Dp2Ep2) {
  auto r = run_mesh(2, 2, 2);
  EXPECT_EQ(r.status, 0) << r.output;
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_NE(r.output.find("rank " + std::to_string(rank) + ": ok"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace keel
