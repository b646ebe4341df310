"""keel-train under torchrun: two data-parallel ranks train through the elastic agent's store.

  python3 tests/tools/test_torchrun.py BIN_DIR PLUGIN_DIR WORK_DIR

torchrun's agent serves the job's TCPStore itself and says so (TORCHELASTIC_USE_AGENT_STORE):
every rank must connect to it as a client. A rank 0 that tried to serve it too would log
"failed to bind" before LibTorch forgave it. Checks the job exits 0 after its last step, with
no bind error and no TCPStore error in the log. Exits 77 (skipped) when this Python has no
torch.distributed.run, 0 when every check holds, 1 otherwise.
"""
import importlib.util
import os
import shutil
import subprocess
import sys

JOB = """[model]
plugin = "llama3"
flavor = "tiny"
[training]
steps = 2
seq_len = 16
global_batch = 4
threads = 1
[parallelism]
dp = 2
[metrics]
log_interval = 1
jsonl = false
[checkpoint]
save_final = false
"""


def main():
    bin_dir, plugin_dir, work = sys.argv[1:4]
    if importlib.util.find_spec("torch.distributed.run") is None:
        print("skipped: this Python has no torch.distributed.run (torchrun)")
        return 77
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    with open(os.path.join(work, "job.toml"), "w") as f:
        f.write(JOB)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--no-python",
               os.path.join(bin_dir, "keel-train"), "--plugin-path", plugin_dir, "--config",
               os.path.join(work, "job.toml"), "--set", 'job.run_dir="%s"' % os.path.join(work, "run")]
    try:
        r = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
        output, status = r.stdout, r.returncode
    except subprocess.TimeoutExpired as e:
        partial = e.stdout or b""  # bytes, whatever text= said
        output = partial.decode(errors="replace") if isinstance(partial, bytes) else partial
        status = "timed out after 240 s"
    failures = []
    if status != 0:
        failures.append("torchrun exited %s" % status)
    if "step 2/2" not in output:
        failures.append("no rank reached step 2/2")
    for bad in ("failed to bind", "TCPStore", "Traceback"):
        if bad in output:
            failures.append("the log holds %r" % bad)
    if failures:
        print(output)
        for failure in failures:
            print("FAILED:", failure)
        return 1
    print("ok: 2 ranks under torchrun, no store error in %d lines of log" % len(output.splitlines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
