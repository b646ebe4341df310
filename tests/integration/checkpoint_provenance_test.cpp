// Checkpoint provenance: every run has an id recorded in its manifests, a fresh run refuses a
// folder holding another run's checkpoints, and keep_latest prunes only this run's
// checkpoints, by save order, never the one `latest` names nor the one the run loaded from.
#include <gtest/gtest.h>

#include <algorithm>
#include <regex>

#include "checkpoint/checkpoint_reader.hpp"
#include "checkpoint/manifest.hpp"
#include "job_runs.hpp"

namespace keel {
namespace {

namespace fs = std::filesystem;
using test::JobRun;

const std::string kJob = test::tiny_deepseek_job();

std::string quoted(const std::string& key, const std::string& value) { return key + "=\\\"" + value + "\\\""; }

std::string run_id(const std::string& dir) { return read_manifest(dir).run_id; }

// The names in `dir`, sorted.
std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& item : fs::directory_iterator(dir)) names.push_back(item.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

bool has(const test::CommandResult& r, const std::string& text) { return r.output.find(text) != std::string::npos; }

TEST(CheckpointProvenance, AFreshRunDrawsANewIdAndAResumeKeepsIt) {
  test::TempDir dir;
  const std::vector<std::string> saving = {"training.steps=4", "checkpoint.interval=2"};
  JobRun a = test::run_job(dir, "a", 1, kJob, saving);
  ASSERT_EQ(a.result.status, 0) << a.result.output;
  const std::string id = run_id(a.dir + "/checkpoints/step-2");
  EXPECT_TRUE(std::regex_match(id, std::regex("[0-9a-f]{16}"))) << "'" << id << "'";
  EXPECT_EQ(run_id(a.dir + "/checkpoints/step-4"), id);

  JobRun b = test::run_job(dir, "b", 1, kJob, saving);
  ASSERT_EQ(b.result.status, 0) << b.result.output;
  EXPECT_NE(run_id(b.dir + "/checkpoints/step-4"), id);

  // A resume (into another folder) continues the loaded run: its checkpoints carry that id.
  JobRun c = test::run_job(
      dir, "c", 1, kJob,
      {"training.steps=4", "checkpoint.interval=2", quoted("checkpoint.load", a.dir + "/checkpoints/step-2")});
  ASSERT_EQ(c.result.status, 0) << c.result.output;
  EXPECT_EQ(names_in(c.dir + "/checkpoints"), (std::vector<std::string>{"latest", "step-4"}));
  EXPECT_EQ(run_id(c.dir + "/checkpoints/step-4"), id);
}

TEST(CheckpointProvenance, AFreshRunIntoAnotherRunsFolderIsRefused) {
  test::TempDir dir;
  JobRun first = test::run_job(dir, "first", 1, kJob, {"training.steps=2", "checkpoint.interval=2"});
  ASSERT_EQ(first.result.status, 0) << first.result.output;
  const std::string root = first.dir + "/checkpoints";
  const std::string id = run_id(root + "/step-2");

  // Another run, started without checkpoint.load, into the same folder: refused before a step.
  JobRun second = test::run_job(dir, "second", 1, kJob,
                                {"training.steps=4", "checkpoint.interval=1", quoted("checkpoint.dir", root)});
  EXPECT_EQ(second.result.status, 2) << second.result.output;
  EXPECT_TRUE(has(second.result, root)) << second.result.output;
  EXPECT_TRUE(has(second.result, "checkpoint.load")) << second.result.output;
  EXPECT_FALSE(fs::exists(second.dir + "/metrics.jsonl"));
  EXPECT_EQ(names_in(root), (std::vector<std::string>{"latest", "step-2"}));
  EXPECT_EQ(run_id(root + "/step-2"), id);

  // The same job resuming the folder's latest checkpoint is no new run: it trains on.
  JobRun resumed = test::run_job(
      dir, "second", 1, kJob,
      {"training.steps=4", "checkpoint.interval=1", quoted("checkpoint.dir", root), "checkpoint.load=latest"});
  ASSERT_EQ(resumed.result.status, 0) << resumed.result.output;
  EXPECT_TRUE(has(resumed.result, "resuming after step 2")) << resumed.result.output;
  EXPECT_EQ(run_id(root + "/step-4"), id);
}

// A run resumed from elsewhere into a folder that holds a newer run's checkpoints (higher step
// numbers): keep_latest = 1 prunes its own older save and nothing of the other run; `latest`
// names its newest save, and resuming "latest" continues it, not the other run.
TEST(CheckpointProvenance, KeepLatestPrunesOnlyThisRunsCheckpoints) {
  test::TempDir dir;
  JobRun newer = test::run_job(dir, "newer", 1, kJob, {"training.steps=10", "checkpoint.interval=5"});
  ASSERT_EQ(newer.result.status, 0) << newer.result.output;
  JobRun mine = test::run_job(dir, "mine", 1, kJob, {"training.steps=2", "checkpoint.interval=2"});
  ASSERT_EQ(mine.result.status, 0) << mine.result.output;
  const std::string root = newer.dir + "/checkpoints", newer_id = run_id(root + "/step-10");
  const std::string my_id = run_id(mine.dir + "/checkpoints/step-2");

  JobRun resumed =
      test::run_job(dir, "resumed", 1, kJob,
                    {"training.steps=4", "checkpoint.interval=1", "checkpoint.keep_latest=1",
                     quoted("checkpoint.dir", root), quoted("checkpoint.load", mine.dir + "/checkpoints/step-2")});
  ASSERT_EQ(resumed.result.status, 0) << resumed.result.output;
  EXPECT_EQ(names_in(root), (std::vector<std::string>{"latest", "step-10", "step-4", "step-5"}));
  EXPECT_EQ(test::read_file(root + "/latest"), "step-4\n");
  EXPECT_EQ(run_id(root + "/step-4"), my_id);
  EXPECT_EQ(run_id(root + "/step-5"), newer_id);
  EXPECT_EQ(run_id(root + "/step-10"), newer_id);
  EXPECT_EQ(resolve_checkpoint(root, "latest"), root + "/step-4");
}

// A rollback: a run saved steps 2, 4, 6; resumed from step 2 with keep_latest = 1 it saves 3
// and 4 again. The loaded step 2 survives, and so does step 4 (latest, this run's last save);
// the abandoned step 6 and the older save 3 are pruned.
TEST(CheckpointProvenance, ARollbackKeepsTheLoadedCheckpointAndLatest) {
  test::TempDir dir;
  JobRun run = test::run_job(dir, "run", 1, kJob, {"training.steps=6", "checkpoint.interval=2"});
  ASSERT_EQ(run.result.status, 0) << run.result.output;
  const std::string root = run.dir + "/checkpoints", id = run_id(root + "/step-6");

  JobRun rollback =
      test::run_job(dir, "run", 1, kJob,
                    {"training.steps=4", "checkpoint.interval=1", "checkpoint.keep_latest=1", "checkpoint.load=2"});
  ASSERT_EQ(rollback.result.status, 0) << rollback.result.output;
  EXPECT_TRUE(has(rollback.result, "resuming after step 2")) << rollback.result.output;
  EXPECT_EQ(names_in(root), (std::vector<std::string>{"latest", "step-2", "step-4"}));
  EXPECT_EQ(test::read_file(root + "/latest"), "step-4\n");
  EXPECT_EQ(run_id(root + "/step-4"), id);
  EXPECT_EQ(read_manifest(root + "/step-4").step, 4);
  EXPECT_EQ(resolve_checkpoint(root, "latest"), root + "/step-4");
}

// A resumed run whose save would replace another run's step in the folder it saves to: the
// other run's checkpoint stays, and the save fails (exit 1, naming the folder).
TEST(CheckpointProvenance, AnotherRunsStepIsNeverReplaced) {
  test::TempDir dir;
  JobRun other = test::run_job(dir, "other", 1, kJob, {"training.steps=2", "checkpoint.interval=2"});
  ASSERT_EQ(other.result.status, 0) << other.result.output;
  JobRun mine = test::run_job(dir, "mine", 1, kJob, {"training.steps=1", "checkpoint.interval=1"});
  ASSERT_EQ(mine.result.status, 0) << mine.result.output;
  const std::string root = other.dir + "/checkpoints", id = run_id(root + "/step-2");

  JobRun resumed = test::run_job(dir, "resumed", 1, kJob,
                                 {"training.steps=2", "checkpoint.interval=2", quoted("checkpoint.dir", root),
                                  quoted("checkpoint.load", mine.dir + "/checkpoints/step-1")});
  EXPECT_EQ(resumed.result.status, 1) << resumed.result.output;
  EXPECT_TRUE(has(resumed.result, "cannot replace " + root + "/step-2")) << resumed.result.output;
  EXPECT_EQ(names_in(root), (std::vector<std::string>{"latest", "step-2"}));
  EXPECT_EQ(run_id(root + "/step-2"), id);
  EXPECT_EQ(test::read_file(root + "/latest"), "step-2\n");
}

}  // namespace
}  // namespace keel
