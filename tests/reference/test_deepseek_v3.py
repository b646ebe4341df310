"""Parity of Keel's DeepSeek-V3 plugin with independent implementations, fp32.

  test_deepseek_v3.py DUMP_TOOL WORK_DIR CASE

CASE "hf":        Hugging Face transformers' DeepseekV3ForCausalLM (sigmoid scoring, group-limited
                  routing, YaRN, a non-zero routing bias) on the same weights and batch: logits,
                  main loss and every parameter's gradient of the main loss.
CASE "reference": the plain-PyTorch reference in deepseek_v3_reference.py, with softmax scoring
                  and two MTP depths: logits, MTP logits, every loss and every gradient of the
                  total loss (main + MTP).
Tolerance: rtol 1e-5, atol 1e-6. Prints the largest differences; exits non-zero on a miss.
"""
import os
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


def dump(tool, work, name, settings):
    out = os.path.join(work, name + ".safetensors")
    subprocess.run([tool, out] + settings, check=True, stdout=subprocess.DEVNULL)
    tensors = load_file(out)
    with open(out, "rb") as f:
        import json
        import struct
        size = struct.unpack("<Q", f.read(8))[0]
        meta = json.loads(f.read(size))["__metadata__"]
    args = {}
    for k, v in meta.items():
        args[k] = v if k == "score_func" else (float(v) if any(c in v for c in ".e") else int(v))
    args["route_norm"] = bool(args["route_norm"])
    return tensors, args


def group(tensors, prefix):
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def hf_names(a):
    """Keel FQN -> Hugging Face DeepseekV3ForCausalLM name (experts' w1/w3 fuse into gate_up_proj)."""
    names = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    attn = {"wq.weight": "q_proj.weight", "wq_a.weight": "q_a_proj.weight", "q_norm.weight": "q_a_layernorm.weight",
            "wq_b.weight": "q_b_proj.weight", "wkv_a.weight": "kv_a_proj_with_mqa.weight",
            "kv_norm.weight": "kv_a_layernorm.weight", "wkv_b.weight": "kv_b_proj.weight", "wo.weight": "o_proj.weight"}
    ffn = {"w1.weight": "gate_proj.weight", "w3.weight": "up_proj.weight", "w2.weight": "down_proj.weight"}
    for i in range(a["n_layers"]):
        k, h = f"layers.{i}.", f"model.layers.{i}."
        names[k + "attention_norm.weight"] = h + "input_layernorm.weight"
        names[k + "ffn_norm.weight"] = h + "post_attention_layernorm.weight"
        for ours, theirs in attn.items():
            names[k + "attention." + ours] = h + "self_attn." + theirs
        for ours, theirs in ffn.items():
            names[k + "feed_forward." + ours] = h + "mlp." + theirs
            names[k + "moe.shared_experts." + ours] = h + "mlp.shared_experts." + theirs
        names[k + "moe.router.gate.weight"] = h + "mlp.gate.weight"
        names[k + "moe.expert_bias"] = h + "mlp.gate.e_score_correction_bias"
        names[k + "moe.experts.w2"] = h + "mlp.experts.down_proj"
    return names


def run_hf(tool, work):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    t, a = dump(tool, work, "hf", ["score_func=sigmoid", "num_mtp_layers=1"])
    params, buffers = group(t, "param."), group(t, "buffer.")
    config = DeepseekV3Config(
        vocab_size=a["vocab_size"], hidden_size=a["dim"], intermediate_size=a["dense_hidden"],
        moe_intermediate_size=a["moe_hidden"], num_hidden_layers=a["n_layers"], num_attention_heads=a["n_heads"],
        num_key_value_heads=a["n_heads"], n_shared_experts=a["n_shared_experts"], n_routed_experts=a["n_routed_experts"],
        routed_scaling_factor=a["route_scale"], kv_lora_rank=a["kv_lora_rank"],
        q_lora_rank=a["q_lora_rank"] or None, qk_rope_head_dim=a["qk_rope_head_dim"], v_head_dim=a["v_head_dim"],
        qk_nope_head_dim=a["qk_nope_head_dim"], n_group=a["n_expert_groups"], topk_group=a["n_limited_groups"],
        num_experts_per_tok=a["top_k"], first_k_dense_replace=a["n_dense_layers"], norm_topk_prob=a["route_norm"],
        rms_norm_eps=a["norm_eps"], max_position_embeddings=4 * a["original_seq_len"], rope_interleave=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": a["rope_theta"], "factor": a["rope_factor"],
                         "original_max_position_embeddings": a["original_seq_len"], "beta_fast": a["beta_fast"],
                         "beta_slow": a["beta_slow"], "mscale": a["mscale"], "mscale_all_dim": a["mscale_all_dim"]},
        tie_word_embeddings=False, attn_implementation="eager")
    config._experts_implementation = "eager"
    model = DeepseekV3ForCausalLM(config).float()
    names = hf_names(a)
    state = {}
    for fqn, tensor in {**params, **buffers}.items():
        if fqn.startswith("mtp."):
            continue
        if fqn.endswith("moe.experts.w1"):
            layer = fqn[: -len("moe.experts.w1")]
            state[f"model.{layer}mlp.experts.gate_up_proj"] = torch.cat([tensor, params[layer + "moe.experts.w3"]], 1)
        elif fqn.endswith("moe.experts.w3"):
            continue
        else:
            state[names[fqn]] = tensor
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
    hf_params = dict(model.named_parameters())
    for fqn in params:
        if fqn.startswith("mtp."):
            continue
        ours = t["grad_main." + fqn]
        if fqn.endswith("moe.experts.w1") or fqn.endswith("moe.experts.w3"):
            layer = fqn[: -len("moe.experts.w1")]
            fused = hf_params[f"model.{layer}mlp.experts.gate_up_proj"].grad
            half = fused.shape[1] // 2
            theirs = fused[:, :half] if fqn.endswith("w1") else fused[:, half:]
        else:
            theirs = hf_params[names[fqn]].grad
        compare("grad " + fqn, ours, theirs)


def run_reference(tool, work):
    t, a = dump(tool, work, "reference", ["score_func=softmax", "n_expert_groups=2", "n_limited_groups=1",
                                          "route_norm=false", "route_scale=1.5", "num_mtp_layers=2", "q_lora_rank=0"])
    params = {k: v.clone().requires_grad_(True) for k, v in group(t, "param.").items()}
    buffers = group(t, "buffer.")
    logits, mtp_logits, main, mtp_sums = reference.forward(params, buffers, a, t["tokens"], t["labels"])
    n = t["labels"].numel()
    total = (main + a["mtp_loss_scale"] / len(mtp_sums) * sum(mtp_sums)) / n
    total.backward()
    compare("logits", t["logits"], logits.detach())
    compare("loss main", t["main_loss"], main.detach() / n)
    compare("loss total", t["loss"], total.detach())
    for k, (lg, s) in enumerate(zip(mtp_logits, mtp_sums)):
        compare(f"mtp_logits {k}", t[f"mtp_logits.{k}"], lg.detach())
        compare(f"loss mtp.{k}", t[f"mtp_loss.{k}"], s.detach() / n)
    for fqn, p in params.items():
        compare("grad " + fqn, t["grad_total." + fqn], p.grad)
    if len(mtp_logits) != 2:
        failures.append(f"expected 2 MTP depths, got {len(mtp_logits)}")


def main():
    tool, work, case = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    {"hf": run_hf, "reference": run_reference}[case](tool, work)
    for kind, value in sorted(worst.items()):
        print(f"{case}: largest |diff| of {kind}: {value:.3e}")
    if failures:
        print("\n".join(failures[:20]))
        sys.exit(1)
    print(f"{case}: parity within rtol {RTOL} / atol {ATOL}")


if __name__ == "__main__":
    main()
