// What a stage holds between its input and weight passes under the zero-bubble schedules,
// against what its forward keeps: the memory plan counts the latter until the weight pass.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <cstdio>
#include <string>
#include <utility>

#include "kept_bytes.hpp"
#include "model_fixture.hpp"

namespace keel {
namespace {

class SplitBackwardMemory : public test::ModelFixture, public ::testing::WithParamInterface<std::string> {
 protected:
  SplitBackwardMemory() : ModelFixture(GetParam()) {}
};

// The memory plan holds a forward's estimate until the weight pass under zb_h1 and zbv. What
// the stage holds between its passes differs from what the forward kept: the input pass frees
// what only the input's gradient needed and keeps the gradients the weight pass starts from
// (the logits' gradient on the last stage). The estimate must stay within the quarter the plan
// promises of both.
TEST_P(SplitBackwardMemory, TheEstimateIsWithinAQuarterOfWhatAStageHoldsUntilItsWeightPass) {
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const int layers = GetParam() == "llama3" ? 2 : 3;
  const std::pair<const char*, keel_recompute_mode> modes[] = {{"none", KEEL_RECOMPUTE_NONE},
                                                               {"selective", KEEL_RECOMPUTE_SELECTIVE}};
  for (const auto& [mode, abi] : modes)
    for (int stage = 0; stage < 2; ++stage) {
      auto model = make("flavor = \"tiny\"\n");
      if (abi != KEEL_RECOMPUTE_NONE) model->set_recompute(mode, "training.recompute");
      const keel_part_spec s = stage == 0 ? spec(0, 2, 0, layers - 1) : spec(1, 2, layers - 1, 1);
      ModelPart& part = model->build_part(s);
      part.init_weights(1);
      const double between =
          static_cast<double>(test::measured_kept_bytes(part, 2, 48, 256, 64, /*until_weight_pass=*/true));
      const double estimate = static_cast<double>(model->activation_bytes(s, 2, 48, abi).value_or(-1));
      std::printf(
          "ACTIVATIONS | %s tiny %s stage %d/2, between input and weight pass | estimate %.0f B, "
          "measured %.0f B, ratio %.3f\n",
          GetParam().c_str(), mode, stage, estimate, between, estimate / between);
      EXPECT_NEAR(estimate / between, 1.0, 0.25) << GetParam() << " " << mode << " stage " << stage;
    }
  at::set_num_threads(threads);
}

INSTANTIATE_TEST_SUITE_P(Plugins, SplitBackwardMemory, ::testing::Values("llama3", "deepseek_v3_mtp"));

}  // namespace
}  // namespace keel
