// What a stage holds between its input and weight passes under the zero-bubble schedules,
// against what its forward keeps: the memory plan counts the latter until the weight pass.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

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
  const int layers = GetParam() == "llama3" ? 2 : 3;
  for (const test::KeptBytes& k :
       test::estimates_against_kept_bytes([this] { return make("flavor = \"tiny\"\n"); },
                                          {{spec(0, 2, 0, layers - 1), spec(1, 2, layers - 1, 1)}}, /*batch=*/2,
                                          /*seq=*/48, 256, 64, /*until_weight_pass=*/true)) {
    std::printf(
        "ACTIVATIONS | %s tiny %s stage %d/2, between input and weight pass | estimate %.0f B, measured %.0f B, "
        "ratio %.3f\n",
        GetParam().c_str(), k.mode.c_str(), k.spec.stage_index, k.estimate, k.measured, k.estimate / k.measured);
    EXPECT_NEAR(k.estimate / k.measured, 1.0, 0.25) << GetParam() << " " << k.mode << " stage " << k.spec.stage_index;
  }
}

INSTANTIATE_TEST_SUITE_P(Plugins, SplitBackwardMemory, ::testing::Values("llama3", "deepseek_v3_mtp"));

}  // namespace
}  // namespace keel
