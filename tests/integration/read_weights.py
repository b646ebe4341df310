"""Reads a Keel safetensors file with Python's safetensors and prints the named tensors.

Usage: read_weights.py FILE NAME... ; exits non-zero when a name is missing or not finite.
"""
import sys

from safetensors.torch import load_file

tensors = load_file(sys.argv[1])
for name in sys.argv[2:]:
    if name not in tensors:
        sys.exit(f"{name} missing from {sys.argv[1]}; it has {sorted(tensors)[:10]}")
    t = tensors[name]
    if not t.isfinite().all():
        sys.exit(f"{name} has non-finite values")
    print(f"{name} {list(t.shape)} {t.dtype}")
