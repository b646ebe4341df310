// Data parallelism across real processes (torchrun's environment set by hand): a DP2 run
// matches the single-rank run of the same job step by step, for both model plugins.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "test_support.hpp"

namespace keel {
namespace {

struct Curve {
  std::vector<double> loss, grad_norm;
};

Curve read_curve(const std::string& path) {
  Curve c;
  std::istringstream in(test::read_file(path));
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    c.loss.push_back(j["loss"]);
    c.grad_norm.push_back(j["grad_norm"]);
  }
  return c;
}

// Trains `model` (tiny flavor) for 8 steps on `world` ranks with dp = world; returns rank 0's curve.
Curve train(const test::TempDir& dir, const std::string& model, int world) {
  std::string run = dir / ("run" + std::to_string(world));
  std::string args = " --plugin-path " + test::plugin_dir() + " --config " + (dir / "job.toml") +
                     " --set model.plugin=" + model + " --set parallelism.dp=" + std::to_string(world) +
                     " --set job.run_dir=\\\"" + run + "\\\"";
  std::string cmd = "pids=''; for r in $(seq 0 " + std::to_string(world - 1) +
                    "); do RANK=$r LOCAL_RANK=$r WORLD_SIZE=" + std::to_string(world) +
                    " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(test::free_port()) + " timeout 300 " +
                    test::bin_dir() + "/keel-train" + args + " > " + run +
                    ".$r.log 2>&1 & pids=\"$pids $!\"; done; rc=0; for p in $pids; do wait $p || rc=1; done; exit $rc";
  auto r = test::run_command(cmd);
  EXPECT_EQ(r.status, 0) << test::read_file(run + ".0.log") << (world > 1 ? test::read_file(run + ".1.log") : "");
  return read_curve(run + "/metrics.jsonl");
}

void expect_same_run(const std::string& model) {
  test::TempDir dir;
  test::write_file(dir / "job.toml", R"([model]
plugin = "llama3"
flavor = "tiny"
[clipper]
max_norm = 0.5
[training]
steps = 8
seq_len = 16
global_batch = 8
threads = 1
[optimizer]
lr = 3e-3
[metrics]
log_interval = 1
)");
  Curve one = train(dir, model, 1), two = train(dir, model, 2);
  ASSERT_EQ(one.loss.size(), 8u);
  ASSERT_EQ(two.loss.size(), 8u);
  for (size_t s = 0; s < 8; ++s) {
    EXPECT_NEAR(two.loss[s], one.loss[s], 1e-5 * one.loss[s]) << model << " step " << s + 1;
    EXPECT_NEAR(two.grad_norm[s], one.grad_norm[s], 1e-5 * one.grad_norm[s]) << model << " step " << s + 1;
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "run2/metrics.jsonl.partial"));
  EXPECT_TRUE(std::filesystem::exists(dir / "run2/final/model.safetensors"));  // written once, by rank 0
}

TEST(DataParallel, Llama3Dp2MatchesTheSingleRankRun) { expect_same_run("llama3"); }

TEST(DataParallel, DeepSeekV3Dp2MatchesTheSingleRankRun) { expect_same_run("deepseek_v3_mtp"); }

}  // namespace
}  // namespace keel
