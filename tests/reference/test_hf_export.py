"""Hugging Face export of a trained checkpoint, checked against transformers, fp32.

  test_hf_export.py CASE KEEL_BIN_DIR DUMP_TOOL CONFIG WORK_DIR

Trains the tiny flavor of CASE (deepseek_v3 | llama3 | llama3_tied | llama3_scaled) for 2 steps with a
checkpoint at step 2, exports that checkpoint with `keel-ckpt export --hf` and `keel-ckpt export
--keel`, loads the first with transformers' AutoModelForCausalLM.from_pretrained (every tensor
must be used and none missing, but for deepseek_v3's MTP layers, which transformers does not
model), and compares its logits on a fixed batch with Keel's logits of
the same weights (DUMP_TOOL weights=<the --keel file>). Tolerance: rtol 1e-5, atol 1e-6. Exits
non-zero on a miss. llama3_tied trains with model.tie_embeddings = true: the export must say
tie_word_embeddings, hold no lm_head.weight, and transformers must tie its head to the table.
llama3_scaled trains with Llama 3.1's RoPE scaling (an original context of 64 positions, so the
32 compared positions meet every regime of it): the export must say rope_type "llama3" with its
fields, and transformers' scaled RoPE must give Keel's logits.
"""
import glob
import json
import os
import shutil
import subprocess
import sys

import torch
from safetensors.torch import load_file

RTOL, ATOL = 1e-5, 1e-6
torch.set_num_threads(1)


def run(command):
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}")
    return result.stdout


def main():
    case, bin_dir, dump_tool, config, work = sys.argv[1:6]
    tied = case.endswith("_tied")
    work = os.path.join(work, case)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    model_sets = ["tie_embeddings=true"] if tied else []
    scaled = {"rope_factor": 8.0, "rope_low_freq_factor": 1.0, "rope_high_freq_factor": 4.0,
              "rope_original_max_position": 64}
    if case == "llama3_scaled":
        model_sets = ['rope_scaling="llama3"'] + [f"{key}={value}" for key, value in scaled.items()]
    # The shipped configs keep the model's settings in its component table, [model.<component>].
    table = "model." + ("deepseek_v3_mtp" if case == "deepseek_v3" else "llama3") + "."
    sets = [arg for key in model_sets for arg in ("--set", table + key)]
    run([os.path.join(bin_dir, "keel-train"), "--config", config, "--set", table + 'flavor="tiny"',
         "--set", "training.steps=2", "--set", "checkpoint.interval=2", "--set", "training.seq_len=16",
         "--set", "lr_scheduler.warmup_steps=1", "--set", f'job.run_dir="{os.path.join(work, "run")}"', *sets])
    checkpoints = os.path.join(work, "run", "checkpoints")
    hf_dir, keel_file = os.path.join(work, "hf"), os.path.join(work, "keel.safetensors")
    ckpt = os.path.join(bin_dir, "keel-ckpt")
    print(run([ckpt, "export", "--hf", hf_dir, checkpoints]).strip())
    run([ckpt, "export", "--keel", keel_file, checkpoints])
    ours_file = os.path.join(work, "keel_logits.safetensors")
    run([dump_tool, ours_file, "weights=" + keel_file, "seq=32", *model_sets])
    ours = load_file(ours_file)
    failures = []
    if case.startswith("llama3"):
        with open(os.path.join(hf_dir, "config.json")) as f:
            exported = json.load(f)
        if exported["tie_word_embeddings"] != tied:
            failures.append(f"config.json: tie_word_embeddings is not {tied}")
        rope = exported["rope_parameters"]
        if case == "llama3_scaled":
            wanted = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64}
            if any(rope.get(key) != value for key, value in wanted.items()):
                failures.append(f"config.json: rope_parameters {rope}, expected {wanted}")
        elif rope.get("rope_type") != "default":
            failures.append(f"config.json: rope_parameters {rope}, expected rope_type default")
        names = set()
        for path in glob.glob(os.path.join(hf_dir, "*.safetensors")):
            names.update(load_file(path).keys())
        if ("lm_head.weight" in names) == tied:
            failures.append(f"lm_head.weight {'exported' if tied else 'missing'} ({len(names)} tensors)")

    from transformers import AutoModelForCausalLM

    extra = {"experts_implementation": "eager"} if case == "deepseek_v3" else {}
    model, info = AutoModelForCausalLM.from_pretrained(hf_dir, output_loading_info=True, attn_implementation="eager",
                                                       **extra)
    if case == "deepseek_v3":
        # The MTP modules are exported as the release stores them, layers n_layers + k, which
        # DeepseekV3ForCausalLM has no place for: exactly those keys are unused.
        with open(os.path.join(hf_dir, "config.json")) as f:
            hf_config = json.load(f)
        first, depth = hf_config["num_hidden_layers"], hf_config["num_nextn_predict_layers"]
        mtp = {k for k in info.get("unexpected_keys") or []
               if any(k.startswith(f"model.layers.{first + d}.") for d in range(depth))}
        if depth < 1 or not any(k.endswith(".eh_proj.weight") for k in mtp):
            failures.append(f"the export holds no MTP layer (num_nextn_predict_layers {depth})")
        info["unexpected_keys"] = [k for k in info.get("unexpected_keys") or [] if k not in mtp]
    failures += [f"{kind}: {info[kind]}" for kind in ("missing_keys", "unexpected_keys", "mismatched_keys",
                                                      "error_msgs") if info.get(kind)]
    head, table = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    if tied and head.data_ptr() != table.data_ptr():
        failures.append("transformers did not tie lm_head to embed_tokens")
    if model.dtype != torch.float32:
        failures.append(f"loaded as {model.dtype}, expected float32")
    model.eval()
    with torch.no_grad():
        theirs = model(input_ids=ours["tokens"]).logits
    diff = (ours["logits"].double() - theirs.double()).abs()
    excess = (diff - (ATOL + RTOL * theirs.double().abs())).max().item()
    print(f"{case}: {type(model).__name__}, logits {tuple(theirs.shape)}, largest |diff| {diff.max().item():.3e}")
    if excess > 0:
        failures.append(f"logits: max |diff| {diff.max().item():.3e} exceeds atol {ATOL} + rtol {RTOL} * |ref|")
    if failures:
        print("\n".join(failures))
        sys.exit(1)
    print(f"{case}: the Hugging Face export matches Keel within rtol {RTOL} / atol {ATOL}")


if __name__ == "__main__":
    main()
