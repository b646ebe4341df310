// The data-parallel gradient reduction overlapped with the last backward pass against the
// reduction after it: the same job under DP2, DP2 EP2 and PP2 DP2 EP2 (also interleaved, two
// stages per rank), one to four microbatches, one bucket per parameter (so many buckets start
// during backward), must give bitwise the same losses, grad norms and final state (parameters,
// AdamW's moments, buffers).
#include <gtest/gtest.h>

#include <cstring>
#include <regex>

#include "job_runs.hpp"

namespace keel {
namespace {

void expect_overlap_is_bitwise_the_same(const std::string& label, int ranks, std::vector<std::string> sets) {
  test::TempDir dir;
  sets.insert(sets.end(), {"training.steps=4", "parallelism.grad_bucket_mb=0"});
  std::vector<std::string> after = sets;
  after.push_back("parallelism.overlap_grad_reduce=false");
  const test::JobRun overlapped = test::run_job(dir, "overlapped", ranks, test::tiny_deepseek_job(), sets);
  const test::JobRun reduced_after = test::run_job(dir, "after", ranks, test::tiny_deepseek_job(), after);
  ASSERT_EQ(overlapped.result.status, 0) << overlapped.result.output;
  ASSERT_EQ(reduced_after.result.status, 0) << reduced_after.result.output;

  // The overlap really happened: buckets started before the backward pass ended.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(overlapped.result.output, m,
                                std::regex("gradient reduction overlapped: ([0-9]+) of ([0-9]+) bucket")))
      << overlapped.result.output;
  EXPECT_GT(std::stoi(m[1].str()), 0) << m[0].str();
  EXPECT_EQ(reduced_after.result.output.find("gradient reduction overlapped"), std::string::npos);

  ASSERT_EQ(overlapped.loss.size(), 4u);
  ASSERT_EQ(overlapped.loss.size(), reduced_after.loss.size());
  EXPECT_EQ(std::memcmp(overlapped.loss.data(), reduced_after.loss.data(), 4 * sizeof(double)), 0) << label;
  EXPECT_EQ(std::memcmp(overlapped.grad_norm.data(), reduced_after.grad_norm.data(), 4 * sizeof(double)), 0) << label;
  ASSERT_FALSE(overlapped.state.empty());
  ASSERT_EQ(overlapped.state.size(), reduced_after.state.size());
  for (const auto& [key, tensor] : overlapped.state) {
    ASSERT_TRUE(reduced_after.state.count(key)) << key;
    EXPECT_TRUE(at::equal(tensor, reduced_after.state.at(key))) << label << ": " << key;
  }
  std::printf(
      "OVERLAP | %-22s | %s buckets started during backward | losses, grad norms and %zu state tensors bitwise "
      "equal | %.1f s vs %.1f s\n",
      label.c_str(), (m[1].str() + " of " + m[2].str()).c_str(), overlapped.state.size(), overlapped.seconds,
      reduced_after.seconds);
}

TEST(OverlappedReduction, Dp2IsBitwiseTheReductionAfterBackward) {
  expect_overlap_is_bitwise_the_same("DP2, 1 microbatch", 2, {"parallelism.dp=2", "parallelism.microbatches=1"});
  expect_overlap_is_bitwise_the_same("DP2, 4 microbatches", 2, {"parallelism.dp=2", "parallelism.microbatches=4"});
}

TEST(OverlappedReduction, Dp2Ep2IsBitwiseTheReductionAfterBackward) {
  expect_overlap_is_bitwise_the_same("DP2 EP2, 1 microbatch", 2,
                                     {"parallelism.dp=2", "parallelism.ep=2", "parallelism.microbatches=1"});
  expect_overlap_is_bitwise_the_same("DP2 EP2, 4 microbatches", 2,
                                     {"parallelism.dp=2", "parallelism.ep=2", "parallelism.microbatches=4"});
}

TEST(OverlappedReduction, Pp2Dp2Ep2IsBitwiseTheReductionAfterBackward) {
  const std::vector<std::string> layout = {"parallelism.pp=2", "parallelism.dp=2", "parallelism.ep=2"};
  std::vector<std::string> one = layout, four = layout;
  one.push_back("parallelism.microbatches=1");
  four.push_back("parallelism.microbatches=4");
  expect_overlap_is_bitwise_the_same("PP2 DP2 EP2, 1 microbatch", 4, one);
  expect_overlap_is_bitwise_the_same("PP2 DP2 EP2, 4 microbatches", 4, four);
}

TEST(OverlappedReduction, InterleavedPp2Dp2Ep2IsBitwiseTheReductionAfterBackward) {
  // Two stages per rank: each stage's buckets start from its own last backward pass.
  std::vector<std::string> two = {"parallelism.pp=2", "parallelism.dp=2", "parallelism.ep=2",
                                  "parallelism.schedule=interleaved_1f1b", "parallelism.stages_per_rank=2"};
  std::vector<std::string> four = two;
  two.push_back("parallelism.microbatches=2");
  four.push_back("parallelism.microbatches=4");
  expect_overlap_is_bitwise_the_same("PP2 DP2 EP2 v2, 2 microbatches", 4, two);
  expect_overlap_is_bitwise_the_same("PP2 DP2 EP2 v2, 4 microbatches", 4, four);
}

}  // namespace
}  // namespace keel
