// CUDA checks; each skips with its reason where no GPU is present.
#include <gtest/gtest.h>

#include <keel/attention.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

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

// [profiling] on CUDA: the window's trace holds the device's kernels beside Keel's phases.
TEST(Gpu, ProfilingTracesCudaKernelsBesideKeelsPhases) {
  SKIP_WITHOUT_GPU();
  test::TempDir dir;
  test::write_file(dir / "job.toml", std::string(kLlama) + "[profiling]\nenable = true\nsteps = [2, 2]\n");
  auto r = test::run_command(test::bin_dir() + "/keel-train --plugin-path " + test::plugin_dir() + " --config " +
                             (dir / "job.toml") + " --set training.device=\\\"cuda\\\" --set training.steps=3" +
                             " --set job.run_dir=\\\"" + (dir / "run") + "\\\"");
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json trace = nlohmann::json::parse(test::read_file(dir / "run/profiles/steps-2-2/rank-0.json"));
  size_t kernels = 0, forward = 0;
  for (const nlohmann::json& event : trace.at("traceEvents")) {
    kernels += event.value("cat", "") == "kernel" ? 1 : 0;
    forward += event.value("name", "") == "keel::forward" ? 1 : 0;
  }
  EXPECT_GT(kernels, 0u) << "no CUDA kernel in the trace";
  EXPECT_GT(forward, 0u);
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

// The DeepSeek-V3 debug layer's attention core (16 heads, query/key heads 192, value heads 128)
// at 4096 positions, forward and backward: LibTorch picks a fused kernel for the unequal head
// sizes, it matches the materialised product, and it keeps nothing of size seq^2. Prints the
// kernel, its time and its peak for tools/gpu-check's table.
TEST(GpuAttention, MlaHeadsTakeAFusedKernelAndKeepNoSquareOfTheSequence) {
  SKIP_WITHOUT_GPU();
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const at::TensorOptions options = at::TensorOptions().device(at::kCUDA).dtype(dtype);
    const at::SDPBackend backend = causal_attention_backend(options, 16, 16, 192, 128);
    EXPECT_NE(backend, at::SDPBackend::math) << dtype;
    at::manual_seed(0);
    const int64_t s = 4096;
    at::Tensor q = at::randn({1, 16, s, 192}, options).requires_grad_();
    at::Tensor k = at::randn({1, 16, s, 192}, options).requires_grad_();
    at::Tensor v = at::randn({1, 16, s, 128}, options).requires_grad_();
    const at::Device device(at::kCUDA, 0);
    causal_attention(q, k, v).sum().backward();  // a first call loads the kernels
    for (at::Tensor* t : {&q, &k, &v}) t->mutable_grad() = at::Tensor();
    synchronize(device);
    reset_peak_memory(device);
    const double before = allocated_memory_bytes(device);
    const auto start = std::chrono::steady_clock::now();
    at::Tensor out = causal_attention(q, k, v);
    out.backward(at::ones_like(out));
    synchronize(device);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    const double peak = peak_memory_bytes(device) - before;
    // One [16, s, s] fp32 tensor is 1 GiB; operands, output and gradients are about 0.1 GiB.
    EXPECT_LT(peak, 256.0 * (1 << 20)) << dtype;
    std::printf("GPU ROW | attention kernel, MLA debug layer, %s, 1 x 4096, fwd+bwd | %s | %.1f ms | peak %.0f MiB |\n",
                dtype == at::kFloat ? "fp32" : "bf16", attention_backend_name(backend), ms, peak / (1 << 20));
    // Against the materialised product on 1024 positions (fp32 only: the reference's own rounding).
    if (dtype != at::kFloat) continue;
    const int64_t n = 1024;
    at::Tensor qs = q.detach().narrow(2, 0, n), ks = k.detach().narrow(2, 0, n), vs = v.detach().narrow(2, 0, n);
    at::Tensor scores = at::matmul(qs, ks.transpose(-1, -2)) / std::sqrt(192.0);
    scores = scores.masked_fill(at::ones({n, n}, options.dtype(at::kBool)).triu(1), -INFINITY);
    at::Tensor reference = at::matmul(at::softmax(scores, -1), vs);
    EXPECT_LT((causal_attention(qs, ks, vs) - reference).abs().max().item<double>(), 1e-4);
  }
}

}  // namespace
}  // namespace keel
