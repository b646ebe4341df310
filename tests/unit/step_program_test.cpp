// The step program's capture policy: when the host captures pre_clip -> clip -> guard -> AdamW
// as a CUDA graph, when it runs it eagerly, and what it refuses, naming the plugin and hook.
#include <gtest/gtest.h>

#include <limits>

#include "common/error.hpp"
#include "optim/step_program.hpp"
#include "test_support.hpp"
#include "train/job.hpp"

namespace keel {
namespace {

const std::vector<StepHook> kSafe = {{"model m (p)", "pre_clip", true}, {"clipper c (q)", "clip", true}};
const std::vector<StepHook> kUnsafeClip = {{"model m (p)", "pre_clip", true}, {"clipper c (q)", "clip", false}};

TEST(CapturePolicy, AutoRunsEagerlyOnCpu) {
  CaptureDecision d = decide_capture("auto", /*cuda=*/false, kSafe);
  EXPECT_FALSE(d.capture);
  EXPECT_NE(d.reason.find("CPU runs the step program eagerly"), std::string::npos);
}

TEST(CapturePolicy, OnIsRefusedOnCpu) { EXPECT_THROW(decide_capture("on", false, kSafe), InputError); }

TEST(CapturePolicy, OffNeverCaptures) { EXPECT_FALSE(decide_capture("off", true, kSafe).capture); }

TEST(CapturePolicy, CapturesOnCudaWhenEveryHookIsCaptureSafe) {
  EXPECT_TRUE(decide_capture("auto", true, kSafe).capture);
  EXPECT_TRUE(decide_capture("on", true, kSafe).capture);
}

TEST(CapturePolicy, AHookWithoutTheTagMakesAutoEagerAndOnRefuseNamingIt) {
  CaptureDecision d = decide_capture("auto", true, kUnsafeClip);
  EXPECT_FALSE(d.capture);
  EXPECT_NE(d.reason.find("clipper c (q) does not declare clip() capture-safe (KEEL_HOOK_CLIP_CAPTURE_SAFE)"),
            std::string::npos)
      << d.reason;
  try {
    decide_capture("on", true, kUnsafeClip);
    FAIL() << "capture of a hook not declared capture-safe was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.graph_capture = \"on\" is refused: clipper c (q) does not declare"),
              std::string::npos)
        << e.what();
  }
}

// The hooks of real components, as their plugins declare them.
std::vector<StepHook> hooks_of(const std::string& model, const std::string& clipper) {
  test::TempDir dir;
  test::write_file(dir / "job.toml", "[model]\nplugin = \"" + model + "\"\nflavor = \"tiny\"\n[clipper]\n" + clipper);
  RunOptions options;
  options.config_path = dir / "job.toml";
  options.plugin_dirs = {test::plugin_dir(), test::test_plugin_dir()};
  Job job(options, /*meta=*/true);
  return step_hooks(job.model(), job.clipper());
}

TEST(CapturePolicy, PluginsDeclareTheirHooks) {
  std::vector<StepHook> deepseek = hooks_of("deepseek_v3_mtp", "");
  ASSERT_EQ(deepseek.size(), 2u);
  EXPECT_EQ(deepseek[0].hook, "pre_clip");
  EXPECT_TRUE(deepseek[0].capture_safe && deepseek[1].capture_safe);
  std::vector<StepHook> llama = hooks_of("llama3", "plugin = \"faulty\"\ncomponent = \"host_sync\"\n");
  ASSERT_EQ(llama.size(), 2u);  // llama3's pre_clip (its tied table's replica) is capture-safe
  EXPECT_EQ(llama[0].hook, "pre_clip");
  EXPECT_TRUE(llama[0].capture_safe);
  EXPECT_EQ(llama[1].owner, "clipper host_sync (faulty)");
  EXPECT_FALSE(llama[1].capture_safe);
  EXPECT_FALSE(decide_capture("auto", true, llama).capture);
}

// The guard's own check: an element's finiteness, on mixed dtypes, leaving every bit as it was.
TEST(NonFiniteCheck, FlagsAnInfOrNanAnywhereAndNothingElse) {
  auto finite = [] {
    at::manual_seed(7);
    // Two huge values whose sum of |g| overflows fp32, a denormal, a negative zero, bf16.
    return std::vector<at::Tensor>{at::randn({100}), at::tensor({3e38f, -3e38f, 3e38f, 1e-40f, -0.0f}),
                                   at::randn({3, 7}).to(at::kBFloat16)};
  };
  auto bits = [](const std::vector<at::Tensor>& grads) {
    std::vector<at::Tensor> out;
    for (const at::Tensor& g : grads) out.push_back(g.view(g.element_size() == 4 ? at::kInt : at::kShort).clone());
    return out;
  };
  std::vector<at::Tensor> grads = finite();
  const std::vector<at::Tensor> before = bits(grads);
  EXPECT_EQ(any_nonfinite(grads).item<float>(), 0.0f);
  const std::vector<at::Tensor> after = bits(grads);
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(at::equal(before[i], after[i])) << "tensor " << i;
  EXPECT_EQ(any_nonfinite(grads).dim(), 0);

  const double bad[] = {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                        -std::numeric_limits<double>::infinity()};
  for (double value : bad)
    for (size_t t = 0; t < 3; ++t) {
      std::vector<at::Tensor> g = finite();
      g[t].view({-1})[2].fill_(value);
      EXPECT_EQ(any_nonfinite(g).item<float>(), 1.0f) << value << " in tensor " << t;
    }
}

}  // namespace
}  // namespace keel
