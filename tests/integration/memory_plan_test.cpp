// The memory plan of keel-train --dry-run against what a trainer allocates: the dry run builds
// every rank's part on the meta device and prints each rank's parameter, gradient, optimizer
// and buffer bytes; a real run of the same layout logs the same lines from its tensors, which
// must be equal to the byte. Every rank's peak memory reaches the log and metrics.jsonl.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "job_runs.hpp"

namespace keel {
namespace {

const std::vector<std::string> kLayout = {"parallelism.pp=2", "parallelism.dp=2", "parallelism.ep=2"};

// The text after `marker` on every line of `output` that holds it.
std::vector<std::string> lines_after(const std::string& output, const std::string& marker) {
  std::vector<std::string> found;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (size_t at = line.find(marker); at != std::string::npos) found.push_back(line.substr(at + marker.size()));
  return found;
}

test::CommandResult dry_run(const test::TempDir& dir, const std::string& sets,
                            const std::vector<std::string>& layout = kLayout) {
  test::write_file(dir / "plan.toml", test::tiny_deepseek_job());
  std::string command = test::bin_dir() + "/keel-train --dry-run --plugin-path " + test::plugin_dir() + " --config " +
                        (dir / "plan.toml") + sets;
  for (const std::string& s : layout) command += " --set " + s;
  return test::run_command(command);
}

// The dry run's lines against the lines a run of `ranks` ranks logs, equal to the byte;
// returns the planned lines.
std::vector<std::string> expect_plan_is_what_ranks_allocate(const std::string& label, int ranks,
                                                            const std::vector<std::string>& layout) {
  test::TempDir dir;
  auto plan = dry_run(dir, "", layout);
  EXPECT_EQ(plan.status, 0) << plan.output;
  // The plan's lines, "  rank(s) ...: parameters ...", follow its heading.
  const std::string heading = "memory plan, training state per rank";
  if (plan.output.find(heading) == std::string::npos) {
    ADD_FAILURE() << plan.output;
    return {};
  }
  // The state lines end where the activation estimate begins.
  const size_t start = plan.output.find(heading);
  const std::string state = plan.output.substr(start, plan.output.find("activation estimate", start) - start);
  std::vector<std::string> planned;
  for (const std::string& line : lines_after(state, "  rank")) planned.push_back("rank" + line);

  std::vector<std::string> sets = layout;
  sets.push_back("training.steps=2");
  test::JobRun run = test::run_job(dir, "run", ranks, test::tiny_deepseek_job(), sets);
  EXPECT_EQ(run.result.status, 0) << run.result.output;
  const std::vector<std::string> held = lines_after(run.result.output, "training state, ");
  EXPECT_EQ(held, planned) << plan.output << run.result.output;
  for (const std::string& line : planned) std::printf("MEMORY_PLAN | %s tiny | %s\n", label.c_str(), line.c_str());
  return planned;
}

TEST(MemoryPlan, TheDryRunsStateBytesAreWhatEveryRankAllocates) {
  // Two stages; the two expert shards of a stage are of one size, so their ranks share a line.
  EXPECT_EQ(expect_plan_is_what_ranks_allocate("PP2 DP2 EP2", 4, kLayout).size(), 2u);
}

TEST(MemoryPlan, AShardedOptimizersStateBytesAreWhatEveryRankAllocates) {
  std::vector<std::string> sharded = kLayout;
  sharded.push_back("parallelism.shard_optimizer=true");
  EXPECT_GE(expect_plan_is_what_ranks_allocate("PP2 DP2 EP2 sharded", 4, sharded).size(), 2u);
  // Experts sharded over edp = 2 too.
  EXPECT_GE(expect_plan_is_what_ranks_allocate(
                "DP4 EP2 sharded", 4, {"parallelism.dp=4", "parallelism.ep=2", "parallelism.shard_optimizer=true"})
                .size(),
            1u);
}

TEST(MemoryPlan, EveryRanksPeakMemoryIsLoggedAndTheLargestNamed) {
  test::TempDir dir;
  std::vector<std::string> sets = kLayout;
  sets.push_back("training.steps=2");
  test::JobRun run = test::run_job(dir, "run", 4, test::tiny_deepseek_job(), sets);
  ASSERT_EQ(run.result.status, 0) << run.result.output;
  std::istringstream in(test::read_file(run.dir + "/metrics.jsonl"));
  int records = 0;
  for (std::string line; std::getline(in, line); ++records) {
    const auto j = nlohmann::json::parse(line);
    ASSERT_TRUE(j.contains("peak_memory_bytes_by_rank")) << line;
    const auto& by_rank = j["peak_memory_bytes_by_rank"];
    ASSERT_EQ(by_rank.size(), 4u) << line;
    double largest = 0;
    for (const auto& bytes : by_rank) {
      EXPECT_GT(bytes.get<double>(), 0) << line;
      largest = std::max(largest, bytes.get<double>());
    }
    EXPECT_EQ(j["peak_memory_bytes"].get<double>(), largest) << line;
  }
  EXPECT_EQ(records, 2);
  EXPECT_NE(run.result.output.find(" max (rank "), std::string::npos) << run.result.output;
}

// The number after `marker` in `line`.
int64_t number_after(const std::string& line, const std::string& marker) {
  const size_t at = line.find(marker);
  return at == std::string::npos ? -1 : std::stoll(line.substr(at + marker.size()));
}

// The activation estimate's line of each stage, after its ranks: "0,1: 381312 B ... in flight = ...".
std::vector<std::string> activation_lines(const std::string& output) {
  std::vector<std::string> found;
  for (const std::string& l : lines_after(output, "  ranks "))
    if (l.find(" in flight = ") != std::string::npos) found.push_back(l);
  return found;
}

TEST(MemoryPlan, ActivationsArePlannedPerStageForTheMicrobatchesItsScheduleHolds) {
  test::TempDir dir;
  // 1F1B on two stages with two microbatches: stage 0 holds both, stage 1 one at a time.
  auto plan = dry_run(dir, "");
  ASSERT_EQ(plan.status, 0) << plan.output;
  EXPECT_NE(plan.output.find("activation estimate per rank (recompute none, schedule 1f1b, microbatches of 2 x 16 "
                             "tokens):"),
            std::string::npos)
      << plan.output;
  const std::vector<std::string> stages = activation_lines(plan.output);
  ASSERT_EQ(stages.size(), 2u) << plan.output;
  EXPECT_EQ(stages[0].rfind("0,1: ", 0), 0u) << stages[0];
  EXPECT_NE(stages[0].find(" per microbatch x 2 in flight"), std::string::npos) << stages[0];
  EXPECT_EQ(stages[1].rfind("2,3: ", 0), 0u) << stages[1];
  EXPECT_NE(stages[1].find(" per microbatch x 1 in flight"), std::string::npos) << stages[1];
  const int64_t first = number_after(stages[0], ": "), last = number_after(stages[1], ": ");
  EXPECT_GT(first, 0);
  EXPECT_GT(last, first) << "the last stage also keeps the head's and MTP's activations";

  // GPipe holds every microbatch; full recomputation keeps much less of each.
  auto gpipe = dry_run(dir, " --set parallelism.schedule=gpipe --set training.recompute=full");
  ASSERT_EQ(gpipe.status, 0) << gpipe.output;
  const std::vector<std::string> gpipe_lines = activation_lines(gpipe.output);
  ASSERT_EQ(gpipe_lines.size(), 2u) << gpipe.output;
  EXPECT_NE(gpipe_lines[1].find(" per microbatch x 2 in flight"), std::string::npos) << gpipe_lines[1];
  EXPECT_LT(number_after(gpipe_lines[0], ": "), first / 2) << gpipe.output;

  // ZB-H1's last stage defers a weight pass and holds two microbatches, 1F1B's first stage's count.
  auto zero_bubble = dry_run(dir, " --set parallelism.schedule=zb_h1");
  ASSERT_EQ(zero_bubble.status, 0) << zero_bubble.output;
  const std::vector<std::string> zb_lines = activation_lines(zero_bubble.output);
  ASSERT_EQ(zb_lines.size(), 2u) << zero_bubble.output;
  EXPECT_NE(zb_lines[0].find(" per microbatch x 2 in flight"), std::string::npos) << zb_lines[0];
  EXPECT_NE(zb_lines[1].find(" per microbatch x 2 in flight"), std::string::npos) << zb_lines[1];
  EXPECT_EQ(number_after(zb_lines[1], ": "), last);
}

TEST(MemoryPlan, InterleavingPlansEachRanksStagesAndTheirStateAsAllocated) {
  // Two stages per rank: the plan's state lines are still what every rank allocates.
  const std::vector<std::string> interleaved = {"parallelism.pp=2", "parallelism.dp=2", "parallelism.ep=2",
                                                "parallelism.schedule=interleaved_1f1b",
                                                "parallelism.stages_per_rank=2"};
  EXPECT_EQ(expect_plan_is_what_ranks_allocate("PP2 DP2 EP2 v2", 4, interleaved).size(), 2u);
  // Two microbatches on two ranks: every pass warms up, so each rank holds both microbatches on
  // both of its stages at the peak, the sum of its stages' estimates twice over.
  test::TempDir dir;
  auto plan = dry_run(dir, "", interleaved);
  ASSERT_EQ(plan.status, 0) << plan.output;
  EXPECT_NE(plan.output.find("schedule interleaved_1f1b (2 stages per rank), 2 microbatch(es)"), std::string::npos)
      << plan.output;
  EXPECT_NE(plan.output.find("stage 2/4, layers 2-2 (1)"), std::string::npos) << plan.output;
  const std::vector<std::string> stages = activation_lines(plan.output);
  ASSERT_EQ(stages.size(), 2u) << plan.output;
  for (const std::string& line : stages)
    EXPECT_NE(line.find(" per microbatch through its 2 stages, at most 4 stage passes in flight = "), std::string::npos)
        << line;
}

TEST(MemoryPlan, AnEstimatePastInt64SaturatesIntoAWarningInsteadOfWrapping) {
  test::TempDir dir;
  // 4M samples of 16M tokens per microbatch, attention materialised: the [b, h, s, s] scores
  // alone pass 2^63 bytes.
  auto plan = dry_run(dir,
                      " --set training.seq_len=16777216 --set training.global_batch=16777216"
                      " --set training.device_memory_gb=80 --set model.attention_kernel=\\\"materialised\\\"");
  ASSERT_EQ(plan.status, 0) << plan.output;
  const std::vector<std::string> stages = activation_lines(plan.output);
  ASSERT_EQ(stages.size(), 2u) << plan.output;
  for (const std::string& line : stages) EXPECT_EQ(number_after(line, ": "), INT64_MAX) << line;
  EXPECT_NE(plan.output.find("WARNING: 4 rank(s) will not fit in 80.0 GiB per device"), std::string::npos)
      << plan.output;
}

TEST(MemoryPlan, AModelWithoutAnEstimatePlansItsStateAlone) {
  test::TempDir dir;
  // The ABI 1.6 test model offers no activation estimate.
  test::write_file(dir / "job.toml",
                   "[model]\nplugin = \"versioned_1_6\"\ncomponent = \"model\"\n[clipper]\nplugin = "
                   "\"versioned_1_6\"\ncomponent = \"clipper\"\n[training]\nseq_len = 8\nglobal_batch = 2\n");
  auto plan = test::run_command(test::bin_dir() + "/keel-train --dry-run --plugin-path " + test::test_plugin_dir() +
                                " --plugin-path " + test::plugin_dir() + " --config " + (dir / "job.toml") +
                                " --set training.device_memory_gb=80");
  ASSERT_EQ(plan.status, 0) << plan.output;
  EXPECT_NE(plan.output.find("activation estimate: none, model offers no KEEL_EXTENSION_MODEL_MEMORY (SDK 1.6)"),
            std::string::npos)
      << plan.output;
  EXPECT_NE(plan.output.find("every rank fits in 80.0 GiB per device (training.device_memory_gb), before "
                             "activations: the largest takes "),
            std::string::npos)
      << plan.output;
}

TEST(MemoryPlan, ARankThatWillNotFitIsWarnedOf) {
  test::TempDir dir;
  auto tight = dry_run(dir, " --set training.device_memory_gb=0.001");
  ASSERT_EQ(tight.status, 0) << tight.output;
  EXPECT_NE(tight.output.find("WARNING: 4 rank(s) will not fit in 1.0 MiB per device (training.device_memory_gb), "
                              "with the activation estimate: rank(s) 0-3; the largest needs "),
            std::string::npos)
      << tight.output;
  auto roomy = dry_run(dir, " --set training.device_memory_gb=80");
  ASSERT_EQ(roomy.status, 0) << roomy.output;
  EXPECT_NE(roomy.output.find("every rank fits in 80.0 GiB per device (training.device_memory_gb), with the "
                              "activation estimate: the largest takes "),
            std::string::npos)
      << roomy.output;
  EXPECT_EQ(roomy.output.find("WARNING"), std::string::npos) << roomy.output;
}

TEST(MemoryPlan, Bf16CountsOneCastOfEachRanksWeights) {
  // Under bf16 the products read one cast of each weight a step (shared by the microbatches):
  // at most half the largest rank's fp32 parameter bytes, named and counted in the verdict.
  test::TempDir dir;
  auto fp32 = dry_run(dir, " --set training.device_memory_gb=80");
  ASSERT_EQ(fp32.status, 0) << fp32.output;
  EXPECT_EQ(fp32.output.find("weights cast to"), std::string::npos) << fp32.output;
  auto bf16 = dry_run(dir, " --set training.device_memory_gb=80 --set training.dtype=\\\"bf16\\\"");
  ASSERT_EQ(bf16.status, 0) << bf16.output;
  int64_t parameters = 0;
  for (const std::string& line : lines_after(bf16.output, ": parameters "))
    parameters = std::max<int64_t>(parameters, std::stoll(line));
  const std::vector<std::string> cast =
      lines_after(bf16.output, "weights cast to bf16 for the products, once a step: ");
  ASSERT_EQ(cast.size(), 1u) << bf16.output;
  EXPECT_GT(parameters, 0) << bf16.output;
  EXPECT_EQ(number_after(cast[0], "at most "), parameters / 2) << cast[0];
}

}  // namespace
}  // namespace keel
