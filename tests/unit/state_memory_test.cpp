// The memory plan's lines: ranks with equal figures share a line, figures travel between ranks
// as text and malformed text is refused, and the plan of a part counts what a trainer allocates.
#include <gtest/gtest.h>

#include "memory/state_memory.hpp"

namespace keel {
namespace {

TEST(StateMemory, RanksWithEqualFiguresShareALineInOrderOfTheirFirstRank) {
  const StateBytes a{100, 100, 204, 8}, b{60, 60, 124, 0};
  const std::vector<std::string> lines = state_lines_by_rank({a, b, a, b, b});
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0],
            "ranks 0,2: parameters 100 B (100 B), gradients 100 B (100 B), optimizer 204 B (204 B), "
            "buffers 8 B (8 B), total 412 B (412 B)");
  EXPECT_EQ(lines[1].rfind("ranks 1,3,4: parameters 60 B", 0), 0u) << lines[1];
  EXPECT_EQ(state_lines_by_rank({a})[0].rfind("rank 0: ", 0), 0u);
  // Runs of three or more ranks read as ranges.
  const std::vector<std::string> runs = state_lines_by_rank({a, a, a, b, a, a, b, a, a, a, a});
  EXPECT_EQ(runs[0].rfind("ranks 0-2,4,5,7-10: ", 0), 0u) << runs[0];
  EXPECT_EQ(runs[1].rfind("ranks 3,6: ", 0), 0u) << runs[1];
}

TEST(StateMemory, FiguresRoundTripAsTextAndMalformedTextIsRefused) {
  const StateBytes s{int64_t{1} << 40, 3, 5, 7};
  EXPECT_EQ(decode_state_bytes(encode_state_bytes(s)), s);
  EXPECT_THROW(decode_state_bytes("1 2 3"), std::runtime_error);
  EXPECT_THROW(decode_state_bytes("one 2 3 4"), std::runtime_error);
  EXPECT_THROW(decode_state_bytes("1 2 3 4 5"), std::runtime_error);
}

TEST(StateMemory, APlanCountsParametersGradientsTwoMomentsAndAStepCountEach) {
  // AdamW's state per parameter: two moments of its bytes and a 4-byte step count.
  const at::Tensor p = at::empty({3, 5}, at::TensorOptions().dtype(at::kFloat).device(at::kMeta));
  EXPECT_EQ(AdamW::state_bytes({p}, {{0, true, 0, 0}}), 2 * 60 + 4);
  const at::Tensor h = at::empty({7}, at::TensorOptions().dtype(at::kBFloat16).device(at::kMeta));
  EXPECT_EQ(AdamW::state_bytes({h}, {{0, true, 0, 0}}), 2 * 14 + 4);
  // Sharded: moments of the rows this rank steps only, a step count for every parameter.
  EXPECT_EQ(AdamW::state_bytes({p, h}, {{0, false, 1, 2}}), 2 * 40 + 2 * 4);
  EXPECT_EQ(AdamW::state_bytes({p, h}, {}), 2 * 4);
}

}  // namespace
}  // namespace keel
