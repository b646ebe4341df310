// Held-out data for validation: the block split of a token file (no training window ever
// touches a held-out block, the split depends on split_seed alone) and the synthetic source's
// validation stream.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/text.hpp"
#include "data/synthetic_source.hpp"
#include "data/token_file.hpp"
#include "test_support.hpp"

namespace keel {
namespace {

std::string token_file(const test::TempDir& dir, uint32_t n) {
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < n; ++i) tokens.push_back(i % 1000);
  write_token_file(dir / "t.bin", tokens, 1000);
  return dir / "t.bin";
}

TokenFileShare share(double held_out, int64_t block, uint64_t split_seed, bool validation) {
  TokenFileShare s;
  s.held_out = held_out;
  s.block_tokens = block;
  s.split_seed = split_seed;
  s.validation = validation;
  return s;
}

// Every window of `source` lies in blocks of its own side: held out for validation, not for
// training.
void expect_windows_on_their_side(const TokenFileSource& source, int64_t block, int64_t length, bool validation,
                                  const std::string& what) {
  for (uint64_t index = 0; index < 3000; ++index) {
    const uint64_t start = source.sample_start(index, length);
    ASSERT_LE(start + static_cast<uint64_t>(length), source.num_tokens()) << what;
    const uint64_t first = start / static_cast<uint64_t>(block),
                   last = (start + static_cast<uint64_t>(length) - 1) / static_cast<uint64_t>(block);
    for (uint64_t b = first; b <= last; ++b)
      ASSERT_EQ(source.held_out(b), validation)
          << what << ": sample " << index << " at " << start << " reads block " << b;
  }
}

TEST(TokenFileSplit, NoTrainingWindowTouchesAHeldOutBlockAndTheReverse) {
  test::TempDir dir;
  const std::string path = token_file(dir, 20011);  // the last block is short
  struct Case {
    double held_out;
    int64_t block, length;
    uint64_t split_seed;
  };
  for (const Case& c : {Case{0.01, 64, 17, 1}, Case{0.1, 256, 65, 7}, Case{0.3, 100, 33, 3}, Case{0.5, 512, 129, 11}}) {
    const std::string what = cat("held_out ", c.held_out, " block ", c.block, " length ", c.length);
    TokenFileSource training(path, 5, share(c.held_out, c.block, c.split_seed, false));
    TokenFileSource validation(path, 5, share(c.held_out, c.block, c.split_seed, true));
    const uint64_t blocks = (20011 + static_cast<uint64_t>(c.block) - 1) / static_cast<uint64_t>(c.block);
    uint64_t held = 0;
    for (uint64_t b = 0; b < blocks; ++b) {
      ASSERT_EQ(training.held_out(b), validation.held_out(b)) << what;
      held += training.held_out(b) ? 1 : 0;
    }
    EXPECT_EQ(held, static_cast<uint64_t>(std::llround(c.held_out * blocks))) << what;
    expect_windows_on_their_side(training, c.block, c.length, false, what);
    expect_windows_on_their_side(validation, c.block, c.length, true, what);
  }
}

TEST(TokenFileSplit, TheHeldOutBlocksDependOnTheSplitSeedAloneNotOnTheSamplingSeed) {
  test::TempDir dir;
  const std::string path = token_file(dir, 8192);
  TokenFileSource a(path, 1, share(0.25, 64, 9, false)), b(path, 2, share(0.25, 64, 9, true)),
      c(path, 1, share(0.25, 64, 10, false));
  bool differs = false;
  for (uint64_t block = 0; block < 128; ++block) {
    EXPECT_EQ(a.held_out(block), b.held_out(block)) << block;
    differs = differs || a.held_out(block) != c.held_out(block);
  }
  EXPECT_TRUE(differs) << "split_seed 9 and 10 held out the same blocks";
  EXPECT_NE(a.sample_start(0, 16), TokenFileSource(path, 2, share(0.25, 64, 9, false)).sample_start(0, 16));
}

TEST(TokenFileSplit, WithoutASplitTheSamplesAreTheWholeFilesAsBefore) {
  test::TempDir dir;
  const std::string path = token_file(dir, 5000);
  TokenFileSource whole(path, 4), shared(path, 4, TokenFileShare{});
  for (uint64_t index = 0; index < 200; ++index) {
    uint64_t state = 4 * 0x9E3779B97F4A7C15ULL + index;
    const uint64_t expected = splitmix64(state) % (5000 - 33 + 1);  // the file's offsets since version 1
    EXPECT_EQ(whole.sample_start(index, 33), expected);
    EXPECT_EQ(shared.sample_start(index, 33), expected);
  }
  EXPECT_FALSE(whole.held_out(0));
}

TEST(TokenFileSplit, EveryHeldOutBlockIsRead) {
  test::TempDir dir;
  const std::string path = token_file(dir, 4096);
  TokenFileSource validation(path, 3, share(0.125, 128, 2, true));
  std::vector<bool> read(32, false);
  for (uint64_t index = 0; index < 2000; ++index) read[validation.sample_start(index, 8) / 128] = true;
  for (uint64_t b = 0; b < 32; ++b) EXPECT_EQ(read[b], validation.held_out(b)) << "block " << b;
}

std::string error_of(const std::string& path, const TokenFileShare& s, int64_t length) {
  try {
    TokenFileSource source(path, 0, s);
    source.sample_start(0, length);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(TokenFileSplit, ASplitThatLeavesASideWithoutRoomIsRefusedSayingWhatToChange) {
  test::TempDir dir;
  const std::string path = token_file(dir, 300);
  const std::string all = error_of(path, share(0.9, 100, 1, false), 8);
  EXPECT_NE(all.find("leaves no block for training"), std::string::npos) << all;
  EXPECT_NE(all.find(path), std::string::npos) << all;
  const std::string short_runs = error_of(path, share(0.5, 10, 1, true), 64);
  EXPECT_NE(short_runs.find("validation.split_block"), std::string::npos) << short_runs;
  EXPECT_NE(short_runs.find("held-out"), std::string::npos) << short_runs;
  EXPECT_EQ(error_of(path, share(0.5, 100, 1, true), 64), "");
}

TEST(TokenFileSplit, ASplitThatRoundsToNoBlockIsRefusedRatherThanValidatingOnTrainingData) {
  test::TempDir dir;
  const std::string path = token_file(dir, 3000);  // 30 blocks of 100
  for (double tiny : {1e-300, 1e-3, 0.016}) {      // a subnormal split is refused by the config reader
    const std::string error = error_of(path, share(tiny, 100, 1, true), 8);
    EXPECT_NE(error.find("validation.split"), std::string::npos) << tiny << ": " << error;
    EXPECT_NE(error.find("holds out no block"), std::string::npos) << tiny << ": " << error;
  }
  EXPECT_EQ(error_of(path, share(0.017, 100, 1, true), 8), "");  // 0.51 blocks round to one
}

TEST(SyntheticValidation, TheValidationStreamIsTheSourcesOwnFromIndexTwoToTheSixtyThird) {
  SyntheticSource training(512, 4, 9), validation(512, 4, 9, /*validation=*/true), again(512, 4, 9, true);
  std::vector<int64_t> t(64), v(64), w(64), far(64);
  training.sample(3, 64, t.data());
  validation.sample(3, 64, v.data());
  again.sample(3, 64, w.data());
  training.sample((uint64_t{1} << 63) + 3, 64, far.data());
  EXPECT_NE(t, v);
  EXPECT_EQ(v, w);
  EXPECT_EQ(v, far);
  EXPECT_NE(validation.describe().find("validation stream"), std::string::npos) << validation.describe();
}

}  // namespace
}  // namespace keel
