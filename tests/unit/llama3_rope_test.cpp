// Llama 3.1+'s RoPE scaling (rope_scaling = "llama3") and the published 3.1 / 3.2 / 3.3 shapes:
// the frequencies in each of the three regimes, the keys' validation, and the dry-run counts
// against Meta's published parameter counts.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numbers>
#include <string>

#include "common/error.hpp"
#include "dry_run_counts.hpp"
#include "llama3_args.hpp"
#include "llama3_rope.hpp"
#include "model_fixture.hpp"
#include "test_support.hpp"

namespace keel {
namespace {

llama3::Args scaled_args() {
  llama3::Args a;
  a.dim = 64, a.n_heads = 4, a.rope_theta = 50000.0;  // head_dim 16: 8 frequencies
  a.rope_scaling = "llama3", a.rope_factor = 8.0, a.rope_low_freq_factor = 1.0, a.rope_high_freq_factor = 4.0;
  a.rope_original_max_position = 64;  // wavelengths below 16 kept, above 64 slowed, between blended
  return a;
}

// Each frequency against the rule computed in double from the plain one: kept, divided by the
// factor, or blended. fp32 against double: a few ulps of the fp32 value (four operations).
TEST(Llama3Rope, ScaledFrequenciesKeepSlowOrBlendByWavelength) {
  const llama3::Args a = scaled_args();
  llama3::Args plain = a;
  plain.rope_scaling = "none";
  const at::Tensor scaled = llama3::rope_frequencies(a, at::TensorOptions());
  const at::Tensor base = llama3::rope_frequencies(plain, at::TensorOptions());
  ASSERT_EQ(scaled.numel(), 8);
  std::map<std::string, int> regimes;
  for (int64_t i = 0; i < 8; ++i) {
    const double f = base[i].item<double>(), wavelength = 2 * std::numbers::pi / f;
    double expected = f;
    if (wavelength > 64.0) {
      expected = f / 8.0, ++regimes["slowed"];
    } else if (wavelength >= 16.0) {
      const double smooth = (64.0 / wavelength - 1.0) / (4.0 - 1.0);
      expected = (1 - smooth) * f / 8.0 + smooth * f, ++regimes["blended"];
    } else {
      ++regimes["kept"];
    }
    EXPECT_NEAR(scaled[i].item<double>(), expected, 8 * std::ldexp(expected, -23)) << "frequency " << i;
  }
  EXPECT_EQ(regimes.size(), 3u) << "the test's shape must meet every regime";
}

TEST(Llama3Rope, WithoutScalingTheFrequenciesArePlainRope) {
  llama3::Args a = scaled_args();
  a.rope_scaling = "none";
  const at::Tensor f = llama3::rope_frequencies(a, at::TensorOptions());
  for (int64_t i = 0; i < 8; ++i)
    EXPECT_NEAR(f[i].item<double>(), std::pow(50000.0, -2.0 * static_cast<double>(i) / 16.0),
                4 * std::ldexp(f[i].item<double>(), -23));
}

class Llama3RopeKeys : public test::ModelFixture {
 protected:
  Llama3RopeKeys() : ModelFixture("llama3") {}
  std::string refusal(const std::string& table) {
    try {
      make("flavor = \"tiny\"\n" + table);
    } catch (const InputError& e) {
      return e.what();
    }
    return "accepted";
  }
};

TEST_F(Llama3RopeKeys, BadScalingSettingsAreRefusedNamingTheKey) {
  EXPECT_NE(
      refusal("rope_scaling = \"yarn\"\n").find("model.rope_scaling: must be \"none\" or \"llama3\", got \"yarn\""),
      std::string::npos);
  EXPECT_NE(refusal("rope_scaling = \"llama3\"\nrope_factor = 0.5\n").find("model.rope_factor: must be finite"),
            std::string::npos);
  EXPECT_NE(refusal("rope_scaling = \"llama3\"\nrope_low_freq_factor = 4.0\n")
                .find("model.rope_high_freq_factor: must be finite and above rope_low_freq_factor"),
            std::string::npos);
  EXPECT_NE(refusal("rope_scaling = \"llama3\"\nrope_original_max_position = 0\n").find("rope_original_max_position"),
            std::string::npos);
  EXPECT_EQ(refusal("rope_scaling = \"llama3\"\n"), "accepted");
}

// Meta's published counts (the safetensors totals of the released checkpoints).
TEST(Llama3Flavors, TheDryRunCountsThePublishedParameters) {
  const std::map<std::string, int64_t> published = {
      {"3.1-8b", 8030261248}, {"3.1-70b", 70553706496}, {"3.1-405b", 405853388800},
      {"3.2-1b", 1235814400}, {"3.2-3b", 3212749824},   {"3.3-70b", 70553706496},
  };
  for (const auto& [flavor, count] : published)
    EXPECT_EQ(test::dry_run_counts("llama3", flavor).at("").total, count) << flavor;  // "" sums every group
}

}  // namespace
}  // namespace keel
