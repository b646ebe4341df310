// Distributed checkpoints across real processes: bitwise-exact resume, any layout resuming
// any layout's checkpoint, atomic saves under a kill, damage refused naming file and key,
// pruning, model-only loads, asynchronous saves and a final save on SIGTERM.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <thread>

#include "checkpoint/checkpoint_reader.hpp"
#include "common/error.hpp"
#include "job_runs.hpp"
#include "tolerance.hpp"

namespace keel {
namespace {

namespace fs = std::filesystem;
using test::JobRun;

// The shared tiny job with a checkpoint every 5 steps.
const std::string kJob = test::tiny_deepseek_job("interval = 5\n");

const std::vector<std::string> kPp2Dp2Ep2 = {"parallelism.pp=2", "parallelism.dp=2", "parallelism.ep=2"};

std::vector<std::string> with(std::vector<std::string> sets, const std::vector<std::string>& more) {
  sets.insert(sets.end(), more.begin(), more.end());
  return sets;
}

std::string load(const JobRun& run, int step) {
  return "checkpoint.load=\\\"" + run.dir + "/checkpoints/step-" + std::to_string(step) + "\\\"";
}

bool has(const test::CommandResult& r, const std::string& text) { return r.output.find(text) != std::string::npos; }

// Every entry but the per-rank random states, consolidated: bitwise equal in both folders.
void expect_same_entries(const std::string& a, const std::string& b) {
  CheckpointReader x(a), y(b);
  size_t compared = 0;
  for (const auto& [key, entry] : x.manifest().entries) {
    if (key.rfind("rng.", 0) == 0) continue;
    ASSERT_TRUE(y.has(key)) << key << " missing from " << b;
    EXPECT_TRUE(at::equal(x.read_whole(key), y.read_whole(key))) << key;
    ++compared;
  }
  EXPECT_GT(compared, 300u);
}

// Straight vs saved-and-resumed: the same loss sequence and final state, bit for bit.
void expect_bitwise_resume(int ranks, const std::vector<std::string>& layout) {
  test::TempDir dir;
  JobRun straight = test::run_job(dir, "straight", ranks, kJob, layout);
  ASSERT_EQ(straight.result.status, 0) << straight.result.output;
  JobRun resumed = test::run_job(dir, "resumed", ranks, kJob, with(layout, {load(straight, 5)}));
  ASSERT_EQ(resumed.result.status, 0) << resumed.result.output;
  EXPECT_TRUE(has(resumed.result, "resuming after step 5 at sample 40 of the data stream")) << resumed.result.output;
  ASSERT_EQ(straight.loss.size(), 10u);
  ASSERT_EQ(resumed.steps, (std::vector<int64_t>{6, 7, 8, 9, 10}));
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(resumed.loss[i], straight.loss[i + 5]) << "step " << i + 6;
    EXPECT_EQ(resumed.grad_norm[i], straight.grad_norm[i + 5]) << "step " << i + 6;
  }
  ASSERT_EQ(resumed.state.size(), straight.state.size());
  for (const auto& [key, t] : straight.state) EXPECT_TRUE(at::equal(t, resumed.state.at(key))) << key;
  expect_same_entries(straight.dir + "/checkpoints/step-10", resumed.dir + "/checkpoints/step-10");
}

TEST(Checkpoint, ResumeIsBitwiseExactOnOneRank) { expect_bitwise_resume(1, {}); }

TEST(Checkpoint, TwoRunsOfOneConfigSaveTheSameBitsRandomStatesIncluded) {
  // The default CPU generator was left unseeded: its state (rng.cpu.rank<N>) differed between
  // two runs of one config, and so would an unseeded draw in a plugin.
  test::TempDir dir;
  JobRun a = test::run_job(dir, "a", 2, kJob, {"parallelism.dp=2", "training.steps=5"});
  JobRun b = test::run_job(dir, "b", 2, kJob, {"parallelism.dp=2", "training.steps=5"});
  ASSERT_EQ(a.result.status, 0) << a.result.output;
  ASSERT_EQ(b.result.status, 0) << b.result.output;
  CheckpointReader x(a.dir + "/checkpoints/step-5"), y(b.dir + "/checkpoints/step-5");
  size_t random_states = 0;
  for (const auto& [key, entry] : x.manifest().entries) {
    EXPECT_TRUE(at::equal(x.read_whole(key), y.read_whole(key))) << key;
    random_states += key.rfind("rng.", 0) == 0 ? 1 : 0;
  }
  EXPECT_EQ(random_states, 2u);
}

TEST(Checkpoint, ResumeIsBitwiseExactUnderPp2Dp2Ep2) { expect_bitwise_resume(4, kPp2Dp2Ep2); }

// A checkpoint saved under PP2 DP2 EP2 resumed under `layout`: the loaded state re-saved at
// once (a run of no steps) equals the saved one bitwise, replicas load equal with no resync,
// and the next step matches the uninterrupted run.
void expect_resumes_pp2_dp2_ep2(const std::string& name, int ranks, const std::vector<std::string>& layout) {
  test::TempDir dir;
  JobRun source = test::run_job(dir, "source", 4, kJob, kPp2Dp2Ep2);
  ASSERT_EQ(source.result.status, 0) << source.result.output;

  JobRun resaved = test::run_job(dir, "resaved", ranks, kJob, with(layout, {load(source, 5), "training.steps=5"}));
  ASSERT_EQ(resaved.result.status, 0) << resaved.result.output;
  EXPECT_TRUE(has(resaved.result, "replica guard after load: every copy bitwise equal")) << resaved.result.output;
  expect_same_entries(source.dir + "/checkpoints/step-5", resaved.dir + "/checkpoints/step-5");
  CheckpointReader resharded(resaved.dir + "/checkpoints/step-5");
  EXPECT_EQ(resharded.manifest().data_position, 40u);

  JobRun next = test::run_job(dir, "next", ranks, kJob, with(layout, {load(source, 5), "training.steps=6"}));
  ASSERT_EQ(next.result.status, 0) << next.result.output;
  ASSERT_EQ(next.steps, (std::vector<int64_t>{6}));
  // Another layout's step: the error model's loss and grad-norm bound (tolerance.hpp).
  EXPECT_NEAR(next.loss[0], source.loss[5], test::kLossRtol * source.loss[5]) << name;
  EXPECT_NEAR(next.grad_norm[0], source.grad_norm[5], test::kLossRtol * source.grad_norm[5]) << name;
  std::printf(
      "RESUME | PP2 DP2 EP2 -> %-12s | step 6 loss rel %.1e, grad norm rel %.1e | re-saved state bitwise equal\n",
      name.c_str(), std::abs(next.loss[0] - source.loss[5]) / source.loss[5],
      std::abs(next.grad_norm[0] - source.grad_norm[5]) / source.grad_norm[5]);
}

TEST(Checkpoint, Pp2Dp2Ep2CheckpointResumesUnderPp2Dp2Ep2) { expect_resumes_pp2_dp2_ep2("PP2 DP2 EP2", 4, kPp2Dp2Ep2); }

TEST(Checkpoint, Pp2Dp2Ep2CheckpointResumesUnderPp4) { expect_resumes_pp2_dp2_ep2("PP4", 4, {"parallelism.pp=4"}); }

TEST(Checkpoint, Pp2Dp2Ep2CheckpointResumesUnderDp2Ep2) {
  expect_resumes_pp2_dp2_ep2("DP2 EP2", 2, {"parallelism.dp=2", "parallelism.ep=2"});
}

TEST(Checkpoint, Pp2Dp2Ep2CheckpointResumesOnOneRank) { expect_resumes_pp2_dp2_ep2("single rank", 1, {}); }

const std::vector<std::string> kInterleaved = {"parallelism.schedule=interleaved_1f1b",
                                               "parallelism.stages_per_rank=2"};

TEST(Checkpoint, Pp2Dp2Ep2CheckpointResumesUnderInterleavedOneFOneB) {
  expect_resumes_pp2_dp2_ep2("interleaved", 4, with(kPp2Dp2Ep2, kInterleaved));
}

TEST(Checkpoint, Pp2Dp2Ep2CheckpointResumesUnderZeroBubbleH1) {
  expect_resumes_pp2_dp2_ep2("zb_h1", 4, with(kPp2Dp2Ep2, {"parallelism.schedule=zb_h1"}));
}

// The V: rank 0 holds the embedding and its REPLICA side by side; the checkpoint has one copy.
TEST(Checkpoint, Pp2Dp2Ep2CheckpointResumesUnderZeroBubbleV) {
  expect_resumes_pp2_dp2_ep2("zbv", 4, with(kPp2Dp2Ep2, {"parallelism.schedule=zbv", "parallelism.stages_per_rank=2"}));
}

// A run of `schedule_sets` on PP2 saves at step 5; one stage per rank re-saves the same canonical
// entries bitwise and its next step stays within the bound.
void expect_resumes_under_one_f_one_b(const std::vector<std::string>& schedule_sets) {
  test::TempDir dir;
  const std::vector<std::string> source_sets = with({"parallelism.pp=2"}, schedule_sets);
  JobRun source = test::run_job(dir, "source", 2, kJob, source_sets);
  ASSERT_EQ(source.result.status, 0) << source.result.output;
  JobRun resaved = test::run_job(dir, "resaved", 2, kJob, {"parallelism.pp=2", load(source, 5), "training.steps=5"});
  ASSERT_EQ(resaved.result.status, 0) << resaved.result.output;
  expect_same_entries(source.dir + "/checkpoints/step-5", resaved.dir + "/checkpoints/step-5");
  JobRun next = test::run_job(dir, "next", 2, kJob, {"parallelism.pp=2", load(source, 5), "training.steps=6"});
  ASSERT_EQ(next.result.status, 0) << next.result.output;
  ASSERT_EQ(next.steps, (std::vector<int64_t>{6}));
  EXPECT_NEAR(next.loss[0], source.loss[5], test::kLossRtol * source.loss[5]);
  EXPECT_NEAR(next.grad_norm[0], source.grad_norm[5], test::kLossRtol * source.grad_norm[5]);
}

// Two stages per rank (layers 0 and 2 on rank 0, 1 and 3 on rank 1) saved, one per rank loaded.
TEST(Checkpoint, AnInterleavedCheckpointResumesUnderOneFOneB) { expect_resumes_under_one_f_one_b(kInterleaved); }

// The V saved: rank 0 held the embedding and its REPLICA side by side and wrote one copy.
TEST(Checkpoint, AZeroBubbleVCheckpointResumesUnderOneFOneB) {
  expect_resumes_under_one_f_one_b({"parallelism.schedule=zbv", "parallelism.stages_per_rank=2"});
}

TEST(Checkpoint, AKillDuringASaveLeavesThePreviousCheckpointLoadable) {
  test::TempDir dir;
  // The last rank dies after writing its file of step 4, before the checkpoint is complete.
  JobRun killed =
      test::run_job(dir, "run", 2, kJob, {"parallelism.pp=2", "checkpoint.interval=2", "debug.crash_in_checkpoint=4"});
  EXPECT_NE(killed.result.status, 0);
  EXPECT_TRUE(has(killed.result, "keel-launch: rank 1 was killed by signal 9")) << killed.result.output;
  const fs::path root = fs::path(killed.dir) / "checkpoints";
  EXPECT_TRUE(fs::exists(root / "step-4.partial" / "rank-00001.safetensors"));
  EXPECT_FALSE(fs::exists(root / "step-4"));
  EXPECT_EQ(resolve_checkpoint(root.string(), "latest"), (root / "step-2").string());
  try {
    resolve_checkpoint(root.string(), "4");
    ADD_FAILURE() << "the partial step-4 resolved";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("step-4 does not exist"), std::string::npos) << e.what();
  }
  // Resuming "latest" continues from step 2; the next save clears the partial folder.
  JobRun resumed =
      test::run_job(dir, "run", 2, kJob, {"parallelism.pp=2", "checkpoint.interval=2", "checkpoint.load=latest"});
  ASSERT_EQ(resumed.result.status, 0) << resumed.result.output;
  EXPECT_TRUE(has(resumed.result, "resuming after step 2")) << resumed.result.output;
  // The killed run's records after step 2 are replaced by the resumed run's: no duplicates.
  EXPECT_EQ(resumed.steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  EXPECT_FALSE(fs::exists(root / "step-4.partial"));
  EXPECT_TRUE(fs::exists(root / "step-10" / "manifest.json"));
}

// Corrupts `file` with `damage` and expects a resume to be refused with `message`.
void expect_refused(const std::function<void(const fs::path&)>& damage, const std::string& message) {
  test::TempDir dir;
  JobRun saved = test::run_job(dir, "saved", 2, kJob, {"parallelism.dp=2", "parallelism.ep=2"});
  ASSERT_EQ(saved.result.status, 0) << saved.result.output;
  damage(fs::path(saved.dir) / "checkpoints" / "step-5" / "rank-00001.safetensors");
  JobRun refused = test::run_job(dir, "refused", 1, kJob, {load(saved, 5)});
  EXPECT_EQ(refused.result.status, 2) << refused.result.output;
  EXPECT_TRUE(has(refused.result, message)) << refused.result.output;
  EXPECT_FALSE(fs::exists(refused.dir + "/metrics.jsonl"));  // refused before any step
}

TEST(Checkpoint, AFlippedByteIsRefusedNamingFileAndKey) {
  expect_refused(
      [](const fs::path& file) {
        std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(-3, std::ios::end);  // inside the last tensor's data
        char c = 0;
        f.read(&c, 1);
        f.seekp(-3, std::ios::end);
        c = static_cast<char>(c ^ 0x40);
        f.write(&c, 1);
      },
      "file rank-00001.safetensors, key '");
}

TEST(Checkpoint, ATruncatedShardIsRefusedNamingFileAndKey) {
  expect_refused([](const fs::path& file) { fs::resize_file(file, fs::file_size(file) - 100); },
                 "rank-00001.safetensors: ");
}

TEST(Checkpoint, PythonSafetensorsReadsEveryShard) {
  test::TempDir dir;
  JobRun saved = test::run_job(dir, "saved", 4, kJob, kPp2Dp2Ep2);
  ASSERT_EQ(saved.result.status, 0) << saved.result.output;
  const std::string step = saved.dir + "/checkpoints/step-5";
  auto r = test::run_command(
      "python3 -c \"import glob, json, sys\n"
      "from safetensors import safe_open\n"
      "m = json.load(open(sys.argv[1] + '/manifest.json'))\n"
      "want = sum(len(e['shards']) for e in m['entries'].values())\n"
      "got = 0\n"
      "for path in sorted(glob.glob(sys.argv[1] + '/rank-*.safetensors')):\n"
      "    with safe_open(path, 'pt') as f:\n"
      "        for k in f.keys(): f.get_tensor(k); got += 1\n"
      "print('shards', got, 'of', want)\" " +
      step);
  EXPECT_EQ(r.status, 0) << r.output;
  CheckpointReader reader(step);
  size_t shards = 0;
  for (const auto& [key, e] : reader.manifest().entries) shards += e.shards.size();
  EXPECT_NE(r.output.find("shards " + std::to_string(shards) + " of " + std::to_string(shards)), std::string::npos)
      << r.output;
  EXPECT_EQ(reader.verify_all(), shards);
}

TEST(Checkpoint, KeepLatestPrunesOlderCheckpoints) {
  test::TempDir dir;
  JobRun run = test::run_job(dir, "run", 1, kJob, {"checkpoint.interval=1", "checkpoint.keep_latest=2"});
  ASSERT_EQ(run.result.status, 0) << run.result.output;
  std::vector<std::string> names;
  for (const auto& item : fs::directory_iterator(run.dir + "/checkpoints"))
    names.push_back(item.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-10", "step-9"}));
  EXPECT_EQ(test::read_file(run.dir + "/checkpoints/latest"), "step-10\n");
}

TEST(Checkpoint, LoadModelOnlyStartsTheTrainingStateFresh) {
  test::TempDir dir;
  JobRun saved = test::run_job(dir, "saved", 1, kJob, {});
  ASSERT_EQ(saved.result.status, 0) << saved.result.output;
  JobRun fresh =
      test::run_job(dir, "fresh", 1, kJob, {load(saved, 10), "checkpoint.load_model_only=true", "training.steps=1"});
  ASSERT_EQ(fresh.result.status, 0) << fresh.result.output;
  EXPECT_EQ(fresh.steps, (std::vector<int64_t>{1}));
  EXPECT_FALSE(has(fresh.result, "resuming after step"));
  // The loaded weights trained one more step from a fresh optimizer: step counts restart at 1.
  EXPECT_EQ(fresh.state.at("optim.step.norm.weight").item<float>(), 1.0f);
  EXPECT_LT(fresh.loss[0], saved.loss[0]);  // the loaded model, not a fresh one
}

TEST(Checkpoint, AsynchronousSavesWriteTheSameCheckpoints) {
  test::TempDir dir;
  JobRun sync = test::run_job(dir, "sync", 2, kJob, {"parallelism.pp=2"});
  JobRun async = test::run_job(dir, "async", 2, kJob, {"parallelism.pp=2", "checkpoint.async=true"});
  ASSERT_EQ(sync.result.status, 0) << sync.result.output;
  ASSERT_EQ(async.result.status, 0) << async.result.output;
  EXPECT_TRUE(has(async.result, "% hidden)")) << async.result.output;
  for (int step : {5, 10})
    expect_same_entries(sync.dir + "/checkpoints/step-" + std::to_string(step),
                        async.dir + "/checkpoints/step-" + std::to_string(step));
}

TEST(Checkpoint, SigtermSavesTheLastStep) {
  test::TempDir dir;
  test::write_file(dir / "job.toml", kJob);
  std::string run = dir / "run";
  // In the background, its own output in files: run_command returns at once.
  std::string train = test::bin_dir() + "/keel-train --plugin-path " + test::plugin_dir() + " --config " +
                      (dir / "job.toml") + " --set job.run_dir=\\\"" + run + "\\\"";
  train += " --set training.steps=100000 --set checkpoint.interval=100000";
  std::string background = "(" + train + " > " + (dir / "log") + " 2>&1 & echo $! > " + (dir / "pid") +
                           "; wait $!; echo $? > " + (dir / "status") + ")";
  test::run_command(background + " > /dev/null 2>&1 &");
  for (int i = 0; i < 600 && test::read_file(dir / "log").find("step 3/") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(::kill(std::stoi(test::read_file(dir / "pid")), SIGTERM), 0);
  for (int i = 0; i < 600 && test::read_file(dir / "status").empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(test::read_file(dir / "status"), "0\n") << test::read_file(dir / "log");
  std::string latest = resolve_checkpoint(run + "/checkpoints", "latest");
  ASSERT_FALSE(latest.empty()) << test::read_file(dir / "log");
  EXPECT_GE(CheckpointReader(latest).manifest().step, 3);
}

}  // namespace
}  // namespace keel
