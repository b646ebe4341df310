"""Parity of Keel's DeepSeek-V3 plugin with independent implementations, fp32.

  test_deepseek_v3.py DUMP_TOOL WORK_DIR CASE [CPU_GEMM]

CPU_GEMM (onednn, the default, or blas) picks the library of the plugin's fp32 products, as
keel-train's training.cpu_gemm does; each case runs under both.

CASE "hf":        Hugging Face transformers' DeepseekV3ForCausalLM (sigmoid scoring, group-limited
                  routing, YaRN, a non-zero routing bias) on the same weights and batch: logits,
                  main loss and every parameter's gradient of the main loss. The model is built
                  from the plugin's own Hugging Face export (its config.json and its names, the
                  experts' w1/w3 fused into gate_up_proj), so this also checks that export.
CASE "reference": the plain-PyTorch reference in deepseek_v3_reference.py, with softmax scoring
                  and two MTP depths: logits, MTP logits, every loss and every gradient of the
                  total loss (main + MTP).
CASE "documents": the same on a batch of several documents (EOS tokens, the host's labels):
                  the reference ignores a prediction whose target lies in another document
                  than its position, per depth; labels, every depth's labelled count, logits,
                  losses and gradients agree.
Tolerance: rtol 1e-5, atol 1e-6. Prints the largest differences; exits non-zero on a miss.
"""
import json
import os
import struct
import subprocess
import sys

import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepseek_v3_reference as reference  # noqa: E402

RTOL, ATOL = 1e-5, 1e-6
torch.set_num_threads(1)
failures = []
worst = {}


def compare(name, ours, theirs):
    ours, theirs = ours.double(), theirs.double()
    if ours.shape != theirs.shape:
        failures.append(f"{name}: shape {tuple(ours.shape)} vs {tuple(theirs.shape)}")
        return
    diff = (ours - theirs).abs()
    excess = (diff - (ATOL + RTOL * theirs.abs())).max().item()
    kind = name.split(" ")[0]
    worst[kind] = max(worst.get(kind, 0.0), diff.max().item())
    if excess > 0:
        failures.append(f"{name}: max |diff| {diff.max().item():.3e} exceeds atol {ATOL} + rtol {RTOL} * |ref|")


CPU_GEMM = sys.argv[4] if len(sys.argv) > 4 else "onednn"


def dump(tool, work, name, settings):
    out = os.path.join(work, name + ".safetensors")
    subprocess.run([tool, out, "cpu_gemm=" + CPU_GEMM] + settings, check=True, stdout=subprocess.DEVNULL)
    tensors = load_file(out)
    with open(out, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        meta = json.loads(f.read(size))["__metadata__"]
    hf_config = meta.pop("hf_config", None)
    args = {}
    for k, v in meta.items():
        args[k] = v if k == "score_func" else (float(v) if any(c in v for c in ".e") else int(v))
    args["route_norm"] = bool(args["route_norm"])
    return tensors, args, hf_config


def group(tensors, prefix):
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def run_hf(tool, work):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    t, _, hf_config = dump(tool, work, "hf", ["score_func=sigmoid", "num_mtp_layers=1", "export=hf"])
    config = DeepseekV3Config.from_dict(json.loads(hf_config), attn_implementation="eager")
    config._experts_implementation = "eager"
    model = DeepseekV3ForCausalLM(config).float()
    state, grads = group(t, "hf."), group(t, "hf_grad_main.")
    # The MTP module is exported as the release's extra layer, which transformers does not model.
    mtp_layer = f"model.layers.{config.num_hidden_layers}."
    if not any(k.startswith(mtp_layer + "eh_proj") for k in state):
        failures.append(f"hf export: no MTP layer {mtp_layer}*")
    state = {k: v for k, v in state.items() if not k.startswith(mtp_layer)}
    grads = {k: v for k, v in grads.items() if not k.startswith(mtp_layer)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if "rotary_emb" not in m]
    if missing or unexpected:
        failures.append(f"hf state dict: missing {missing}, unexpected {unexpected}")
    model.train()
    logits = model(input_ids=t["tokens"]).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), t["labels"].reshape(-1))
    loss.backward()
    compare("logits", t["logits"], logits.detach())
    compare("loss main", t["main_loss"], loss.detach())
    # Keel's main-loss gradients, exported like the weights (w1/w3 fused as gate_up_proj is).
    hf_params = dict(model.named_parameters())
    for name, p in hf_params.items():
        if name not in grads:
            failures.append(f"grad {name}: not in the export")
            continue
        compare("grad " + name, grads[name], p.grad)
    exported = {k for k in grads if "e_score_correction_bias" not in k}  # a buffer in transformers
    if exported != set(hf_params):
        failures.append(f"exported gradients without a parameter: {sorted(exported - set(hf_params))}")


def run_reference(tool, work, documents=False):
    settings = ["score_func=softmax", "n_expert_groups=2", "n_limited_groups=1", "route_norm=false",
                "route_scale=1.5", "num_mtp_layers=2", "q_lora_rank=0"]
    eos = 7 if documents else None
    name = "documents" if documents else "reference"
    t, a, _ = dump(tool, work, name, settings + ([f"eos={eos}"] if documents else []))
    params = {k: v.clone().requires_grad_(True) for k, v in group(t, "param.").items()}
    buffers = group(t, "buffer.")
    sequence = t["sequence"]
    if not torch.equal(t["tokens"], sequence[:, :-1]):
        failures.append("tokens are not the sequence's inputs")
    logits, mtp_logits, main, mtp_sums = reference.forward(params, buffers, a, sequence, eos)
    labelled = [(reference.targets(sequence, k, eos) != -100).sum().item() for k in range(len(mtp_sums) + 1)]
    n = labelled[0]
    total = (main + a["mtp_loss_scale"] / len(mtp_sums) * sum(mtp_sums)) / n
    total.backward()
    if not torch.equal(t["labels"], reference.targets(sequence, 0, eos)):
        failures.append("labels: the host's masking differs from the reference's")
    if t["main_tokens"].item() != n:
        failures.append(f"labelled count: {t['main_tokens'].item()} vs the reference's {n}")
    compare("logits", t["logits"], logits.detach())
    compare("loss main", t["main_loss"], main.detach() / n)
    compare("loss total", t["loss"], total.detach())
    for k, (lg, s) in enumerate(zip(mtp_logits, mtp_sums)):
        ours, theirs = t[f"mtp_logits.{k}"], lg.detach()
        if documents:
            # When the last input is an EOS its label is ignored, and the token after the batch
            # is not given to the model: where that token is embedded (depth k, positions
            # seq - k on), every target is ignored, so the logits there are not compared.
            kept = reference.targets(sequence, k + 1, eos) != -100
            ours, theirs = ours[kept], theirs[kept]
        compare(f"mtp_logits {k}", ours, theirs)
        compare(f"loss mtp.{k}", t[f"mtp_loss.{k}"], s.detach() / n)
        if t[f"mtp_tokens.{k}"].item() != labelled[k + 1]:
            failures.append(f"mtp.{k} labelled count: {t[f'mtp_tokens.{k}'].item()} vs the reference's {labelled[k + 1]}")
    for fqn, p in params.items():
        compare("grad " + fqn, t["grad_total." + fqn], p.grad)
    if len(mtp_logits) != 2:
        failures.append(f"expected 2 MTP depths, got {len(mtp_logits)}")
    batch, seq = t["tokens"].shape
    past_the_end = [batch * k for k in range(len(labelled))]
    if documents and not all(labelled[k] < batch * seq - past_the_end[k] for k in range(len(labelled))):
        failures.append(f"the batch crosses no document end at some depth: labelled {labelled}")
    print(f"{name}: labelled positions per depth {labelled} of {batch * seq}")


def main():
    tool, work, case = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    {"hf": run_hf, "reference": run_reference,
     "documents": lambda tool, work: run_reference(tool, work, documents=True)}[case](tool, work)
    for kind, value in sorted(worst.items()):
        print(f"{case} ({CPU_GEMM}): largest |diff| of {kind}: {value:.3e}")
    if failures:
        print("\n".join(failures[:20]))
        sys.exit(1)
    print(f"{case} ({CPU_GEMM}): parity within rtol {RTOL} / atol {ATOL}")


if __name__ == "__main__":
    main()
