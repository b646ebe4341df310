"""LibTorch's fp32 matrix-product rate on this machine, at the shapes of DeepSeek-V3 debug's
projections (batch 8 x 64 = 512 tokens), through each library LibTorch carries: its BLAS
(`torch.mm`: MKL in the PyPI wheel) and oneDNN (`mkldnn::_linear_pointwise`, what
`keel::linear` calls under `training.cpu_gemm = "onednn"`). Both are fp32 in, fp32 sums.

  python3 tools/bench/gemm_rate.py [THREADS]
"""
import sys
import time

import torch

SHAPES = [  # tokens x in -> out
    ("wq", 512, 256, 3072), ("wkv_b", 512, 512, 4096), ("wo", 512, 2048, 256), ("head", 512, 256, 2048),
    ("expert", 192, 256, 256)]


def rate(product, m, k, n):
    for _ in range(5):
        product()
    runs = 50
    start = time.perf_counter()
    for _ in range(runs):
        product()
    return 2 * m * k * n / ((time.perf_counter() - start) / runs) / 1e9


def main():
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
    onednn = torch.backends.mkldnn.is_available()
    print("shape                                BLAS (torch.mm)   oneDNN")
    for name, m, k, n in SHAPES:
        x, w = torch.randn(m, k), torch.randn(n, k)
        blas = rate(lambda: torch.mm(x, w.t()), m, k, n)
        dnn = (f"{rate(lambda: torch.ops.mkldnn._linear_pointwise(x, w, None, 'none', [], ''), m, k, n):5.0f} GFLOP/s"
               if onednn else "absent")
        print(f"{name:7s} [{m}, {k}] x [{k}, {n}]".ljust(37) + f"{blas:5.0f} GFLOP/s    {dnn}")


if __name__ == "__main__":
    main()
