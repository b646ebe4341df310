// metrics.tensorboard: keel-train's event files read back with TensorBoard's own reader
// (read_tensorboard.py, the EventAccumulator the viewer uses) hold metrics.jsonl's figures.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>
#include <vector>

#include "job_runs.hpp"
#include "metrics/json_number.hpp"
#include "test_support.hpp"

namespace keel {
namespace {

// A figure's (step, value) pairs in the order they were read; duplicates kept.
using Curves = std::map<std::string, std::vector<std::pair<int64_t, double>>>;

const char* kLlama = "[model]\nplugin = \"llama3\"\nflavor = \"tiny\"\n";
const char* kDeepSeek = "[model]\nplugin = \"deepseek_v3_mtp\"\n[model.deepseek_v3_mtp]\nflavor = \"tiny\"\n";
const std::vector<std::string> kHostFigures = {"loss", "grad_norm", "lr", "tokens_per_second", "peak_memory_bytes"};

const char* kTraining = "[training]\nseq_len = 16\nglobal_batch = 4\nthreads = 1\n";

// Trains `model` in `dir`/run with a record every step and `sets` applied.
test::CommandResult train(const test::TempDir& dir, const std::string& model, const std::string& sets) {
  test::write_file(dir / "job.toml", model + kTraining);
  return test::run_command(test::bin_dir() + "/keel-train --plugin-path " + test::plugin_dir() + " --config " +
                           (dir / "job.toml") + " --set job.run_dir=\\\"" + (dir / "run") + "\\\"" +
                           " --set metrics.log_interval=1 " + sets);
}

Curves jsonl_curves(const std::string& path) {
  Curves curves;
  std::istringstream in(test::read_file(path));
  for (std::string line; std::getline(in, line);) {
    auto record = nlohmann::json::parse(line);
    for (const auto& [key, value] : record.items())  // every scalar; per-rank lists are not
      if (key != "step" && key != "skipped" && !value.is_array())
        curves[key].emplace_back(record["step"], number_from_json(value));
  }
  return curves;
}

Curves tensorboard_curves(const test::TempDir& dir) {
  auto r = test::run_command("python3 " + test::source_dir() + "/tests/integration/read_tensorboard.py " +
                             (dir / "run/tensorboard") + " " + (dir / "tensorboard.json"));
  EXPECT_EQ(r.status, 0) << r.output;
  Curves curves;
  const nlohmann::json read = nlohmann::json::parse(test::read_file(dir / "tensorboard.json"));
  for (const auto& [tag, events] : read["tags"].items())
    for (const auto& event : events) curves[tag].emplace_back(event[0], number_from_json(event[1]));
  return curves;
}

std::vector<std::string> event_files(const test::TempDir& dir) {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir / "run/tensorboard"))
    files.push_back(entry.path().string());
  return files;
}

// Every tag in `expected` is in TensorBoard with steps 1..`steps` once each, and every tag's
// values are metrics.jsonl's rounded to float32 (what TensorBoard stores).
void expect_jsonl_figures(const test::TempDir& dir, const std::vector<std::string>& expected, int64_t steps) {
  const Curves jsonl = jsonl_curves(dir / "run/metrics.jsonl");
  const Curves tensorboard = tensorboard_curves(dir);
  for (const std::string& tag : expected) {
    ASSERT_TRUE(tensorboard.count(tag)) << tag;
    std::vector<int64_t> logged;
    for (const auto& [step, value] : tensorboard.at(tag)) logged.push_back(step);
    std::vector<int64_t> all(static_cast<size_t>(steps));
    for (int64_t s = 1; s <= steps; ++s) all[static_cast<size_t>(s - 1)] = s;
    EXPECT_EQ(logged, all) << tag;
  }
  for (const auto& [tag, events] : tensorboard) {
    ASSERT_TRUE(jsonl.count(tag)) << tag << " is not in metrics.jsonl";
    ASSERT_EQ(events.size(), jsonl.at(tag).size()) << tag;
    for (size_t i = 0; i < events.size(); ++i) {
      const auto& [step, value] = jsonl.at(tag)[i];
      EXPECT_EQ(events[i].first, step) << tag;
      EXPECT_EQ(events[i].second, static_cast<double>(static_cast<float>(value))) << tag << " at step " << step;
    }
  }
}

TEST(TensorBoard, EventFilesHoldMetricsJsonlFiguresOfEveryStep) {
  test::TempDir dir;
  auto r = train(dir, kLlama, "--set training.steps=4 --set metrics.tensorboard=true");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(event_files(dir).size(), 1u);
  expect_jsonl_figures(dir, kHostFigures, 4);
}

TEST(TensorBoard, PluginMetricsAreScalarsUnderTheirNames) {
  test::TempDir dir;
  auto r = train(dir, kDeepSeek, "--set training.steps=3 --set metrics.tensorboard=true");
  ASSERT_EQ(r.status, 0) << r.output;
  std::vector<std::string> expected = kHostFigures;
  expected.insert(expected.end(), {"lm_loss", "mtp_loss", "load_max_over_mean.layers.1"});
  expect_jsonl_figures(dir, expected, 3);
}

TEST(TensorBoard, AResumedRunAddsAFileAndSupersedesTheStepsAfterItsCheckpoint) {
  test::TempDir dir;
  // The first run logs steps 1..4 but resumes from step 2, as a run that died after it would.
  auto first = train(dir, kLlama, "--set training.steps=4 --set checkpoint.interval=2 --set metrics.tensorboard=true");
  ASSERT_EQ(first.status, 0) << first.output;
  ASSERT_EQ(event_files(dir).size(), 1u);
  const std::string first_file = event_files(dir)[0], first_bytes = test::read_file(first_file);
  auto second = train(dir, kLlama, "--set training.steps=6 --set checkpoint.load=2 --set metrics.tensorboard=true");
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_EQ(event_files(dir).size(), 2u);
  EXPECT_EQ(test::read_file(first_file), first_bytes);
  // metrics.jsonl holds steps 1, 2 of the first run and 3..6 of the second: so must TensorBoard.
  expect_jsonl_figures(dir, kHostFigures, 6);
}

TEST(TensorBoard, OffByDefault) {
  test::TempDir dir;
  auto r = train(dir, kLlama, "--set training.steps=1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir / "run/metrics.jsonl"));
  EXPECT_FALSE(std::filesystem::exists(dir / "run/tensorboard"));
}

TEST(TensorBoard, OnlyRankZeroWritesAtDataParallel2) {
  test::TempDir dir;
  auto run =
      test::run_job(dir, "run", 2, std::string(kLlama) + kTraining,
                    {"parallelism.dp=2", "training.steps=3", "metrics.log_interval=1", "metrics.tensorboard=true"});
  ASSERT_EQ(run.result.status, 0) << run.result.output;
  EXPECT_EQ(event_files(dir).size(), 1u);
  expect_jsonl_figures(dir, kHostFigures, 3);
}

}  // namespace
}  // namespace keel
