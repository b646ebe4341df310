"""Times whole training steps of the plain-PyTorch reference DeepSeek-V3 (tests/reference) in
eager mode: forward, backward, torch.nn.utils.clip_grad_norm_, torch.optim.AdamW.

  eager_step.py WEIGHTS.safetensors THREADS [WARMUP] [STEPS] [TRACE.json]

WEIGHTS is a deepseek_dump file (its shapes and metadata give the flavor; its tokens the batch).
With TRACE, the timed steps run under torch.profiler (CPU operators) and its Chrome trace is
written there, for tools/bench/profile_ops.
"""
import json
import os
import resource
import struct
import sys
import time

import torch
from safetensors.torch import load_file

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "tests", "reference"))
import deepseek_v3_reference as reference  # noqa: E402


def main():
    path, threads = sys.argv[1], int(sys.argv[2])
    warmup = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 10
    trace = sys.argv[5] if len(sys.argv) > 5 else None
    torch.set_num_threads(threads)
    tensors = load_file(path)
    with open(path, "rb") as f:
        meta = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))["__metadata__"]
    args = {k: v if k == "score_func" else (float(v) if any(c in v for c in ".e") else int(v)) for k, v in meta.items()}
    args["route_norm"] = bool(args["route_norm"])
    params = {k[6:]: v.clone().requires_grad_(True) for k, v in tensors.items() if k.startswith("param.")}
    buffers = {k[7:]: v for k, v in tensors.items() if k.startswith("buffer.")}
    # The reference reads the batch as one sequence t_0 .. t_S; deepseek_dump stores it.
    sequence, labels = tensors["sequence"], tensors["labels"]
    optimizer = torch.optim.AdamW(params.values(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    times = []
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    for step in range(warmup + steps):
        if step == warmup and trace:
            profiler.start()
        start = time.perf_counter()
        optimizer.zero_grad()
        _, _, main_sum, mtp_sums = reference.forward(params, buffers, args, sequence)
        loss = (main_sum + args["mtp_loss_scale"] / max(len(mtp_sums), 1) * sum(mtp_sums)) / labels.numel()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params.values(), 1.0)
        optimizer.step()
        loss.item()
        if step >= warmup:
            times.append((time.perf_counter() - start) * 1000)
    if trace:
        profiler.stop()
        profiler.export_chrome_trace(trace)
    times.sort()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"eager step: median {times[len(times) // 2]:.1f} ms, min {times[0]:.1f} ms, max {times[-1]:.1f} ms "
          f"over {steps} steps; peak memory {peak:.0f} MiB")


if __name__ == "__main__":
    main()
