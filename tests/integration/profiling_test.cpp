// [profiling]: one Chrome trace per rank per window, holding LibTorch's operators and Keel's
// own phases as named ranges; the window's log line and metrics.jsonl record name the folder;
// bad settings are refused naming the key.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "test_support.hpp"

namespace keel {
namespace {

namespace fs = std::filesystem;

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

// Two pipeline stages of the tiny Llama, two microbatches: every phase but the DP reduction
// runs on each rank.
const char* kJob = R"([model]
plugin = "llama3"
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
log_interval = 100
[checkpoint]
interval = 3
save_final = false
[profiling]
enable = true
steps = [2, 3]
)";

// The names of the events in Chrome trace `path`.
std::set<std::string> event_names(const std::string& path) {
  const nlohmann::json trace = nlohmann::json::parse(test::read_file(path));
  std::set<std::string> names;
  for (const nlohmann::json& event : trace.at("traceEvents"))
    if (event.contains("name") && event["name"].is_string()) names.insert(event["name"].get<std::string>());
  return names;
}

std::string keel_train(const test::TempDir& dir) {
  return test::bin_dir() + "/keel-train --plugin-path " + test::plugin_dir() + " --config " + (dir / "job.toml") +
         " --set job.run_dir=\\\"" + (dir / "run") + "\\\"";
}

TEST(Profiling, EachRankWritesATraceOfTheWindowWithKeelsPhases) {
  test::TempDir dir;
  test::write_file(dir / "job.toml", kJob);
  auto r = test::run_command(test::source_dir() + "/tools/keel-launch --nproc 2 -- " + keel_train(dir));
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string folder = dir / "run/profiles/steps-2-3";
  EXPECT_HAS(r.output, "profiler traces of the window ending at step 3: " + folder + "/rank-*.json");
  EXPECT_EQ(r.output.find("USDT:"), std::string::npos) << "Kineto's own log lines stay out of the run's";
  EXPECT_HAS(test::read_file(dir / "run/metrics.jsonl"), "\"profile_traces\":\"" + folder + "\"");
  for (int rank : {0, 1}) {
    const std::string trace = folder + "/rank-" + std::to_string(rank) + ".json";
    ASSERT_TRUE(fs::is_regular_file(trace)) << trace << "\n" << r.output;
    const std::set<std::string> names = event_names(trace);
    for (const char* phase : {"keel::step", "keel::data", "keel::forward", "keel::backward", "keel::pre_clip",
                              "keel::clip", "keel::optimizer_step", "keel::checkpoint"})
      EXPECT_EQ(names.count(phase), 1u) << phase << " missing from " << trace;
    EXPECT_EQ(names.count(rank == 0 ? "keel::pipeline_send" : "keel::pipeline_recv"), 1u) << trace;
    EXPECT_EQ(names.count("aten::rms_norm"), 1u) << "LibTorch's operators are in " << trace;
  }
  // Nothing outside the window: one folder, no partial file.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir / "run/profiles"), fs::directory_iterator()), 1);
  EXPECT_EQ(std::distance(fs::directory_iterator(folder), fs::directory_iterator()), 2);
}

TEST(Profiling, AnIntervalRepeatsTheWindowAndDataParallelRanksTraceTheirReduction) {
  test::TempDir dir;
  test::write_file(dir / "job.toml", R"([model]
plugin = "llama3"
flavor = "tiny"
[training]
steps = 5
seq_len = 16
global_batch = 4
threads = 1
[parallelism]
dp = 2
[metrics]
log_interval = 100
jsonl = false
[checkpoint]
save_final = false
[profiling]
enable = true
steps = [1, 1]
interval = 2
folder = "traces/here"
)");
  auto r = test::run_command(test::source_dir() + "/tools/keel-launch --nproc 2 -- " + keel_train(dir));
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* window : {"steps-1-1", "steps-3-3", "steps-5-5"})
    for (int rank : {0, 1}) {
      const std::string trace = dir / "run/traces/here/" + window + "/rank-" + std::to_string(rank) + ".json";
      ASSERT_TRUE(fs::is_regular_file(trace)) << trace << "\n" << r.output;
      EXPECT_EQ(event_names(trace).count("keel::dp_reduce"), 1u) << trace;
    }
  EXPECT_FALSE(fs::exists(dir / "run/traces/here/steps-2-2"));
}

TEST(Profiling, OffByDefaultNoTraceIsWritten) {
  test::TempDir dir;
  test::write_file(dir / "job.toml", R"([model]
plugin = "llama3"
flavor = "tiny"
[training]
steps = 2
seq_len = 16
global_batch = 2
threads = 1
[checkpoint]
save_final = false
)");
  auto r = test::run_command(keel_train(dir));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_FALSE(fs::exists(dir / "run/profiles"));
  EXPECT_EQ(r.output.find("profiler traces"), std::string::npos) << r.output;
}

TEST(Profiling, BadSettingsAreRefusedNamingTheKey) {
  test::TempDir dir;
  test::write_file(dir / "job.toml", "[model]\nplugin = \"llama3\"\nflavor = \"tiny\"\n[training]\nsteps = 4\n");
  const std::pair<const char*, const char*> cases[] = {
      {"profiling.steps=[3,2]", "profiling.steps: must be [FIRST, LAST]"},
      {"profiling.steps=[0,2]", "profiling.steps: must be [FIRST, LAST]"},
      {"profiling.steps=[2]", "profiling.steps: must be [FIRST, LAST]"},
      {"profiling.interval=1", "profiling.interval: must exceed the window's length"},
      {"profiling.folder=\"../outside\"", "profiling.folder: must be a relative path inside the run folder"},
      {"profiling.folder=\"/tmp/x\"", "profiling.folder: must be a relative path inside the run folder"},
  };
  for (const auto& [set, message] : cases) {
    auto r = test::run_command(keel_train(dir) + " --set profiling.enable=true --set '" + set + "'");
    EXPECT_EQ(r.status, 2) << set << "\n" << r.output;
    EXPECT_HAS(r.output, message);
  }
  auto late = test::run_command(keel_train(dir) + " --set profiling.enable=true --set 'profiling.steps=[5,6]'");
  EXPECT_EQ(late.status, 2) << late.output;
  EXPECT_HAS(late.output, "profiling.steps: the window starts at step 5, after the run's last (training.steps = 4)");
}

}  // namespace
}  // namespace keel
