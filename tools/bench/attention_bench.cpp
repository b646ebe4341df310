// keel-bench-attention: DeepSeek-V3 debug's attention core, forward and backward, on each CPU
// path per sequence length: the measurement behind keel::kCpuFusedAttentionFrom and
// keel::kCpuAttentionRows (sdk/include/keel/attention.hpp, cpu_attention.hpp).
//
// The paths are the plugin's own, op for op (plugins/deepseek_v3_mtp/modules.cpp): materialised
// multiplies the no-rope and rope parts apart into [b, h, s, s] scores, masks them with a
// prebuilt causal mask and keeps the fp32 probabilities; blocked concatenates the parts, copies
// the rope key to every head and calls keel::causal_attention (keel::cpu_causal_attention in
// fp32); LibTorch's fused kernel gets the same operands with the values zero-padded to the
// query's head size. Rates count the causal half of the products attention needs (3 x 2 b h
// s^2/2 (d_qk + d_v), forward and backward), beside the same layer's projections through
// keel::linear, forward and backward. The paths alternate within each round, in an order
// reversed every other round.
//
//   keel-bench-attention [--threads 2] [--rounds 3] [--shapes 8x64,1x256,...]
#include <torch/csrc/autograd/autograd.h>
#include <keel/attention.hpp>
#include <keel/linear.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr int64_t kHeads = 16, kNope = 128, kRope = 64, kValue = 128, kDim = 256, kKvRank = 512;
constexpr int64_t kQk = kNope + kRope;

using Core = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

// q_nope, k_nope, q_rope, k_rope (one head), v: [b, s, heads, d] as the plugin's projections give them.
std::vector<at::Tensor> operands(int64_t b, int64_t s) {
  at::manual_seed(0);
  auto make = [](std::vector<int64_t> shape) { return at::randn(shape).requires_grad_(); };
  return {make({b, s, kHeads, kNope}), make({b, s, kHeads, kNope}), make({b, s, kHeads, kRope}), make({b, s, 1, kRope}),
          make({b, s, kHeads, kValue})};
}

at::Tensor materialised(const std::vector<at::Tensor>& t, const at::Tensor& future, double scale) {
  at::Tensor scores = at::matmul(t[0].transpose(1, 2), t[1].permute({0, 2, 3, 1})) +
                      at::matmul(t[2].transpose(1, 2), t[3].permute({0, 2, 3, 1}));
  at::Tensor probs =
      at::softmax((scores * scale).masked_fill(future, -std::numeric_limits<double>::infinity()), -1, at::kFloat);
  return at::matmul(probs, t[4].transpose(1, 2));
}

// The fused path's operands: the parts concatenated, the rope key copied to every head.
std::vector<at::Tensor> joined(const std::vector<at::Tensor>& t) {
  const int64_t b = t[0].size(0), s = t[0].size(1);
  return {at::cat({t[0].transpose(1, 2), t[2].transpose(1, 2)}, -1),
          at::cat({t[1].transpose(1, 2), t[3].expand({b, s, kHeads, kRope}).transpose(1, 2)}, -1),
          t[4].transpose(1, 2)};
}

at::Tensor blocked(const std::vector<at::Tensor>& t, double scale) {
  const std::vector<at::Tensor> j = joined(t);
  return keel::causal_attention(j[0], j[1], j[2], scale);
}

at::Tensor libtorch_fused(const std::vector<at::Tensor>& t, double scale) {
  const std::vector<at::Tensor> j = joined(t);
  return keel::detail::fused_sdpa(j[0], j[1], j[2], std::nullopt, scale);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The best of `repeats` forward and backward passes.
double timed(const Core& core, const std::vector<at::Tensor>& t, int repeats) {
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    const at::Tensor out = core(t);
    torch::autograd::grad({out}, t, {at::ones_like(out)});
    best = std::min(best, seconds_since(start));
  }
  return best;
}

// The layer's projections (wq, wkv_a, wkv_b, wo) through keel::linear, forward and backward, in GFLOP/s.
double projections_rate(int64_t tokens, int repeats) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {kDim, kHeads * kQk}, {kDim, kKvRank + kRope}, {kKvRank, kHeads * (kNope + kValue)}, {kHeads * kValue, kDim}};
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs;
  double flops = 0;
  for (auto [k, n] : shapes) {
    pairs.emplace_back(at::randn({tokens, k}).requires_grad_(), at::randn({n, k}).requires_grad_());
    flops += 3.0 * 2 * static_cast<double>(tokens * k * n);
  }
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (auto& [x, w] : pairs) {
      const at::Tensor y = keel::linear(x, w);
      torch::autograd::grad({y}, {x, w}, {at::ones_like(y)});
    }
    best = std::min(best, seconds_since(start));
  }
  return flops / best / 1e9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? std::nan("") : v[v.size() / 2];
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "keel-bench-attention: %s\nusage: keel-bench-attention [--threads N] [--rounds N] [--shapes BxS,...]\n",
               why.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, rounds = 3;
  std::string shapes = "8x64,1x64,1x128,1x256,1x384,1x512,1x640,1x768,1x1024,1x2048,1x4096";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) usage("missing value after " + arg);
    const std::string value = argv[++i];
    try {
      if (arg == "--threads")
        threads = std::stoi(value);
      else if (arg == "--rounds")
        rounds = std::stoi(value);
      else if (arg == "--shapes")
        shapes = value;
      else
        usage("unknown option " + arg);
    } catch (const std::logic_error&) {
      usage("expected a number after " + arg + ", got \"" + value + "\"");
    }
  }
  if (threads < 1 || rounds < 1) usage("--threads and --rounds must be at least 1");
  at::set_num_threads(threads);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kQk));
  std::printf("threads %d, oneDNN products %s\n", threads, keel::onednn_linear_enabled() ? "on" : "off");
  std::printf(
      "batch x seq | materialised | LibTorch fused | Keel blocked | blocked / materialised | blocked / fused | "
      "blocked GFLOP/s | projections GFLOP/s\n");
  std::stringstream list(shapes);
  for (std::string shape; std::getline(list, shape, ',');) {
    const size_t x = shape.find('x');
    if (x == std::string::npos) usage("a shape is BATCHxSEQ, got \"" + shape + "\"");
    int64_t b = 0, s = 0;
    try {
      b = std::stoll(shape.substr(0, x));
      s = std::stoll(shape.substr(x + 1));
    } catch (const std::logic_error&) {
      usage("a shape is BATCHxSEQ, got \"" + shape + "\"");
    }
    if (b < 1 || s < 1) usage("a shape's batch and length must be at least 1, got \"" + shape + "\"");
    const std::vector<at::Tensor> t = operands(b, s);
    const at::Tensor future = at::ones({s, s}, at::TensorOptions().dtype(at::kBool)).triu(1);
    const int repeats = s >= 2048 ? 3 : 5;
    // Materialised from 4096 on would hold 16 GiB of probabilities and their gradients.
    const bool with_materialised = s <= 2048;
    std::vector<std::pair<std::string, Core>> paths = {
        {"blocked", [scale](const std::vector<at::Tensor>& v) { return blocked(v, scale); }},
        {"fused", [scale](const std::vector<at::Tensor>& v) { return libtorch_fused(v, scale); }}};
    if (with_materialised)
      paths.emplace_back("materialised",
                         [&future, scale](const std::vector<at::Tensor>& v) { return materialised(v, future, scale); });
    std::vector<double> times_blocked, times_fused, times_materialised;
    for (int r = 0; r < rounds; ++r) {
      for (const auto& [name, core] : paths) {
        const double time = timed(core, t, repeats);
        (name == "blocked" ? times_blocked : name == "fused" ? times_fused : times_materialised).push_back(time);
      }
      std::reverse(paths.begin(), paths.end());
    }
    const double tb = median(times_blocked), tf = median(times_fused), tm = median(times_materialised);
    const double flops = 3.0 * 2 * static_cast<double>(b * kHeads * s) * static_cast<double>(s) / 2 * (kQk + kValue);
    std::printf("%lld x %lld | %.1f ms | %.1f ms | %.1f ms | %.2f | %.2f | %.0f | %.0f\n", static_cast<long long>(b),
                static_cast<long long>(s), tm * 1e3, tf * 1e3, tb * 1e3, tb / tm, tb / tf, flops / tb / 1e9,
                projections_rate(b * s, repeats));
    std::fflush(stdout);
  }
}
