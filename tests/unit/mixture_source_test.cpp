// A weighted mixture of token sources: each sample's source is drawn from (seed, index) alone,
// with the weights' shares, and the sample is that source's own sample of the same index.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "data/mixture_source.hpp"

namespace keel {
namespace {

// A source whose every token is its id, and whose vocabulary and EOS id are chosen.
class ConstantSource final : public TokenSource {
 public:
  ConstantSource(int64_t id, int64_t vocab = 256, std::optional<int64_t> eos = std::nullopt)
      : id_(id), vocab_(vocab), eos_(eos) {}
  void sample(uint64_t index, int64_t length, int64_t* out) const override {
    for (int64_t i = 0; i < length; ++i) out[i] = i == 0 ? static_cast<int64_t>(index % 1000) : id_;
  }
  int64_t vocab_size() const override { return vocab_; }
  std::string describe() const override { return "constant"; }
  std::optional<int64_t> eos_id() const override { return eos_; }

 private:
  int64_t id_, vocab_;
  std::optional<int64_t> eos_;
};

MixtureSource three_parts(uint64_t seed) {
  std::vector<MixturePart> parts;
  parts.push_back({"a", 5.0, std::make_unique<ConstantSource>(1)});
  parts.push_back({"b", 3.0, std::make_unique<ConstantSource>(2, 512)});
  parts.push_back({"c", 2.0, std::make_unique<ConstantSource>(3)});
  return MixtureSource(std::move(parts), seed);
}

// Over n draws each share is binomial: its standard deviation is sqrt(p (1 - p) / n), 1.6e-3
// for p = 0.5 at n = 10^5. Six deviations fail a wrong weight (off by 1 %) and pass any sound
// hash with odds of a billion to one; the draws are deterministic, so a pass is a pass everywhere.
TEST(MixtureSource, EachSourceHoldsItsWeightsShareOfTheSamples) {
  const MixtureSource mix = three_parts(7);
  const uint64_t n = 100000;
  std::vector<double> count(3, 0);
  for (uint64_t i = 0; i < n; ++i) count[mix.part_of(i)] += 1;
  const double shares[] = {0.5, 0.3, 0.2};
  for (size_t k = 0; k < 3; ++k) {
    const double sigma = std::sqrt(shares[k] * (1 - shares[k]) / static_cast<double>(n));
    EXPECT_NEAR(count[k] / static_cast<double>(n), shares[k], 6 * sigma) << "source " << k;
  }
}

TEST(MixtureSource, ASampleIsItsSourcesOwnSampleOfTheSameIndex) {
  const MixtureSource mix = three_parts(7);
  std::vector<int64_t> out(4);
  for (uint64_t index : {0ULL, 1ULL, 99ULL, 123456789ULL, (1ULL << 62) - 1}) {
    mix.sample(index, 4, out.data());
    EXPECT_EQ(out[0], static_cast<int64_t>(index % 1000));
    EXPECT_EQ(out[1], static_cast<int64_t>(mix.part_of(index)) + 1) << index;
  }
  EXPECT_EQ(mix.vocab_size(), 512);  // the largest part's
  EXPECT_EQ(mix.part_names(), (std::vector<std::string>{"a", "b", "c"}));
}

TEST(MixtureSource, TheDrawsDependOnTheSeedAndIndexOnly) {
  const MixtureSource one = three_parts(7), again = three_parts(7), other = three_parts(8);
  size_t differ = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(one.part_of(i), again.part_of(i));
    differ += one.part_of(i) != other.part_of(i) ? 1 : 0;
  }
  EXPECT_GT(differ, 100u) << "another seed draws another sequence";
}

TEST(MixtureSource, OneSourceTakesEverySample) {
  std::vector<MixturePart> parts;
  parts.push_back({"only", 0.25, std::make_unique<ConstantSource>(4)});
  const MixtureSource mix(std::move(parts), 1);
  for (uint64_t i = 0; i < 1000; ++i) EXPECT_EQ(mix.part_of(i), 0u);
}

TEST(MixtureSource, AWeightThatIsNotFiniteAndPositiveIsRefused) {
  for (double bad : {0.0, -1.0, std::nan(""), static_cast<double>(INFINITY)}) {
    std::vector<MixturePart> parts;
    parts.push_back({"a", bad, std::make_unique<ConstantSource>(1)});
    EXPECT_THROW(MixtureSource(std::move(parts), 1), std::invalid_argument) << bad;
  }
}

}  // namespace
}  // namespace keel
