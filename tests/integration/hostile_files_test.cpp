// keel-train and keel-ckpt against files that are not what the config or a checkpoint folder
// promises: a FIFO, a folder or a device as data.path or validation.data, a FIFO as a
// checkpoint shard or as another checkpoint's save record, a split that holds out nothing, and
// a token file truncated while a two-rank job reads it. Each is refused (exit 2) naming the key
// and the file, at once; the truncated file stops every rank at the same step, after the last
// whole step is checkpointed.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "common/text.hpp"
#include "data/token_file.hpp"
#include "job_runs.hpp"

namespace keel {
namespace {

namespace fs = std::filesystem;

// The tiny DeepSeek-V3 job (vocabulary 256) on a token file.
std::string token_job(const std::string& data) {
  return test::tiny_deepseek_job() + "[data]\nsource = \"tokens\"\npath = \"" + data + "\"\n";
}

std::string token_file(const test::TempDir& dir, const std::string& name, size_t tokens) {
  std::vector<uint32_t> ids(tokens);
  for (size_t i = 0; i < tokens; ++i) ids[i] = static_cast<uint32_t>((i * 7919) % 251);
  write_token_file(dir / name, ids, 256);
  return dir / name;
}

void expect_refused(const test::JobRun& run, const std::vector<std::string>& named) {
  EXPECT_EQ(run.result.status, 2) << run.result.output;
  for (const std::string& word : named)
    EXPECT_NE(run.result.output.find(word), std::string::npos) << word << ":\n" << run.result.output;
  EXPECT_LT(run.seconds, 60) << "the refusal took " << run.seconds << " s";
}

TEST(HostileFiles, AFifoAFolderOrADeviceAsDataIsRefusedNamingTheKey) {
  test::TempDir dir;
  const std::string good = token_file(dir, "good.tok", 20000);
  ASSERT_EQ(::mkfifo((dir / "fifo.tok").c_str(), 0644), 0);
  fs::create_directory(dir / "folder.tok");
  fs::create_symlink("/dev/zero", dir / "device.tok");
  const std::pair<const char*, const char*> impostors[] = {
      {"fifo.tok", "is a FIFO"}, {"folder.tok", "is a folder"}, {"device.tok", "is a character device"}};
  for (const auto& [name, kind] : impostors) {
    const std::string path = dir / name;
    expect_refused(test::run_job(dir, cat("data_", name), 1, token_job(path), {}), {"data.path", path, kind});
    expect_refused(test::run_job(dir, cat("validation_", name), 1, token_job(good),
                                 {cat("validation.data=\\\"", path, "\\\""), "validation.interval=2"}),
                   {"validation.data", path, kind});
  }
}

TEST(HostileFiles, AMissingValidationFileIsBlamedOnValidationData) {
  test::TempDir dir;
  const std::string good = token_file(dir, "good.tok", 20000), absent = dir / "absent.tok";
  const test::JobRun run = test::run_job(dir, "missing", 1, token_job(good),
                                         {cat("validation.data=\\\"", absent, "\\\""), "validation.interval=2"});
  expect_refused(run, {"validation.data: " + absent});
  EXPECT_EQ(run.result.output.find("data.path"), std::string::npos) << run.result.output;
}

TEST(HostileFiles, ASplitThatHoldsOutNoBlockIsRefused) {
  test::TempDir dir;
  const std::string good = token_file(dir, "good.tok", 20000);  // 200 blocks of 100
  const std::pair<const char*, const char*> splits[] = {
      {"5e-324", "a subnormal number reads as 0"}, {"1e-300", "holds out no block"}, {"0.0024", "holds out no block"}};
  for (const auto& [split, why] : splits)
    expect_refused(
        test::run_job(dir, cat("split_", split), 1, token_job(good),
                      {cat("validation.split=", split), "validation.split_block=100", "validation.interval=2"}),
        {"validation.split", why});
}

TEST(HostileFiles, AnOlderCheckpointsSaveRecordAsAFifoOrAFolderDoesNotStopTheSaves) {
  test::TempDir dir;
  const std::string good = token_file(dir, "good.tok", 20000);
  for (const char* kind : {"fifo", "folder"}) {
    const std::string root = dir / cat("checkpoints_", kind);
    const std::vector<std::string> saves = {"checkpoint.interval=1", cat("checkpoint.dir=\\\"", root, "\\\"")};
    std::vector<std::string> first = saves, resumed = saves;
    first.push_back("training.steps=2");
    const test::JobRun before = test::run_job(dir, cat("first_", kind), 1, token_job(good), first);
    ASSERT_EQ(before.result.status, 0) << before.result.output;
    // The record that says step-1 is this run's first save becomes something else.
    const std::string record = root + "/step-1/save.json";
    fs::remove(record);
    if (std::string(kind) == "fifo")
      ASSERT_EQ(::mkfifo(record.c_str(), 0644), 0);
    else
      fs::create_directory(record);
    resumed.insert(resumed.end(), {"training.steps=4", "checkpoint.keep_latest=1", "checkpoint.load=\\\"latest\\\""});
    const test::JobRun run = test::run_job(dir, cat("resumed_", kind), 1, token_job(good), resumed);
    EXPECT_EQ(run.result.status, 0) << kind << ":\n" << run.result.output;
    EXPECT_TRUE(fs::exists(root + "/step-4/manifest.json")) << kind;
    EXPECT_FALSE(fs::exists(root + "/step-3")) << kind << ": this run's older checkpoint was not pruned";
    EXPECT_TRUE(fs::exists(root + "/step-1")) << kind << ": a checkpoint not known to be this run's was removed";
  }
}

TEST(HostileFiles, AFifoAsACheckpointShardIsRefusedByVerifyExportAndLoad) {
  test::TempDir dir;
  const std::string good = token_file(dir, "good.tok", 20000);
  const test::JobRun saved =
      test::run_job(dir, "saved", 1, token_job(good), {"training.steps=2", "checkpoint.interval=2"});
  ASSERT_EQ(saved.result.status, 0) << saved.result.output;
  const std::string checkpoint = saved.dir + "/checkpoints/step-2";
  std::string shard;
  for (const auto& entry : fs::directory_iterator(checkpoint))
    if (entry.path().extension() == ".safetensors") shard = entry.path().string();
  ASSERT_FALSE(shard.empty());
  fs::remove(shard);
  ASSERT_EQ(::mkfifo(shard.c_str(), 0644), 0);
  const std::string ckpt = "timeout 60 " + test::bin_dir() + "/keel-ckpt ";
  for (const std::string& command :
       {ckpt + "verify " + checkpoint, ckpt + "export --keel " + (dir / "w.safetensors") + " " + checkpoint}) {
    const test::CommandResult result = test::run_command(command);
    EXPECT_EQ(result.status, 2) << command << ":\n" << result.output;
    EXPECT_NE(result.output.find(shard), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("is a FIFO"), std::string::npos) << result.output;
  }
  expect_refused(test::run_job(dir, "load", 1, token_job(good), {cat("checkpoint.load=\\\"", checkpoint, "\\\"")}),
                 {shard, "is a FIFO"});
}

TEST(HostileFiles, ATokenFileTruncatedUnderATwoRankJobStopsEveryRankAfterSavingTheLastStep) {
  test::TempDir dir;
  const std::string data = token_file(dir, "data.tok", 400000);
  const std::string run_dir = dir / "truncated";
  // Truncates the file once the job has logged its third step.
  std::atomic<bool> truncated{false};
  std::thread truncator([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
    while (std::chrono::steady_clock::now() < deadline) {
      if (test::read_file(run_dir + "/metrics.jsonl").find("\"step\":3,") != std::string::npos) {
        fs::resize_file(data, 5000);
        truncated = true;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  const test::JobRun run = test::run_job(
      dir, "truncated", 2, token_job(data),
      {"training.steps=100000", "parallelism.dp=2", "checkpoint.interval=100000", "debug.dump_state=false"});
  truncator.join();
  ASSERT_TRUE(truncated) << run.result.output;
  EXPECT_EQ(run.result.status, 2) << run.result.output;
  // The rank whose read failed says why; any other says which rank failed, reading what.
  EXPECT_NE(run.result.output.find("error: data.path: " + data + " changed while the job read it"), std::string::npos)
      << run.result.output;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string prefix = cat("[rank ", rank, "] [keel ", rank, "] error: ");
    const size_t at = run.result.output.find(prefix);
    ASSERT_NE(at, std::string::npos) << "rank " << rank << " reports no error:\n" << run.result.output;
    const std::string line = run.result.output.substr(at, run.result.output.find('\n', at) - at);
    EXPECT_NE(line.find(data), std::string::npos) << line;
  }
  EXPECT_EQ(run.result.output.find("signal"), std::string::npos) << run.result.output;
  // The last whole step is saved, and keel-ckpt finds it complete.
  const std::string latest = test::read_file(run_dir + "/checkpoints/latest");
  ASSERT_FALSE(latest.empty()) << run.result.output;
  const std::string checkpoint = run_dir + "/checkpoints/" + latest.substr(0, latest.find('\n'));
  const test::CommandResult verify = test::run_command(test::bin_dir() + "/keel-ckpt verify " + checkpoint);
  EXPECT_EQ(verify.status, 0) << verify.output;
  EXPECT_NE(run.result.output.find("stopping after step"), std::string::npos) << run.result.output;
}

}  // namespace
}  // namespace keel
