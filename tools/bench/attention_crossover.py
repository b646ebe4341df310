"""DeepSeek-V3 debug's attention core, forward and backward, materialised against fused, per
sequence length: the measurement behind keel::kCpuFusedAttentionFrom (sdk/include/keel/attention.hpp).

Both paths are the plugin's own, op for op (plugins/deepseek_v3_mtp/modules.cpp): the
materialised one multiplies the no-rope and rope parts apart into [b, h, s, s] scores, masks
them with a prebuilt causal mask and keeps the fp32 probabilities; the fused one concatenates
the parts, copies the rope key to every head, zero-pads the values to the query's head size and
calls LibTorch's fused scaled_dot_product_attention. The rates count the causal half of the
products that attention needs (forward and backward: 3 x 2 b h s^2/2 (d_qk + d_v)), beside the
same layer's projections (wq, wkv_a, wkv_b, wo on oneDNN, as keel::linear runs them), forward
and backward. Paths alternate within each round.

  python3 tools/bench/attention_crossover.py [--threads 2] [--rounds 3] [--shapes 8x64,1x256,...]
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

H, NOPE, ROPE, V, DIM, KV_RANK = 16, 128, 64, 128, 256, 512  # the debug flavor's attention
QK = NOPE + ROPE


def inputs(b, s):
    g = torch.Generator().manual_seed(0)
    make = lambda *shape: torch.randn(*shape, generator=g).requires_grad_()  # noqa: E731
    return [make(b, s, H, NOPE), make(b, s, H, NOPE), make(b, s, H, ROPE), make(b, s, 1, ROPE), make(b, s, H, V)]


def materialised(t, future, scale):
    scores = torch.matmul(t[0].transpose(1, 2), t[1].permute(0, 2, 3, 1)) + torch.matmul(
        t[2].transpose(1, 2), t[3].permute(0, 2, 3, 1))
    probs = torch.softmax((scores * scale).masked_fill(future, float("-inf")), -1, dtype=torch.float)
    return torch.matmul(probs, t[4].transpose(1, 2))


def fused(t, scale):
    b, s = t[0].shape[:2]
    query = torch.cat([t[0], t[2]], -1).transpose(1, 2)
    key = torch.cat([t[1], t[3].expand(b, s, H, ROPE)], -1).transpose(1, 2)
    value = F.pad(t[4].transpose(1, 2), (0, QK - V))
    return F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scale)[..., :V]


def timed(run, t, repeats):
    best = float("inf")
    for _ in range(repeats):
        for x in t:
            x.grad = None
        start = time.perf_counter()
        out = run()
        out.backward(torch.ones_like(out))
        best = min(best, time.perf_counter() - start)
    return best


def projections_rate(tokens, repeats):
    """The layer's projections, forward and backward, in GFLOP/s."""
    g = torch.Generator().manual_seed(1)
    shapes = [(DIM, H * QK), (DIM, KV_RANK + ROPE), (KV_RANK, H * (NOPE + V)), (H * V, DIM)]
    linear = lambda x, w: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")  # noqa: E731
    pairs = [(torch.randn(tokens, k, generator=g), torch.randn(n, k, generator=g)) for k, n in shapes]
    flops = sum(3 * 2 * tokens * k * n for k, n in shapes)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for x, w in pairs:
            y = linear(x, w)
            linear(y, w.t().contiguous())  # the input's gradient
            linear(y.t().contiguous(), x.t().contiguous())  # the weight's gradient
        best = min(best, time.perf_counter() - start)
    return flops / best / 1e9


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--shapes", default="8x64,1x64,1x128,8x128,1x256,4x256,1x384,1x512,1x1024,1x2048,1x4096")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    scale = QK ** -0.5
    print(f"threads {a.threads}, CPU capability {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}")
    print("batch x seq | materialised | fused | fused / materialised | fused GFLOP/s | projections GFLOP/s")
    for shape in a.shapes.split(","):
        b, s = (int(v) for v in shape.split("x"))
        t = inputs(b, s)
        future = torch.ones(s, s, dtype=torch.bool).triu(1)
        repeats = 3 if s >= 2048 else 5
        ms, fs = [], []
        for r in range(a.rounds):
            order = [("m", lambda: materialised(t, future, scale)), ("f", lambda: fused(t, scale))]
            if r % 2:
                order.reverse()
            for name, run in order:
                if name == "m" and s > 2048:
                    continue  # 16 GiB of probabilities and their gradients at 4096
                (ms if name == "m" else fs).append(timed(run, t, repeats))
        f = statistics.median(fs)
        m = statistics.median(ms) if ms else float("nan")
        flops = 3 * 2 * b * H * s * s / 2 * (QK + V)
        print(f"{b} x {s} | {m * 1e3:.1f} ms | {f * 1e3:.1f} ms | {f / m:.2f} | {flops / f / 1e9:.0f} | "
              f"{projections_rate(b * s, repeats):.0f}", flush=True)


if __name__ == "__main__":
    main()
