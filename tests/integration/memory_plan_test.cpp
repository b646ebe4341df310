// The memory plan of keel-train --dry-run against what a trainer allocates: the dry run builds
// every rank's part on the meta device and prints each rank's parameter, gradient, optimizer
// and buffer bytes; a real run of the same layout logs the same lines from its tensors, which
// must be equal to the byte. Every rank's peak memory reaches the log and metrics.jsonl.
#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>

#include "job_runs.hpp"

namespace keel {
namespace {

const std::vector<std::string> kLayout = {"parallelism.pp=2", "parallelism.dp=2", "parallelism.ep=2"};

// The text after `marker` on every line of `output` that holds it.
std::vector<std::string> lines_after(const std::string& output, const std::string& marker) {
  std::vector<std::string> found;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (size_t at = line.find(marker); at != std::string::npos) found.push_back(line.substr(at + marker.size()));
  return found;
}

test::CommandResult dry_run(const test::TempDir& dir, const std::string& sets,
                            const std::vector<std::string>& layout = kLayout) {
  test::write_file(dir / "plan.toml", test::tiny_deepseek_job());
  std::string command = test::bin_dir() + "/keel-train --dry-run --plugin-path " + test::plugin_dir() + " --config " +
                        (dir / "plan.toml") + sets;
  for (const std::string& s : layout) command += " --set " + s;
  return test::run_command(command);
}

// The dry run's lines against the lines a run of `ranks` ranks logs, equal to the byte;
// returns the planned lines.
std::vector<std::string> expect_plan_is_what_ranks_allocate(const std::string& label, int ranks,
                                                            const std::vector<std::string>& layout) {
  test::TempDir dir;
  auto plan = dry_run(dir, "", layout);
  EXPECT_EQ(plan.status, 0) << plan.output;
  // The plan's lines, "  rank(s) ...: parameters ...", follow its heading.
  const std::string heading = "memory plan, training state per rank";
  if (plan.output.find(heading) == std::string::npos) {
    ADD_FAILURE() << plan.output;
    return {};
  }
  std::vector<std::string> planned;
  for (const std::string& line : lines_after(plan.output.substr(plan.output.find(heading)), "  rank"))
    planned.push_back("rank" + line);

  std::vector<std::string> sets = layout;
  sets.push_back("training.steps=2");
  test::JobRun run = test::run_job(dir, "run", ranks, test::tiny_deepseek_job(), sets);
  EXPECT_EQ(run.result.status, 0) << run.result.output;
  const std::vector<std::string> held = lines_after(run.result.output, "training state, ");
  EXPECT_EQ(held, planned) << plan.output << run.result.output;
  for (const std::string& line : planned) std::printf("MEMORY_PLAN | %s tiny | %s\n", label.c_str(), line.c_str());
  return planned;
}

TEST(MemoryPlan, TheDryRunsStateBytesAreWhatEveryRankAllocates) {
  // Two stages; the two expert shards of a stage are of one size, so their ranks share a line.
  EXPECT_EQ(expect_plan_is_what_ranks_allocate("PP2 DP2 EP2", 4, kLayout).size(), 2u);
}

TEST(MemoryPlan, AShardedOptimizersStateBytesAreWhatEveryRankAllocates) {
  std::vector<std::string> sharded = kLayout;
  sharded.push_back("parallelism.shard_optimizer=true");
  EXPECT_GE(expect_plan_is_what_ranks_allocate("PP2 DP2 EP2 sharded", 4, sharded).size(), 2u);
  // Experts sharded over edp = 2 too.
  EXPECT_GE(expect_plan_is_what_ranks_allocate(
                "DP4 EP2 sharded", 4, {"parallelism.dp=4", "parallelism.ep=2", "parallelism.shard_optimizer=true"})
                .size(),
            1u);
}

TEST(MemoryPlan, EveryRanksPeakMemoryIsLoggedAndTheLargestNamed) {
  test::TempDir dir;
  std::vector<std::string> sets = kLayout;
  sets.push_back("training.steps=2");
  test::JobRun run = test::run_job(dir, "run", 4, test::tiny_deepseek_job(), sets);
  ASSERT_EQ(run.result.status, 0) << run.result.output;
  std::istringstream in(test::read_file(run.dir + "/metrics.jsonl"));
  int records = 0;
  for (std::string line; std::getline(in, line); ++records) {
    const auto j = nlohmann::json::parse(line);
    ASSERT_TRUE(j.contains("peak_memory_bytes_by_rank")) << line;
    const auto& by_rank = j["peak_memory_bytes_by_rank"];
    ASSERT_EQ(by_rank.size(), 4u) << line;
    double largest = 0;
    for (const auto& bytes : by_rank) {
      EXPECT_GT(bytes.get<double>(), 0) << line;
      largest = std::max(largest, bytes.get<double>());
    }
    EXPECT_EQ(j["peak_memory_bytes"].get<double>(), largest) << line;
  }
  EXPECT_EQ(records, 2);
  EXPECT_NE(run.result.output.find(" max (rank "), std::string::npos) << run.result.output;
}

TEST(MemoryPlan, ARankThatWillNotFitIsWarnedOf) {
  test::TempDir dir;
  auto tight = dry_run(dir, " --set training.device_memory_gb=0.001");
  ASSERT_EQ(tight.status, 0) << tight.output;
  EXPECT_NE(tight.output.find("WARNING: 4 rank(s) will not fit in 1.0 MiB per device (training.device_memory_gb), "
                              "before activations: rank(s) 0-3; the largest needs "),
            std::string::npos)
      << tight.output;
  auto roomy = dry_run(dir, " --set training.device_memory_gb=80");
  ASSERT_EQ(roomy.status, 0) << roomy.output;
  EXPECT_NE(roomy.output.find("every rank's state fits in 80.0 GiB per device (training.device_memory_gb): the "
                              "largest takes "),
            std::string::npos)
      << roomy.output;
  EXPECT_EQ(roomy.output.find("WARNING"), std::string::npos) << roomy.output;
}

}  // namespace
}  // namespace keel
