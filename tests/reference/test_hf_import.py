"""Hugging Face import of transformers' LlamaForCausalLM, checked against transformers, fp32.

  test_hf_import.py CASE KEEL_BIN_DIR LLAMA3_DUMP SOURCE_DIR WORK_DIR

CASE is llama3, llama3_tied or llama3_scaled (Llama 3.1's RoPE scaling, rope_type "llama3", with an
original context of 64 positions so that the 32 compared positions meet scaled, blended and kept
frequencies alike). transformers builds a small random model and saves it sharded
(save_pretrained, max_shard_size 40KB); `keel-ckpt import --hf` turns it into a Keel
checkpoint; Keel's logits on a batch (LLAMA3_DUMP on the weights `keel-ckpt export --keel`
consolidates) must equal transformers' (rtol 1e-5, atol 1e-6, as the export test). The
checkpoint then starts a run on one rank and under PP2 DP2 (tools/keel-launch): the first
step's loss must agree. Finally every kind of bad input is refused with exit 2, naming the file
and the tensor, and leaves nothing in OUT; a run's folder (checkpoints, `latest`) is never
written into. Exits non-zero on a miss.
"""
import json
import os
import shutil
import subprocess
import sys
import tomllib

import torch
from safetensors.torch import load_file, save_file

RTOL, ATOL = 1e-5, 1e-6
# One step's loss on one rank and on four (PP2 DP2, or PP2 DP2 EP2): the same sums in another order. Each rank's loss is
# a mean over ~1e3 fp32 terms and a two-way all-reduce: a relative error of a few 1e-7 (fp32's
# eps 6e-8 times the depth of the reductions); 1e-5 leaves room without hiding a wrong weight,
# which moves the loss by 1e-3 or more.
LOSS_RTOL = 1e-5
torch.set_num_threads(1)


def run(command, expect=0):
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != expect:
        sys.exit(f"{' '.join(command)}: exit {result.returncode}, expected {expect}:\n{result.stdout}")
    return result.stdout


def make_model(case, folder):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    rope = {"rope_type": "default", "rope_theta": 50000.0}
    if case == "llama3_scaled":
        rope = {"rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    config = LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, rope_parameters=rope,
                         tie_word_embeddings=case.endswith("_tied"), max_position_embeddings=256)
    model = LlamaForCausalLM(config).float().eval()
    model.save_pretrained(folder, max_shard_size="40KB")
    return model


def model_keys(out):
    """The [model.llama3] table keel-ckpt import wrote, as key=value TOML texts."""
    with open(os.path.join(out, "model.toml"), "rb") as f:
        table = tomllib.load(f)["model"]["llama3"]
    text = lambda v: ("true" if v else "false") if isinstance(v, bool) else json.dumps(v)
    return [f"{key}={text(value)}" for key, value in table.items()]


def first_loss(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            if record.get("step") == 1:
                return record["loss"]
    sys.exit(f"{run_dir}/metrics.jsonl has no step 1")


def check_refusals(ckpt, hf, work, failures):
    """Each damaged copy of `hf` must be refused with exit 2 naming `needle`, leaving OUT empty."""
    shards = sorted(f for f in os.listdir(hf) if f.endswith(".safetensors"))
    index_name = "model.safetensors.index.json"

    def damaged(name, damage, needles):
        folder = os.path.join(work, "bad_" + name)
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(hf, folder)
        damage(folder)
        out = os.path.join(work, "bad_out_" + name)
        shutil.rmtree(out, ignore_errors=True)
        result = subprocess.run([ckpt, "import", "--hf", folder, out], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        message = result.stdout
        if result.returncode != 2:
            failures.append(f"{name}: exit {result.returncode}, expected 2:\n{message}")
        for needle in needles:
            if needle not in message:
                failures.append(f"{name}: the message does not name '{needle}':\n{message}")
        if os.path.exists(out):
            failures.append(f"{name}: {out} was left behind: {os.listdir(out)}")
        print(f"refused {name}: {message.strip().splitlines()[-1]}")

    with open(os.path.join(hf, index_name)) as f:
        index = json.load(f)
    victim = "model.layers.1.mlp.down_proj.weight"
    victim_file = index["weight_map"][victim]

    def remove_shard(folder):
        os.remove(os.path.join(folder, victim_file))

    def reshape(folder):
        path = os.path.join(folder, victim_file)
        tensors = load_file(path)
        tensors[victim] = tensors[victim][:, :-1].contiguous()
        save_file(tensors, path, metadata={"format": "pt"})

    def add_unknown(folder):
        path = os.path.join(folder, victim_file)
        tensors = load_file(path)
        tensors["model.layers.1.mlp.extra_proj.weight"] = torch.zeros(2, 2)
        save_file(tensors, path, metadata={"format": "pt"})

    def truncate(folder):
        path = os.path.join(folder, victim_file)
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(size - 8)

    def misplace(folder):
        path = os.path.join(folder, index_name)
        with open(path) as f:
            data = json.load(f)
        data["weight_map"][victim] = shards[0] if shards[0] != victim_file else shards[1]
        with open(path, "w") as f:
            json.dump(data, f)

    def escape(folder):
        path = os.path.join(folder, index_name)
        with open(path) as f:
            data = json.load(f)
        data["weight_map"][victim] = "../" + victim_file
        with open(path, "w") as f:
            json.dump(data, f)

    def scaled_rope(folder):
        path = os.path.join(folder, "config.json")
        with open(path) as f:
            data = json.load(f)
        data["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 8.0}
        with open(path, "w") as f:
            json.dump(data, f)

    def edit_config(**changes):
        def edit(folder):
            path = os.path.join(folder, "config.json")
            with open(path) as f:
                data = json.load(f)
            data.update(changes)
            with open(path, "w") as f:
                json.dump(data, f)
        return edit

    def nan_weight(folder):
        path = os.path.join(folder, victim_file)
        tensors = load_file(path)
        tensors[victim][0, 0] = float("nan")
        save_file(tensors, path, metadata={"format": "pt"})

    damaged("missing_shard", remove_shard, [victim_file, "missing shard", "places '"])
    damaged("wrong_shape", reshape, [victim, victim_file, "shape"])
    damaged("unknown_tensor", add_unknown, ["model.layers.1.mlp.extra_proj.weight", victim_file])
    damaged("truncated_file", truncate, [victim_file])
    damaged("misplaced_in_index", misplace, [victim, index_name])
    damaged("index_escapes_folder", escape, [victim, "not a .safetensors file name"])
    damaged("rope_scaling", scaled_rope, ["rope_parameters.rope_type", "yarn"])
    damaged("llama3_rope_without_its_fields", edit_config(rope_parameters={"rope_type": "llama3", "rope_theta": 5e4}),
            ["rope_parameters.factor", "missing"])
    damaged("llama3_rope_factor_below_one", edit_config(rope_parameters={
        "rope_type": "llama3", "rope_theta": 5e4, "factor": 0.5, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}), ["rope_factor", "at least 1"])
    damaged("layer_count_beyond_int32", edit_config(num_hidden_layers=2**32 + 2), ["num_hidden_layers", "4294967298"])
    damaged("layer_count_beyond_weights", edit_config(num_hidden_layers=3), ["num_hidden_layers", "model.layers.2"])
    damaged("vocab_beyond_weights", edit_config(vocab_size=2**20), ["config.json", "shapes need"])
    damaged("vocab_beyond_any_import", edit_config(vocab_size=2**40), ["config.json", "vocab_size", str(2**40)])
    damaged("nan_weight", nan_weight, [victim, victim_file, "NaN"])

    # A run's folder is never written into: its checkpoints and `latest` stay as they were.
    run_root = os.path.join(work, "a_run")
    os.makedirs(os.path.join(run_root, "step-500"), exist_ok=True)
    with open(os.path.join(run_root, "latest"), "w") as f:
        f.write("step-500\n")
    result = subprocess.run([ckpt, "import", "--hf", hf, run_root], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    with open(os.path.join(run_root, "latest")) as f:
        latest = f.read()
    if result.returncode != 2 or "not empty" not in result.stdout or latest != "step-500\n" or \
            sorted(os.listdir(run_root)) != ["latest", "step-500"]:
        failures.append(f"import into a run's folder: exit {result.returncode}, latest {latest!r}, "
                        f"holds {sorted(os.listdir(run_root))}:\n{result.stdout}")
    print(f"refused a run's folder: {result.stdout.strip().splitlines()[-1]}")


def main():
    case, bin_dir, dump_tool, source_dir, work = sys.argv[1:6]
    work = os.path.join(work, case)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    hf, out = os.path.join(work, "hf"), os.path.join(work, "out")
    model = make_model(case, hf)
    shards = [f for f in os.listdir(hf) if f.endswith(".safetensors")]
    ckpt = os.path.join(bin_dir, "keel-ckpt")
    print(run([ckpt, "import", "--hf", hf, out]).strip())
    failures = []
    if len(shards) < 3:
        failures.append(f"the model was saved in {len(shards)} shard(s); the test needs a sharded folder")
    keel_file = os.path.join(work, "keel.safetensors")
    run([ckpt, "export", "--keel", keel_file, os.path.join(out, "step-0")])
    ours_file = os.path.join(work, "keel_logits.safetensors")
    keys = model_keys(out)
    run([dump_tool, ours_file, "weights=" + keel_file, "seq=32", *keys])
    ours = load_file(ours_file)
    with torch.no_grad():
        theirs = model(input_ids=ours["tokens"]).logits
    diff = (ours["logits"].double() - theirs.double()).abs()
    print(f"{case}: logits {tuple(theirs.shape)}, largest |diff| Keel vs transformers {diff.max().item():.3e}")
    if (diff - (ATOL + RTOL * theirs.double().abs())).max().item() > 0:
        failures.append(f"logits: max |diff| {diff.max().item():.3e} exceeds atol {ATOL} + rtol {RTOL} * |ref|")

    # A second import into the same OUT never replaces the checkpoint.
    again = subprocess.run([ckpt, "import", "--hf", hf, out], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if again.returncode != 2 or "not empty" not in again.stdout:
        failures.append(f"a second import into {out}: exit {again.returncode}:\n{again.stdout}")

    # The checkpoint starts a run on any layout.
    train = [os.path.join(bin_dir, "keel-train"), "--config", os.path.join(source_dir, "configs", "llama3_debug.toml"),
             "--set", "training.steps=1", "--set", "training.seq_len=16", "--set", "training.global_batch=4",
             "--set", "lr_scheduler.warmup_steps=0", "--set", "metrics.log_interval=1",
             "--set", f"checkpoint.load={os.path.join(out, 'step-0')}", "--set", "checkpoint.load_model_only=true",
             "--set", "checkpoint.save_final=false",
             *[arg for key in keys for arg in ("--set", "model.llama3." + key)]]
    single = os.path.join(work, "run1")
    run(train + ["--set", f'job.run_dir="{single}"'])
    mesh = os.path.join(work, "run4")
    run([os.path.join(source_dir, "tools", "keel-launch"), "--nproc", "4", "--", *train,
         "--set", f'job.run_dir="{mesh}"', "--set", "parallelism.pp=2", "--set", "parallelism.dp=2"])
    one, four = first_loss(single), first_loss(mesh)
    print(f"{case}: first-step loss from the import: 1 rank {one:.9f}, PP2 DP2 {four:.9f}")
    if abs(one - four) > LOSS_RTOL * abs(one):
        failures.append(f"first-step loss 1 rank {one} vs PP2 DP2 {four}: beyond rtol {LOSS_RTOL}")

    if case == "llama3":
        check_refusals(ckpt, hf, work, failures)
    if failures:
        print("\n".join(failures))
        sys.exit(1)
    print(f"{case}: the import matches transformers within rtol {RTOL} / atol {ATOL}")


if __name__ == "__main__":
    main()
