// keel-launch: ranks with torchrun's environment and prefixed output; a dead rank stops the
// job with a non-zero exit naming it, and no rank is left behind.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <regex>
#include <thread>

#include "test_support.hpp"

namespace keel {
namespace {

const char* kJob = R"([model]
plugin = "llama3"
flavor = "tiny"
[training]
steps = 4
seq_len = 16
global_batch = 4
threads = 1
[parallelism]
dp = 2
[metrics]
log_interval = 1
jsonl = false
[checkpoint]
save_final = false
)";

// Two pipeline stages of the flagship model: a dead stage leaves its peer blocked in a receive.
const char* kPipelineJob = R"([model]
plugin = "deepseek_v3_mtp"
flavor = "tiny"
[training]
steps = 4
seq_len = 16
global_batch = 4
threads = 1
[parallelism]
pp = 2
microbatches = 2
[metrics]
log_interval = 1
jsonl = false
[checkpoint]
save_final = false
)";

std::string launch(const test::TempDir& dir, const std::string& extra) {
  return test::source_dir() + "/tools/keel-launch --nproc 2 -- " + test::bin_dir() + "/keel-train --plugin-path " +
         test::plugin_dir() + " --config " + (dir / "job.toml") + " --set job.run_dir=\\\"" + (dir / "run") + "\\\"" +
         extra;
}

TEST(KeelLaunch, RunsRanksWithPrefixedOutput) {
  test::TempDir dir;
  test::write_file(dir / "job.toml", kJob);
  auto r = test::run_command(launch(dir, ""));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] [keel 0] step 4/4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] [keel 1]"), std::string::npos) << r.output;
}

void expect_killed_rank_stops_the_job(const char* job_text) {
  test::TempDir dir;
  test::write_file(dir / "job.toml", job_text);
  auto start = std::chrono::steady_clock::now();
  // In the background, its own output in files: run_command returns at once.
  std::string job = launch(dir, " --set training.steps=100000");
  test::run_command(std::string("(")
                        .append(job)
                        .append(" > ")
                        .append(dir / "log")
                        .append(" 2>&1; echo $? > ")
                        .append(dir / "status")
                        .append(") > /dev/null 2>&1 &"));
  std::smatch m;
  std::string log;
  // Wait until both ranks train, then kill rank 1.
  for (int i = 0; i < 600; ++i) {
    log = test::read_file(dir / "log");
    if (log.find("[rank 0] [keel 0] step 2/") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(std::regex_search(log, m, std::regex("rank 1 pid (\\d+)"))) << log;
  int pid1 = std::stoi(m[1]);
  ASSERT_TRUE(std::regex_search(log, m, std::regex("rank 0 pid (\\d+)"))) << log;
  int pid0 = std::stoi(m[1]);
  ASSERT_EQ(::kill(pid1, SIGKILL), 0);
  for (int i = 0; i < 600 && test::read_file(dir / "status").empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(test::read_file(dir / "status"), "1\n");
  EXPECT_LT(seconds, 60.0);
  log = test::read_file(dir / "log");
  EXPECT_NE(log.find("keel-launch: rank 1 was killed by signal 9"), std::string::npos) << log;
  EXPECT_NE(log.find("keel-launch: failed: rank 1"), std::string::npos) << log;
  EXPECT_NE(::kill(pid0, 0), 0) << "rank 0 was left running";
}

TEST(KeelLaunch, AKilledRankStopsTheJobNamingTheRank) { expect_killed_rank_stops_the_job(kJob); }

TEST(KeelLaunch, AKilledPipelineStageStopsTheJobNamingTheRank) { expect_killed_rank_stops_the_job(kPipelineJob); }

}  // namespace
}  // namespace keel
