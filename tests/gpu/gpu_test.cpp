// CUDA checks; each skips with its reason where no GPU is present.
#include <gtest/gtest.h>

#include <cmath>

#include "common/error.hpp"
#include "device/device.hpp"
#include "pipeline/split_backward.hpp"
#include "test_support.hpp"
#include "train/job.hpp"
#include "train/trainer.hpp"

namespace keel {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible to LibTorch"

struct GpuRun {
  std::vector<double> losses;
  std::vector<at::Tensor> params;
  bool captured = false;
};

// Trains `steps` steps of `job` in this process with `overrides`.
GpuRun train(const std::string& job, const std::vector<std::string>& overrides, int steps) {
  test::TempDir dir;
  test::write_file(dir / "job.toml", job);
  RunOptions options;
  options.config_path = dir / "job.toml";
  options.plugin_dirs = {test::plugin_dir(), test::test_plugin_dir()};
  options.overrides = overrides;
  options.overrides.push_back("job.run_dir=\"" + (dir / "run") + "\"");
  Job j(options, false);
  Trainer trainer(j);
  GpuRun run;
  for (int s = 1; s <= steps; ++s) run.losses.push_back(trainer.step(s, true));
  for (const OptimParam& p : trainer.optimizer().params()) run.params.push_back(p.param.detach().cpu());
  run.captured = trainer.step_program_captured();
  return run;
}

const char* kLlama =
    "[model]\nplugin = \"llama3\"\nflavor = \"tiny\"\n[training]\nsteps = 20\nseq_len = 32\n"
    "global_batch = 8\n[metrics]\njsonl = false\n[checkpoint]\nsave_final = false\n";

const char* kDeepSeekDebug =
    "[model]\nplugin = \"deepseek_v3_mtp\"\nflavor = \"debug\"\n[clipper]\nmax_norm = 0.5\n"
    "[training]\nsteps = 20\nseq_len = 64\nglobal_batch = 8\ndevice = \"cuda\"\n"
    "[metrics]\njsonl = false\n[checkpoint]\nsave_final = false\n";

TEST(Gpu, TinyLlamaTrainsOnCudaAndTracksTheCpuRun) {
  SKIP_WITHOUT_GPU();
  GpuRun cpu = train(kLlama, {"training.device=cpu"}, 20), cuda = train(kLlama, {"training.device=cuda"}, 20);
  EXPECT_TRUE(cuda.params[0].defined());
  EXPECT_LT(cuda.losses.back(), cuda.losses.front());
  for (size_t s = 0; s < cpu.losses.size(); ++s)
    EXPECT_NEAR(cuda.losses[s], cpu.losses[s], 2e-3 * cpu.losses[s]) << "step " << s + 1;
}

TEST(Gpu, CapturedStepProgramIsBitwiseTheEagerOneOver20Steps) {
  SKIP_WITHOUT_GPU();
  GpuRun eager = train(kDeepSeekDebug, {"optimizer.graph_capture=off"}, 20);
  GpuRun captured = train(kDeepSeekDebug, {"optimizer.graph_capture=on", "optimizer.graph_warmup=3"}, 20);
  EXPECT_FALSE(eager.captured);
  EXPECT_TRUE(captured.captured);
  EXPECT_EQ(captured.losses, eager.losses);
  ASSERT_EQ(captured.params.size(), eager.params.size());
  for (size_t i = 0; i < eager.params.size(); ++i) EXPECT_TRUE(at::equal(captured.params[i], eager.params[i])) << i;
}

TEST(Gpu, ShardedOptimizerWithAClipperOnGradientShardsCapturesBitwiseTheEagerOne) {
  SKIP_WITHOUT_GPU();
  // One rank: every piece is whole, but norm_clipper is bound to its shards (the sharded clip
  // path and its world all-reduce run inside the graph) and the parameter gather runs too.
  const std::string sharded = "parallelism.shard_optimizer=true";
  GpuRun eager = train(kDeepSeekDebug, {sharded, "optimizer.graph_capture=off"}, 20);
  GpuRun captured = train(kDeepSeekDebug, {sharded, "optimizer.graph_capture=on", "optimizer.graph_warmup=3"}, 20);
  EXPECT_TRUE(captured.captured);
  EXPECT_EQ(captured.losses, eager.losses);
  ASSERT_EQ(captured.params.size(), eager.params.size());
  for (size_t i = 0; i < eager.params.size(); ++i) EXPECT_TRUE(at::equal(captured.params[i], eager.params[i])) << i;
}

TEST(Gpu, GraphValidateComparesReplaysWithTheEagerProgram) {
  SKIP_WITHOUT_GPU();
  // A difference would throw out of step(); five validated replays pass.
  GpuRun run = train(kDeepSeekDebug, {"optimizer.graph_capture=on", "optimizer.graph_validate=5"}, 10);
  EXPECT_TRUE(run.captured);
  EXPECT_LT(run.losses.back(), run.losses.front());
}

TEST(Gpu, AHookNotDeclaredCaptureSafeIsRefusedNamingIt) {
  SKIP_WITHOUT_GPU();
  try {
    train(
        kLlama,
        {"training.device=cuda", "optimizer.graph_capture=on", "clipper.plugin=faulty", "clipper.component=host_sync"},
        1);
    FAIL() << "capture with a clipper that is not capture-safe was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("clipper host_sync (faulty) does not declare clip() capture-safe"),
              std::string::npos)
        << e.what();
  }
  // "auto" falls back to the eager program and trains.
  GpuRun run = train(kLlama, {"training.device=cuda", "clipper.plugin=faulty", "clipper.component=host_sync"}, 3);
  EXPECT_FALSE(run.captured);
}

// The zero-bubble schedules' split backward on CUDA, where the engine runs each device's nodes
// on its own thread: an input pass and a weight pass give the whole pass's gradients bit for bit.
TEST(Gpu, SplitBackwardOnCudaIsBitwiseTheWholePass) {
  SKIP_WITHOUT_GPU();
  auto grads = [](bool split) {
    at::manual_seed(3);
    const at::TensorOptions cuda = at::TensorOptions().device(at::kCUDA);
    at::Tensor w1 = at::randn({64, 32}, cuda).requires_grad_(true);
    at::Tensor norm = (at::rand({64}, cuda) + 0.5).requires_grad_(true);
    at::Tensor w2 = at::randn({32, 64}, cuda).requires_grad_(true);
    at::Tensor x = at::randn({16, 32}, cuda).requires_grad_(true);
    at::Tensor out = at::linear(at::silu(at::rms_norm(at::linear(x, w1), {64}, norm, 1e-6)), w2);
    out = at::linear(at::tanh(at::linear(out, w1)), w2) + out;  // w1 and w2 reached twice
    at::Tensor g = at::randn(out.sizes(), cuda);
    if (split) {
      SplitBackward pass(out, x);
      at::Tensor input_grad = pass.input_pass(g);
      EXPECT_FALSE(w1.grad().defined()) << "the input pass accumulated a weight";
      pass.weight_pass();
      return std::vector<at::Tensor>{input_grad.cpu(), w1.grad().cpu(), norm.grad().cpu(), w2.grad().cpu()};
    }
    out.backward(g);
    return std::vector<at::Tensor>{x.grad().cpu(), w1.grad().cpu(), norm.grad().cpu(), w2.grad().cpu()};
  };
  const std::vector<at::Tensor> whole = grads(false), split = grads(true);
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_TRUE(at::equal(whole[i], split[i])) << "gradient " << i;
}

TEST(Gpu, Bf16TrainsAndTracksFp32) {
  SKIP_WITHOUT_GPU();
  GpuRun fp32 = train(kDeepSeekDebug, {}, 20), bf16 = train(kDeepSeekDebug, {"training.dtype=bf16"}, 20);
  EXPECT_LT(bf16.losses.back(), bf16.losses.front() - 0.5);
  EXPECT_NEAR(bf16.losses.back(), fp32.losses.back(), 0.02 * fp32.losses.back());
  for (const at::Tensor& p : bf16.params) EXPECT_EQ(p.scalar_type(), at::kFloat);
}

}  // namespace
}  // namespace keel
