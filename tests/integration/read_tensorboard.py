"""Reads a folder of TensorBoard event files with TensorBoard's own reader and writes its scalars.

Usage: read_tensorboard.py DIR OUT_JSON

OUT_JSON holds {"tags": {tag: [[step, value], ...]}} in the order the reader keeps them, each
value the float32 TensorBoard stored, read back as a double (non-finite ones as the strings
"nan", "inf", "-inf", as metrics.jsonl writes them). The reader is the one the viewer uses: it
merges the folder's files in name order and drops what a session start supersedes.
"""
import json
import math
import sys

from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator


def number(value):
    return value if math.isfinite(value) else ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))


directory, out = sys.argv[1:3]
reader = EventAccumulator(directory, size_guidance={SCALARS: 0})  # 0: keep every event
reader.Reload()
tags = {tag: [[e.step, number(e.value)] for e in reader.Scalars(tag)] for tag in reader.Tags()[SCALARS]}
with open(out, "w") as f:
    json.dump({"tags": tags}, f)
