// keel-train verify: the user's job in their layout against one rank, in one command. A sound
// layout passes under the error model, another model fails naming what differs, bad arguments
// are refused, and nothing is left behind.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "job_runs.hpp"

namespace keel {
namespace {

namespace fs = std::filesystem;

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

// keel-train verify on the tiny DeepSeek-V3 job with `args`, its temporary folders in `tmp`.
test::CommandResult verify(const test::TempDir& dir, const std::string& tmp, const std::string& args) {
  test::write_file(dir / "job.toml", test::tiny_deepseek_job());
  fs::create_directories(tmp);
  return test::run_command("TMPDIR=" + tmp + " timeout 600 " + test::bin_dir() + "/keel-train verify --plugin-path " +
                           test::plugin_dir() + " --config " + (dir / "job.toml") + " " + args);
}

TEST(KeelTrainVerify, APipelineExpertAndDataParallelLayoutPassesAgainstOneRank) {
  test::TempDir dir;
  const std::string tmp = dir / "tmp";
  auto r = verify(dir, tmp,
                  "--set parallelism.pp=2 --set parallelism.dp=2 --set parallelism.ep=2 --set "
                  "'job.run_dir=\"untouched\"' --steps 3");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_HAS(r.output, "yours:     pp 2 x dp 2, ep 2, 2 microbatches, 1f1b, 4 ranks");
  EXPECT_HAS(r.output, "reference: pp 1 x dp 1, ep 1, 1 microbatch, 1f1b, 1 rank");
  for (const char* row : {"\n    1  ", "\n    2  ", "\n    3  "}) EXPECT_HAS(r.output, row);
  EXPECT_HAS(r.output, "largest relative parameter difference");
  EXPECT_HAS(r.output, "tolerance (the test suite's error model");
  EXPECT_HAS(r.output, "PASS: your layout trains the reference's model within the tolerance");
  EXPECT_TRUE(fs::is_empty(tmp)) << "the runs' folders are removed";
  EXPECT_FALSE(fs::exists("untouched")) << "the job's own run folder is never written";
}

TEST(KeelTrainVerify, AnotherModelFailsNamingWhatDiffersAndKeptRunsStay) {
  test::TempDir dir;
  const std::string tmp = dir / "tmp";
  auto r = verify(dir, tmp, "--set parallelism.dp=2 --against training.seed=9 --steps 2 --keep");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_HAS(r.output, "FAIL: ");
  EXPECT_HAS(r.output, "step 1: loss differs by");
  EXPECT_HAS(r.output, "verify: the runs are kept in " + tmp + "/keel-verify-");
  EXPECT_FALSE(fs::is_empty(tmp));
}

TEST(KeelTrainVerify, BadArgumentsAreRefusedBeforeAnyRankStarts) {
  test::TempDir dir;
  const std::string tmp = dir / "tmp";
  auto steps = verify(dir, tmp, "--steps 0");
  EXPECT_EQ(steps.status, 2) << steps.output;
  EXPECT_HAS(steps.output, "--steps must be in [1, 1000], got 0");
  auto set = verify(dir, tmp, "--set parallelism.pp=0");
  EXPECT_EQ(set.status, 2) << set.output;
  EXPECT_HAS(set.output, "parallelism.pp: must be at least 1, got 0");
  auto against = verify(dir, tmp, "--against parallelism.schedule=bogus");
  EXPECT_EQ(against.status, 2) << against.output;
  EXPECT_HAS(against.output, "parallelism.schedule");
  EXPECT_EQ(steps.output.find("verify: running"), std::string::npos) << steps.output;
  EXPECT_TRUE(fs::is_empty(tmp));
}

}  // namespace
}  // namespace keel
