"""tools/bench/profile_ops sums operators' self times from Chrome traces of LibTorch's profiler.

  python3 tests/tools/test_profile_ops.py SOURCE_DIR BIN_DIR PLUGIN_DIR WORK_DIR

A synthetic trace with nesting on two threads gives known self times; a real trace of two
steps of the tiny DeepSeek-V3 (keel-bench-step --profile) gives matrix products and a total
that covers them. Exits 0 when every check holds; prints each failed check and exits 1
otherwise.
"""
import json
import os
import shutil
import subprocess
import sys


def rows(output):
    """{operator: [ms per step, ...]} from the tool's Markdown table."""
    table = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and not cells[0].startswith(("operator", "---")):
            table[cells[0].strip("`")] = [float(c) for c in cells[1:]]
    return table


def main():
    source, bin_dir, plugin_dir, work = sys.argv[1:5]
    tool = [sys.executable, os.path.join(source, "tools", "bench", "profile_ops")]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    failures = []

    def check(condition, what):
        if not condition:
            failures.append(what)

    def op(name, ts, dur, tid=1, cat="cpu_op"):
        return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur}

    # Thread 1: linear [0, 100) ms holds mm [10, 70) and add [70, 90); mm holds copy [20, 30).
    # Thread 2: mm [0, 50) at the same times as thread 1's linear. A user annotation and an
    # instant event are not operators. Over two steps, per step: mm (50 + 50) / 2 = 50,
    # linear (100 - 60 - 20) / 2 = 10, add 10, copy 5; all operators (100 + 50) / 2 = 75.
    synthetic = os.path.join(work, "synthetic.json")
    ms = 1000  # the trace's unit is the microsecond
    with open(synthetic, "w") as f:
        json.dump({"traceEvents": [
            op("aten::linear", 0, 100 * ms), op("aten::mm", 10 * ms, 60 * ms), op("aten::copy_", 20 * ms, 10 * ms),
            op("aten::add", 70 * ms, 20 * ms), op("aten::mm", 0, 50 * ms, tid=2),
            op("ProfilerStep#1", 0, 1000 * ms, cat="user_annotation"),
            {"ph": "i", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 1, "ts": 5 * ms}]}, f)
    done = subprocess.run(tool + ["--steps", "2", "one=" + synthetic, "two=" + synthetic],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    check(done.returncode == 0, f"synthetic: exit {done.returncode}: {done.stdout}")
    got = rows(done.stdout)
    expected = {"aten::mm": 50.0, "aten::linear": 10.0, "aten::add": 10.0, "aten::copy_": 5.0,
                "every other operator": 0.0, "all operators": 75.0}
    for name, value in expected.items():
        check(got.get(name) == [value, value], f"synthetic: {name} should be {value} in both columns:\n{done.stdout}")
    check(list(got)[0] == "aten::mm" and list(got)[3] == "aten::copy_",
          f"synthetic: rows not largest first:\n{done.stdout}")
    top = rows(subprocess.run(tool + ["--steps", "2", "--top", "1", "x=" + synthetic], stdout=subprocess.PIPE,
                              text=True).stdout)
    check(top.get("every other operator") == [25.0], f"--top 1: the rest should be 25.0 ms, got {top}")
    bad = subprocess.run(tool + ["--steps", "1", synthetic], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    check(bad.returncode == 2 and "LABEL=TRACE.json" in bad.stdout, f"a trace without a label: {bad.stdout}")

    # A real trace: the tiny model, one warm-up step and two profiled ones.
    trace = os.path.join(work, "keel.json")
    run = subprocess.run([os.path.join(bin_dir, "keel-bench-step"), "--config",
                          os.path.join(source, "configs", "deepseek_v3_debug.toml"), "--plugin-path", plugin_dir,
                          "--set", "model.deepseek_v3_mtp.flavor=tiny", "--set", "training.threads=1",
                          "--set", "training.seq_len=16", "--set", "training.global_batch=2",
                          "--set", f'job.run_dir="{os.path.join(work, "run")}"',
                          "--warmup", "1", "--steps", "2", "--profile", trace],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    check(run.returncode == 0 and os.path.exists(trace), f"keel-bench-step --profile: exit {run.returncode}: "
          f"{run.stdout[-2000:]}")
    if run.returncode == 0:
        real = subprocess.run(tool + ["--steps", "2", "--top", "50", "Keel=" + trace],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        table = rows(real.stdout)
        check(real.returncode == 0, f"real trace: exit {real.returncode}: {real.stdout}")
        # The model's products: oneDNN's under training.cpu_gemm = "onednn" (the default), BLAS's otherwise.
        products = sum(table.get(op, [0])[0] for op in ("mkldnn::_linear_pointwise", "aten::mm"))
        check(products > 0, f"real trace: no matrix products:\n{real.stdout}")
        check("aten::_fused_adamw_" in table, f"real trace: no fused AdamW:\n{real.stdout}")
        total = table.get("all operators", [0])[0]
        parts = sum(v[0] for k, v in table.items() if k != "all operators")
        # Self times add up to the top-level operators' time, up to the table's rounding.
        check(total > 0 and abs(parts - total) <= 0.05 * len(table) + 0.05,
              f"real trace: self times sum to {parts} ms, the operators to {total} ms:\n{real.stdout}")

    for failure in failures:
        print("FAILED:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
