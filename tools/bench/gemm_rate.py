"""LibTorch's fp32 matrix-product rate on this machine, at the shapes of DeepSeek-V3 debug's
projections (batch 8 x 64 = 512 tokens): the floor a training step's products cannot go below.

  python3 tools/bench/gemm_rate.py [THREADS]
"""
import sys
import time

import torch

SHAPES = [  # tokens x in -> out
    ("wq", 512, 256, 3072), ("wkv_b", 512, 512, 4096), ("wo", 512, 2048, 256), ("head", 512, 256, 2048),
    ("expert", 192, 256, 256)]


def main():
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
    for name, m, k, n in SHAPES:
        a, b = torch.randn(m, k), torch.randn(k, n)
        for _ in range(5):
            torch.mm(a, b)
        runs = 50
        start = time.perf_counter()
        for _ in range(runs):
            torch.mm(a, b)
        seconds = (time.perf_counter() - start) / runs
        print(f"{name:7s} [{m}, {k}] x [{k}, {n}]: {2 * m * k * n / seconds / 1e9:.0f} GFLOP/s")


if __name__ == "__main__":
    main()
