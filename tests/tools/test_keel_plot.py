"""tools/keel-plot draws a run's metrics.jsonl and refuses what is not one, naming file and line.

  python3 tests/tools/test_keel_plot.py SOURCE_DIR [BIN_DIR PLUGIN_DIR [WORK_DIR]]

Draws a synthetic run (lm_loss and mtp_loss, a nan loss, a skipped update) and, given BIN_DIR and
PLUGIN_DIR, a real 3-step run of the tiny llama3, checks each PNG (size, not blank), then feeds it
bad inputs: each must be refused in one line naming the file (and line), exit status 2, no
traceback, within seconds. Exits 0 when every check holds; prints each failed check and exits 1
otherwise.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import matplotlib.image


def main():
    source, bin_dir, plugin_dir, work = (sys.argv[1:5] + [None] * 3)[:4]
    own_work = work is None  # a folder of its own is removed once every check passed
    work = work or tempfile.mkdtemp(prefix="keel_plot_")
    tool = [sys.executable, os.path.join(source, "tools", "keel-plot")]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    failures = []

    def check(condition, what):
        if not condition:
            failures.append(what)

    def plot(run_dir, *extra):
        try:  # a refusal takes well under a second; a hang on a FIFO must not hang the test
            return subprocess.run(tool + [run_dir, *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(tool, "timed out", "still running after 60 s")

    def check_png(path, what):
        with open(path, "rb") as f:
            check(f.read(8) == b"\x89PNG\r\n\x1a\n", f"{what}: not a PNG")
        image = matplotlib.image.imread(path)
        check(image.shape[:2] == (800, 1200), f"{what}: {image.shape[:2]} pixels, expected 800 x 1200")
        check(float(image[..., :3].std()) > 0.01, f"{what}: the picture is blank")

    synthetic = os.path.join(work, "synthetic")
    os.makedirs(synthetic)
    with open(os.path.join(synthetic, "metrics.jsonl"), "w") as f:
        for step in range(1, 51):
            record = {"step": step, "loss": 6.0 / step ** 0.5, "grad_norm": 3.0 / step, "lr": 1e-3 * min(1, step / 10),
                      "tokens_per_second": 2000.0 + step, "skipped": step == 30, "lm_loss": 5.0 / step ** 0.5,
                      "mtp_loss": 5.5 / step ** 0.5, "load_max_over_mean.layers.1": 1.5}
            if step == 20:
                record["loss"] = "nan"
            if step % 10 == 0:
                record["val_loss"] = 6.2 / step ** 0.5
            f.write(json.dumps(record) + "\n")
    out = os.path.join(work, "synthetic.png")
    r = plot(synthetic, "--out", out)
    check(r.returncode == 0, f"synthetic run: exit {r.returncode}: {r.stdout}")
    check("50 step records" in r.stdout, f"synthetic run: {r.stdout!r}")
    if r.returncode == 0:
        check_png(out, "synthetic run")

    # The largest and smallest figures keel-plot takes still draw, without a warning.
    edge = os.path.join(work, "edge")
    os.makedirs(edge)
    with open(os.path.join(edge, "metrics.jsonl"), "w") as f:
        f.write('{"step": 1, "loss": 1e200, "grad_norm": 5e-324, "lr": -1e200}\n'
                '{"step": 2, "loss": -1e200, "grad_norm": 1e200, "lr": 1e200}\n')
    r = plot(edge)
    check(r.returncode == 0 and "Warning" not in r.stdout, f"figures of ±1e200: exit {r.returncode}: {r.stdout}")

    real = os.path.join(work, "real")
    train = None if bin_dir is None else subprocess.run(
        [os.path.join(bin_dir, "keel-train"), "--config", os.path.join(source, "configs", "llama3_debug.toml"),
         "--plugin-path", plugin_dir, "--set", "model.llama3.flavor=tiny", "--set", "training.steps=3",
         "--set", "training.seq_len=16", "--set", "training.global_batch=2", "--set", "training.threads=1",
         "--set", "lr_scheduler.warmup_steps=1", "--set", "metrics.log_interval=1",
         "--set", "validation.interval=2",
         "--set", "checkpoint.save_final=false", "--set", f'job.run_dir="{real}"'],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if train is None:
        print("keel-plot: no BIN_DIR and PLUGIN_DIR given: the real run is not drawn")
    else:
        check(train.returncode == 0, f"training the tiny llama3: exit {train.returncode}: {train.stdout[-2000:]}")
    if train is not None and train.returncode == 0:
        r = plot(real)
        check(r.returncode == 0, f"real run: exit {r.returncode}: {r.stdout}")
        if r.returncode == 0:
            check_png(os.path.join(real, "metrics.png"), "real run")

    def expect_refusal(run_dir, name, why):
        """keel-plot refuses RUN_DIR: exit 2, one line holding `why`, no traceback, no picture."""
        r = plot(run_dir)
        check(r.returncode == 2 and why in r.stdout, f"{name}: exit {r.returncode}, expected 2 with {why!r}: "
                                                     f"{r.stdout[-2000:]}")
        check(r.stdout.count("\n") == 1, f"{name}: the refusal is not one line: {r.stdout[-2000:]}")
        check("Traceback" not in r.stdout, f"{name}: the refusal is a Python traceback: {r.stdout[-2000:]}")
        check(not os.path.exists(os.path.join(run_dir, "metrics.png")), f"{name}: a picture was written")

    first = '{"step": 1, "loss": 2.0}\n'
    bad = {
        "not_json": ('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n[1, 2]\n', "metrics.jsonl:3: not a step record"),
        "broken": ('{"step": 1, "loss": 2.0}\n{"step": 2, "lo\n', "metrics.jsonl:2: not a JSON object"),
        "no_step": ('{"loss": 2.0}\n', "metrics.jsonl:1: not a step record"),
        "empty": ("", "holds no step record"),
        # Hostile records: JSON the parser cannot hold, numbers no plot axis can span.
        "deep nesting": (first + "[" * 100000 + "]" * 100000 + "\n", "metrics.jsonl:2: not a JSON object: nested too deeply"),
        "deep nesting in a key": (first + '{"step": 2, "loss": ' + "[" * 100000 + "\n",
                                  "metrics.jsonl:2: not a JSON object: nested too deeply"),
        "near the largest double": (first + '{"step": 2, "loss": 1.7e308}\n',
                                    'metrics.jsonl:2: key "loss": expected a finite number'),
        "near the lowest double": (first + '{"step": 2, "grad_norm": -1.7e308}\n',
                                   'metrics.jsonl:2: key "grad_norm": expected a finite number'),
        "beyond a double": (first + '{"step": 2, "lr": 1e309}\n', 'metrics.jsonl:2: key "lr": expected a finite number'),
        "5000-digit integer": (first + '{"step": 2, "tokens_per_second": ' + "9" * 5000 + "}\n",
                               'metrics.jsonl:2: key "tokens_per_second": expected a finite number'),
        "integer beyond a double": (first + '{"step": 2, "loss": %d}\n' % 2 ** 1100,
                                    'metrics.jsonl:2: key "loss": expected a finite number'),
        "step beyond 64 bits": (first + '{"step": %d, "loss": 1.0}\n' % 2 ** 1100, 'metrics.jsonl:2: key "step"'),
        "5000-digit step": (first + '{"step": ' + "1" * 5000 + "}\n", 'metrics.jsonl:2: key "step"'),
    }
    for name, (text, why) in bad.items():
        run_dir = os.path.join(work, name.replace(" ", "_"))
        os.makedirs(run_dir)
        with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
            f.write(text)
        expect_refusal(run_dir, name, why)
    # Not a regular file where metrics.jsonl should be: refused at once, never waited on or read.
    fifo_run = os.path.join(work, "fifo")
    os.makedirs(fifo_run)
    os.mkfifo(os.path.join(fifo_run, "metrics.jsonl"))
    expect_refusal(fifo_run, "FIFO as metrics.jsonl", "metrics.jsonl: a FIFO, not a regular file")
    folder_run = os.path.join(work, "folder")
    os.makedirs(os.path.join(folder_run, "metrics.jsonl"))
    expect_refusal(folder_run, "folder as metrics.jsonl", "metrics.jsonl: a folder, not a regular file")
    binary = os.path.join(work, "binary")
    os.makedirs(binary)
    with open(os.path.join(binary, "metrics.jsonl"), "wb") as f:
        f.write(b'{"step": 1}\n\xff\xfe\n')
    r = plot(binary)
    check(r.returncode == 2 and "not UTF-8" in r.stdout, f"binary: exit {r.returncode}: {r.stdout}")
    r = plot(os.path.join(work, "missing"))
    check(r.returncode == 2 and "no such file" in r.stdout, f"missing run: exit {r.returncode}: {r.stdout}")

    for f in failures:
        print("FAILED:", f)
    print(f"keel-plot: {'all checks passed' if not failures else f'{len(failures)} check(s) failed'}")
    if own_work and not failures:
        shutil.rmtree(work)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
