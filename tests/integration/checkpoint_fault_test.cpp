// The checkpoint rows of the fault matrix: a kill at each phase of a save and of a re-save
// (replacing a step), a full disk, a write failure on one rank of an asynchronous
// multi-rank save, a commit failure on rank 0. Each asserts what is on disk afterwards, what
// every rank printed, and what loads.
#include <gtest/gtest.h>

#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "checkpoint/checkpoint_reader.hpp"
#include "checkpoint/manifest.hpp"
#include "job_runs.hpp"

namespace keel {
namespace {

namespace fs = std::filesystem;
using test::JobRun;

const std::string kJob = test::tiny_deepseek_job();

std::vector<std::string> with(std::vector<std::string> sets, const std::vector<std::string>& more) {
  sets.insert(sets.end(), more.begin(), more.end());
  return sets;
}

bool has(const test::CommandResult& r, const std::string& text) { return r.output.find(text) != std::string::npos; }

bool complete(const fs::path& dir) { return fs::exists(dir / "manifest.json"); }

// The save number a checkpoint folder records (its run's how-manyth save).
int64_t save_number(const fs::path& dir) {
  return nlohmann::json::parse(test::read_file((dir / "save.json").string())).at("save").get<int64_t>();
}

// The step after which each rank reported the failed checkpoint `path`, by rank ("[rank R]"
// prefixes of keel-launch), from the lines that name `path`, `rank` and `cause`.
std::map<int, int> failure_reports(const std::string& output, const std::string& path, const std::string& failing_rank,
                                   const std::string& cause) {
  std::map<int, int> steps;
  static const std::regex line(
      "\\[rank (\\d+)\\] .*checkpoint (\\S+) failed \\(known to every rank after step (\\d+)\\): (.*)");
  std::istringstream in(output);
  for (std::string text; std::getline(in, text);) {
    std::smatch m;
    if (std::regex_match(text, m, line) && m[2] == path && m[4].str().find(failing_rank) != std::string::npos &&
        m[4].str().find(cause) != std::string::npos)
      steps[std::stoi(m[1])] = std::stoi(m[3]);
  }
  return steps;
}

// --- A kill at each phase of a save -------------------------------------------------------

struct KillCase {
  std::string phase;
  bool partial_complete;  // step-4.partial holds a manifest after the kill
  bool step4_in_place;    // step-4/ is complete after the kill
  std::string latest;     // what `latest` names after the kill
  int resumes_after;      // the step a resume of "latest" continues from
};

void PrintTo(const KillCase& k, std::ostream* os) { *os << k.phase; }

class SaveKill : public ::testing::TestWithParam<KillCase> {};

// One rank saves steps 2 and 4 (keep_latest = 1) and is killed at a phase of saving step 4.
TEST_P(SaveKill, LeavesALoadableCheckpoint) {
  const KillCase& k = GetParam();
  test::TempDir dir;
  const std::vector<std::string> job = {"training.steps=4", "checkpoint.interval=2", "checkpoint.keep_latest=1"};
  JobRun killed = test::run_job(
      dir, "run", 1, kJob,
      with(job, {"debug.crash_in_checkpoint=4", "debug.crash_in_checkpoint_phase=\\\"" + k.phase + "\\\""}));
  EXPECT_EQ(killed.result.status, 1) << killed.result.output;
  EXPECT_TRUE(has(killed.result, "rank 0 was killed by signal 9")) << killed.result.output;
  const fs::path root = fs::path(killed.dir) / "checkpoints";
  EXPECT_EQ(complete(root / "step-4.partial"), k.partial_complete);
  EXPECT_EQ(complete(root / "step-4"), k.step4_in_place);
  EXPECT_EQ(test::read_file(root / "latest"), k.latest + "\n");
  // Pruning happens only once step 4 is named by `latest`: step 2 is there until then.
  EXPECT_EQ(complete(root / "step-2"), k.phase != "pruned");
  EXPECT_FALSE(fs::exists(root / "step-2.deleting"));

  JobRun resumed = test::run_job(dir, "run", 1, kJob, with(job, {"checkpoint.load=latest"}));
  ASSERT_EQ(resumed.result.status, 0) << resumed.result.output;
  EXPECT_TRUE(has(resumed.result, "resuming after step " + std::to_string(k.resumes_after))) << resumed.result.output;
  std::set<std::string> names;
  for (const auto& item : fs::directory_iterator(root)) names.insert(item.path().filename().string());
  // The checkpoint the resume loaded is never pruned; otherwise keep_latest = 1 holds.
  if (k.resumes_after == 2)
    EXPECT_EQ(names, (std::set<std::string>{"latest", "step-2", "step-4"}));
  else
    EXPECT_EQ(names, (std::set<std::string>{"latest", "step-4"}));
  EXPECT_EQ(read_manifest((root / "step-4").string()).step, 4);
}

INSTANTIATE_TEST_SUITE_P(
    Phases, SaveKill,
    ::testing::Values(KillCase{"written", false, false, "step-2", 2}, KillCase{"gathered", false, false, "step-2", 2},
                      KillCase{"manifest", true, false, "step-2", 2}, KillCase{"renamed", false, true, "step-2", 2},
                      KillCase{"latest", false, true, "step-4", 4}, KillCase{"pruned", false, true, "step-4", 4}),
    [](const auto& info) { return info.param.phase; });

// --- A kill at each phase of a re-save (the reshard workflow: load step N, run no step) -----

struct ResaveCase {
  std::string phase;
  int step2_save;   // the save number of step-2/ after the kill (1: the old copy, 2: the new), 0: absent
  bool partial;     // a complete step-2.partial/ remains
  bool old;         // a complete step-2.old/ remains
  int loaded_save;  // the save number of the copy a resume of "latest" loads
};

void PrintTo(const ResaveCase& k, std::ostream* os) { *os << k.phase; }

class ResaveKill : public ::testing::TestWithParam<ResaveCase> {};

TEST_P(ResaveKill, KeepsACompleteCopyOfTheStep) {
  const ResaveCase& k = GetParam();
  test::TempDir dir;
  const std::vector<std::string> job = {"training.steps=2", "checkpoint.interval=2"};
  JobRun saved = test::run_job(dir, "run", 1, kJob, job);
  ASSERT_EQ(saved.result.status, 0) << saved.result.output;
  const fs::path root = fs::path(saved.dir) / "checkpoints";
  ASSERT_EQ(save_number(root / "step-2"), 1);

  JobRun killed = test::run_job(dir, "run", 1, kJob,
                                with(job, {"checkpoint.load=2", "debug.crash_in_checkpoint=2",
                                           "debug.crash_in_checkpoint_phase=\\\"" + k.phase + "\\\""}));
  EXPECT_EQ(killed.result.status, 1) << killed.result.output;
  EXPECT_TRUE(has(killed.result, "rank 0 was killed by signal 9")) << killed.result.output;
  if (k.step2_save == 0) {
    EXPECT_FALSE(fs::exists(root / "step-2"));
  } else {
    ASSERT_TRUE(complete(root / "step-2"));
    EXPECT_EQ(save_number(root / "step-2"), k.step2_save);
  }
  EXPECT_EQ(complete(root / "step-2.partial"), k.partial);
  EXPECT_EQ(complete(root / "step-2.old"), k.old);
  EXPECT_EQ(test::read_file(root / "latest"), "step-2\n");

  // A resume of "latest" (one more step) loads a complete step 2: the interrupted save finished.
  JobRun resumed =
      test::run_job(dir, "run", 1, kJob, {"training.steps=3", "checkpoint.interval=3", "checkpoint.load=latest"});
  ASSERT_EQ(resumed.result.status, 0) << resumed.result.output;
  EXPECT_TRUE(has(resumed.result, "resuming after step 2")) << resumed.result.output;
  ASSERT_TRUE(complete(root / "step-2"));
  EXPECT_EQ(save_number(root / "step-2"), k.loaded_save);
  EXPECT_FALSE(fs::exists(root / "step-2.partial"));
  EXPECT_FALSE(fs::exists(root / "step-2.old"));
  EXPECT_TRUE(complete(root / "step-3"));
}

INSTANTIATE_TEST_SUITE_P(
    Phases, ResaveKill,
    ::testing::Values(ResaveCase{"written", 1, false, false, 1}, ResaveCase{"gathered", 1, false, false, 1},
                      ResaveCase{"manifest", 1, true, false, 1}, ResaveCase{"displaced", 0, true, true, 2},
                      ResaveCase{"renamed", 2, false, true, 2}, ResaveCase{"latest", 2, false, true, 2},
                      ResaveCase{"pruned", 2, false, false, 2}),
    [](const auto& info) { return info.param.phase; });

// --- Failed saves: agreed by every rank, final weights still written ----------------------

// DP2, asynchronous: rank 1's file of step 4 fails. Both ranks report it, naming rank, file
// and cause, after the same step, then stop; the final weights are written; step-2 stays
// the latest loadable checkpoint.
TEST(SaveFailure, OneRankOfAnAsyncDp2SaveFailsAndEveryRankStops) {
  test::TempDir dir;
  JobRun run = test::run_job(
      dir, "run", 2, kJob,
      {"parallelism.dp=2", "training.steps=8", "checkpoint.interval=2", "checkpoint.async=true",
       "checkpoint.save_final=true", "debug.fail_checkpoint_write=4", "debug.fail_checkpoint_write_rank=1"});
  EXPECT_EQ(run.result.status, 1) << run.result.output;
  const fs::path root = fs::path(run.dir) / "checkpoints";
  std::map<int, int> reports =
      failure_reports(run.result.output, (root / "step-4").string(), "rank 1: ", "rank-00001.safetensors");
  ASSERT_EQ(reports.size(), 2u) << run.result.output;
  EXPECT_EQ(reports[0], reports[1]);
  EXPECT_GE(reports[0], 4);
  EXPECT_LT(reports[0], 6);  // at a step boundary after the save finished, not at the next save
  EXPECT_TRUE(has(run.result, "injected failure")) << run.result.output;
  EXPECT_FALSE(has(run.result, "Timed out")) << run.result.output;
  EXPECT_TRUE(fs::exists(run.dir + "/final/model.safetensors"));
  EXPECT_FALSE(fs::exists(root / "step-4"));
  EXPECT_FALSE(fs::exists(root / "step-4.partial"));
  EXPECT_FALSE(fs::exists(root / "step-6"));
  EXPECT_EQ(resolve_checkpoint(root.string(), "latest"), (root / "step-2").string());
}

// DP2, synchronous: rank 0's commit of step 2 fails; rank 1 knows it too.
TEST(SaveFailure, ACommitFailureOnRank0IsKnownToEveryRank) {
  test::TempDir dir;
  JobRun run = test::run_job(dir, "run", 2, kJob,
                             {"parallelism.dp=2", "training.steps=4", "checkpoint.interval=2",
                              "checkpoint.save_final=true", "debug.fail_checkpoint_commit=2"});
  EXPECT_EQ(run.result.status, 1) << run.result.output;
  const fs::path root = fs::path(run.dir) / "checkpoints";
  std::map<int, int> reports =
      failure_reports(run.result.output, (root / "step-2").string(), "rank 0: ", "cannot commit");
  ASSERT_EQ(reports.size(), 2u) << run.result.output;
  EXPECT_EQ(reports[0], 2);
  EXPECT_EQ(reports[1], 2);
  EXPECT_TRUE(fs::exists(run.dir + "/final/model.safetensors"));
  EXPECT_FALSE(fs::exists(root / "step-2"));
  EXPECT_FALSE(fs::exists(root / "step-2.partial"));
  EXPECT_EQ(resolve_checkpoint(root.string(), "latest"), "");
}

// The save at the end fails: the final weights are still written, the earlier checkpoint
// stays loadable, and the job exits 1.
TEST(SaveFailure, AFailedFinalSaveStillWritesTheFinalWeights) {
  test::TempDir dir;
  JobRun run = test::run_job(
      dir, "run", 1, kJob,
      {"training.steps=3", "checkpoint.interval=2", "checkpoint.save_final=true", "debug.fail_checkpoint_write=3"});
  EXPECT_EQ(run.result.status, 1) << run.result.output;
  const fs::path root = fs::path(run.dir) / "checkpoints";
  EXPECT_EQ(failure_reports(run.result.output, (root / "step-3").string(), "rank 0: ", "rank-00000.safetensors").size(),
            1u)
      << run.result.output;
  EXPECT_TRUE(fs::exists(run.dir + "/final/model.safetensors"));
  EXPECT_FALSE(fs::exists(root / "step-3"));
  EXPECT_EQ(resolve_checkpoint(root.string(), "latest"), (root / "step-2").string());
}

// checkpoint.on_save_failure = "continue": the failure is reported and training goes on.
TEST(SaveFailure, TheContinuePolicyTrainsOn) {
  test::TempDir dir;
  JobRun run = test::run_job(dir, "run", 1, kJob,
                             {"training.steps=4", "checkpoint.interval=2",
                              "checkpoint.on_save_failure=\\\"continue\\\"", "debug.fail_checkpoint_write=2"});
  ASSERT_EQ(run.result.status, 0) << run.result.output;
  const fs::path root = fs::path(run.dir) / "checkpoints";
  EXPECT_EQ(failure_reports(run.result.output, (root / "step-2").string(), "rank 0: ", "injected failure").size(), 1u)
      << run.result.output;
  EXPECT_EQ(run.steps.back(), 4);
  EXPECT_FALSE(fs::exists(root / "step-2"));
  EXPECT_EQ(resolve_checkpoint(root.string(), "latest"), (root / "step-4").string());
}

// A full disk: checkpoint.dir on a tmpfs too small for one checkpoint (run_dir elsewhere).
TEST(SaveFailure, AFullDiskIsReportedAndTheFinalWeightsAreWritten) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
  test::TempDir dir;
  const std::string small = dir / "small";
  fs::create_directories(small);
  if (::mount("tmpfs", small.c_str(), "tmpfs", 0, "size=64k") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs on " << small << ": " << std::strerror(errno);
  JobRun run = test::run_job(dir, "run", 1, kJob,
                             {"training.steps=4", "checkpoint.interval=2", "checkpoint.save_final=true",
                              "checkpoint.dir=\\\"" + small + "/checkpoints\\\""});
  std::set<std::string> left;
  for (const auto& item : fs::directory_iterator(small + "/checkpoints")) left.insert(item.path().filename().string());
  ::umount(small.c_str());
  EXPECT_EQ(run.result.status, 1) << run.result.output;
  EXPECT_EQ(
      failure_reports(run.result.output, small + "/checkpoints/step-2", "rank 0: ", "rank-00000.safetensors").size(),
      1u)
      << run.result.output;
  EXPECT_TRUE(fs::exists(run.dir + "/final/model.safetensors"));
  EXPECT_EQ(left, std::set<std::string>{});  // the failed save's partial folder is removed
}

}  // namespace
}  // namespace keel
