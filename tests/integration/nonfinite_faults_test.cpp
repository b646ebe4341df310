// The fault matrix's non-finite rows: a NaN gradient on one rank of a dp = 2 job (norm_type 2
// and "inf") and a non-finite plugin metric at dp = 2. Every rank skips the step together, the
// job finishes, and the skipped step changes no checkpointed tensor: parameters, AdamW's
// moments and step counts, the expert bias, the clipper's counters.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_reader.hpp"
#include "job_runs.hpp"
#include "metrics/json_number.hpp"

namespace keel {
namespace {

using test::JobRun;

// The shared tiny DeepSeek-V3 job, 3 steps, a checkpoint after each, dp = 2 with experts split
// over ep = 2 (each rank holds experts no other rank holds).
const std::string kJob = test::tiny_deepseek_job("interval = 1\n");
const std::vector<std::string> kDp2Ep2 = {"parallelism.dp=2", "parallelism.ep=2", "training.steps=3"};

std::vector<std::string> with(std::vector<std::string> sets, const std::vector<std::string>& more) {
  sets.insert(sets.end(), more.begin(), more.end());
  return sets;
}

std::string step_dir(const JobRun& run, int step) { return run.dir + "/checkpoints/step-" + std::to_string(step); }

// metrics.jsonl as records by step.
std::vector<nlohmann::json> records(const JobRun& run) {
  std::vector<nlohmann::json> out;
  std::istringstream in(test::read_file(run.dir + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// The keys whose tensors differ between two checkpoints (per-rank random states aside), and
// how many were compared.
std::vector<std::string> differing(const std::string& a, const std::string& b, size_t* compared) {
  CheckpointReader x(a), y(b);
  std::vector<std::string> out;
  *compared = 0;
  for (const auto& [key, entry] : x.manifest().entries) {
    if (key.rfind("rng.", 0) == 0) continue;
    if (!y.has(key) || !at::equal(x.read_whole(key), y.read_whole(key))) out.push_back(key);
    ++*compared;
  }
  return out;
}

bool has_key(const std::string& dir, const std::string& part) {
  CheckpointReader r(dir);
  for (const auto& [key, entry] : r.manifest().entries)
    if (key.find(part) != std::string::npos) return true;
  return false;
}

// A NaN in one gradient of rank 1 at step 2: the step is skipped on every rank and step-2
// holds exactly what step-1 holds; step 3 trains again.
void expect_step_2_skipped_everywhere(const std::vector<std::string>& sets) {
  test::TempDir dir;
  JobRun run = test::run_job(dir, "nan", 2, kJob, with(kDp2Ep2, sets));
  ASSERT_EQ(run.result.status, 0) << run.result.output;
  EXPECT_NE(run.result.output.find("debug.nan_grad_step: step 2: a NaN put into the gradient of"), std::string::npos)
      << run.result.output;
  std::vector<nlohmann::json> r = records(run);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_FALSE(r[0]["skipped"].get<bool>());
  EXPECT_TRUE(r[1]["skipped"].get<bool>()) << r[1].dump();
  EXPECT_FALSE(std::isfinite(number_from_json(r[1]["grad_norm"]))) << r[1].dump();
  EXPECT_FALSE(r[2]["skipped"].get<bool>());

  size_t compared = 0;
  std::vector<std::string> moved = differing(step_dir(run, 1), step_dir(run, 2), &compared);
  EXPECT_TRUE(moved.empty()) << moved.size() << " entries moved on the skipped step, e.g. " << moved.front();
  EXPECT_GT(compared, 100u);
  EXPECT_TRUE(has_key(step_dir(run, 1), "moe.expert_bias"));
  EXPECT_TRUE(has_key(step_dir(run, 1), "clipper.norm_clipper.steps"));
  CheckpointReader after(step_dir(run, 3));
  EXPECT_EQ(after.read_whole("clipper.norm_clipper.steps").item<double>(), 2.0);  // steps 1 and 3
  EXPECT_FALSE(differing(step_dir(run, 2), step_dir(run, 3), &compared).empty());

  // What loads: the checkpoint of the skipped step resumes and trains step 3 to the same loss.
  JobRun resumed =
      test::run_job(dir, "resumed", 2, kJob, with(kDp2Ep2, {"checkpoint.load=\\\"" + step_dir(run, 2) + "\\\""}));
  ASSERT_EQ(resumed.result.status, 0) << resumed.result.output;
  ASSERT_EQ(resumed.loss.size(), 1u);
  EXPECT_EQ(resumed.loss.back(), run.loss.back());
}

TEST(NonFiniteFaults, NanGradientOnOneRankSkipsTheStepOnEveryRankWithNorm2) {
  expect_step_2_skipped_everywhere({"debug.nan_grad_step=2", "debug.nan_grad_rank=1"});
}

TEST(NonFiniteFaults, NanExpertGradientOnOneRankSkipsTheStepOnEveryRankWithNormInf) {
  // Only rank 1 holds these experts: its NaN reaches rank 0 only through the clipper's MAX
  // reduction, which Gloo may let drop it, and through the host's summed non-finite flag.
  expect_step_2_skipped_everywhere({"debug.nan_grad_step=2", "debug.nan_grad_rank=1",
                                    "'debug.nan_grad_param=*moe.experts.w1'", "clipper.norm_type=\\\"inf\\\""});
}

TEST(NonFiniteFaults, NonFinitePluginMetricsAtDp2AreLoggedAsNanAndNeverFatal) {
  // route_scale 1e300 overflows the routed experts' weights: the loss and the gradients are
  // non-finite at every step, and so are metrics the plugin reports.
  test::TempDir dir;
  JobRun run =
      test::run_job(dir, "metric", 2, kJob, {"parallelism.dp=2", "training.steps=2", "model.route_scale=1e300"});
  ASSERT_EQ(run.result.status, 0) << run.result.output;
  std::vector<nlohmann::json> r = records(run);
  ASSERT_EQ(r.size(), 2u);
  size_t non_finite = 0;
  for (const nlohmann::json& record : r) {
    EXPECT_TRUE(record["skipped"].get<bool>()) << record.dump();
    for (const auto& [name, value] : record.items())
      if (value.is_string()) {
        EXPECT_TRUE(value == "nan" || value == "inf" || value == "-inf") << name << " " << value;
        ++non_finite;
      }
    EXPECT_FALSE(record.contains("loss") && record["loss"].is_null());
  }
  EXPECT_GT(non_finite, 0u);
  EXPECT_NE(run.result.output.find("loss nan"), std::string::npos) << run.result.output;
  size_t compared = 0;
  std::vector<std::string> moved = differing(step_dir(run, 1), step_dir(run, 2), &compared);
  EXPECT_TRUE(moved.empty()) << moved.size() << " entries moved on a skipped step, e.g. " << moved.front();
  EXPECT_GT(compared, 100u);
}

}  // namespace
}  // namespace keel
