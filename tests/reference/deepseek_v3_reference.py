"""A plain-PyTorch reference of Keel's DeepSeek-V3 with multi-token prediction.

Written independently of the plugin: per-expert loops instead of packed batched matmuls,
complex-number rotary embeddings as in DeepSeek's own inference code, explicit masked softmax
attention. Weights are Keel's canonical FQNs. Covers what Hugging Face's model has not: the
softmax score function and the MTP modules.
"""
import math

import torch
import torch.nn.functional as F


def rms_norm(x, weight, eps):
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def yarn_mscale(scale, mscale):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_frequencies(a, seq):
    dim, base = a["qk_rope_head_dim"], a["rope_theta"]
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor = a["rope_factor"]
    attention_factor = 1.0
    if factor > 1:
        def correction(rot):
            return dim * math.log(a["original_seq_len"] / (rot * 2 * math.pi)) / (2 * math.log(base))
        low = max(math.floor(correction(a["beta_fast"])), 0)
        high = min(math.ceil(correction(a["beta_slow"])), dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        freqs = freqs / factor * ramp + freqs * (1 - ramp)
        attention_factor = yarn_mscale(factor, a["mscale"]) / yarn_mscale(factor, a["mscale_all_dim"])
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), freqs)
    return torch.polar(torch.full_like(angles, attention_factor), angles)  # [seq, dim/2] complex


def apply_rope(x, rotation):
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * rotation.view(1, x.shape[1], 1, -1)).flatten(-2).to(x.dtype)


def attention(p, prefix, a, x, rotation):
    b, s, _ = x.shape
    h, nope, rope, vd = a["n_heads"], a["qk_nope_head_dim"], a["qk_rope_head_dim"], a["v_head_dim"]
    if a["q_lora_rank"] == 0:
        q = x @ p[prefix + "wq.weight"].T
    else:
        q = rms_norm(x @ p[prefix + "wq_a.weight"].T, p[prefix + "q_norm.weight"], a["norm_eps"]) @ p[prefix + "wq_b.weight"].T
    q = q.view(b, s, h, nope + rope)
    q_nope, q_rope = q[..., :nope], apply_rope(q[..., nope:], rotation)
    kv = x @ p[prefix + "wkv_a.weight"].T
    latent, k_rope = kv[..., : a["kv_lora_rank"]], kv[..., a["kv_lora_rank"]:]
    k_rope = apply_rope(k_rope.view(b, s, 1, rope), rotation)
    kv = (rms_norm(latent, p[prefix + "kv_norm.weight"], a["norm_eps"]) @ p[prefix + "wkv_b.weight"].T).view(b, s, h, nope + vd)
    k = torch.cat([kv[..., :nope], k_rope.expand(b, s, h, rope)], -1)
    v = kv[..., nope:]
    query = torch.cat([q_nope, q_rope], -1)
    scale = (nope + rope) ** -0.5
    if a["rope_factor"] > 1 and a["mscale_all_dim"]:
        scale *= yarn_mscale(a["rope_factor"], a["mscale_all_dim"]) ** 2
    scores = torch.einsum("bshd,bthd->bhst", query, k) * scale
    mask = torch.full((s, s), float("-inf")).triu(1)
    weights = torch.softmax(scores + mask, dim=-1)
    out = torch.einsum("bhst,bthd->bshd", weights, v).reshape(b, s, h * vd)
    return out @ p[prefix + "wo.weight"].T


def mlp(p, prefix, x):
    return (F.silu(x @ p[prefix + "w1.weight"].T) * (x @ p[prefix + "w3.weight"].T)) @ p[prefix + "w2.weight"].T


def moe(p, buffers, prefix, a, x):
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    e, k = a["n_routed_experts"], a["top_k"]
    logits = x.float() @ p[prefix + "router.gate.weight"].float().T
    scores = logits.softmax(-1) if a["score_func"] == "softmax" else logits.sigmoid()
    choice = scores.detach() + buffers[prefix + "expert_bias"]
    groups = a["n_expert_groups"]
    if groups > 1:
        per = e // groups
        grouped = choice.view(-1, groups, per)
        group_scores = grouped.topk(2, -1).values.sum(-1) if per >= 2 else grouped.amax(-1)
        keep = group_scores.topk(a["n_limited_groups"], -1).indices
        allowed = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
        choice = choice.masked_fill(~allowed.repeat_interleave(per, dim=1), float("-inf"))
    indices = choice.topk(k, -1).indices
    weights = scores.gather(1, indices)
    if a["route_norm"]:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    weights = weights * a["route_scale"]
    out = torch.zeros_like(x)
    w1, w2, w3 = p[prefix + "experts.w1"], p[prefix + "experts.w2"], p[prefix + "experts.w3"]
    for expert in range(e):
        token, slot = torch.where(indices == expert)
        if token.numel() == 0:
            continue
        h = F.silu(x[token] @ w1[expert].T) * (x[token] @ w3[expert].T)
        out = out.index_add(0, token, (h @ w2[expert].T) * weights[token, slot, None])
    if a["n_shared_experts"] > 0:
        out = out + mlp(p, prefix + "shared_experts.", x)
    return out.view(shape)


def block(p, buffers, prefix, a, layer, x, rotation):
    h = x + attention(p, prefix + "attention.", a, rms_norm(x, p[prefix + "attention_norm.weight"], a["norm_eps"]), rotation)
    normed = rms_norm(h, p[prefix + "ffn_norm.weight"], a["norm_eps"])
    ffn = moe(p, buffers, prefix + "moe.", a, normed) if layer >= a["n_dense_layers"] else mlp(p, prefix + "feed_forward.", normed)
    return h + ffn


def targets(sequence, depth, eos=None):
    """The targets of `depth` (0: the next token) on a batch whose tokens are sequence[:, :-1].

    Position i predicts token i+depth+1 of `sequence` ([batch, seq + 1]: t_0 .. t_S). The
    prediction is ignored (-100) past the sequence and, with documents ended by `eos`, when
    token i+depth+1 lies in another document than token i.
    """
    batch, seq = sequence.shape[0], sequence.shape[1] - 1
    out = torch.full((batch, seq), -100, dtype=sequence.dtype)
    out[:, : seq - depth] = sequence[:, depth + 1:]
    if eos is not None:
        # Token j's document: the number of EOS tokens before it.
        ends = (sequence[:, :-1] == eos).long()
        document = torch.cat([torch.zeros(batch, 1, dtype=torch.long), ends.cumsum(1)], 1)
        other = document[:, depth + 1:] != document[:, : seq - depth]
        out[:, : seq - depth] = out[:, : seq - depth].masked_fill(other, -100)
    return out


def forward(p, buffers, a, sequence, eos=None):
    """Returns logits, the MTP logits per depth, the main loss sum and the MTP loss sums, on
    the batch t_0 .. t_S of `sequence` (documents ended by `eos`, if given)."""
    tokens = sequence[:, :-1]
    seq = tokens.shape[1]
    rotation = rope_frequencies(a, seq)
    h = F.embedding(tokens, p["tok_embeddings.weight"])
    for i in range(a["n_layers"]):
        h = block(p, buffers, f"layers.{i}.", a, i, h, rotation)
    logits = rms_norm(h, p["norm.weight"], a["norm_eps"]) @ p["output.weight"].T
    labels = targets(sequence, 0, eos)
    main = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum", ignore_index=-100)
    mtp_logits, mtp_sums = [], []
    previous = h
    for d in range(a["num_mtp_layers"]):
        k = d + 1
        ahead = torch.zeros_like(tokens)
        ahead[:, : seq + 1 - k] = sequence[:, k:]
        prefix = f"mtp.{d}."
        joined = torch.cat([rms_norm(F.embedding(ahead, p["tok_embeddings.weight"]), p[prefix + "enorm.weight"], a["norm_eps"]),
                            rms_norm(previous, p[prefix + "hnorm.weight"], a["norm_eps"])], -1)
        previous = block(p, buffers, prefix + "block.", a, a["n_layers"] + d, joined @ p[prefix + "eh_proj.weight"].T, rotation)
        out = rms_norm(previous, p[prefix + "norm.weight"], a["norm_eps"]) @ p["output.weight"].T
        mtp_logits.append(out)
        depth_targets = targets(sequence, k, eos)
        mtp_sums.append(F.cross_entropy(out.reshape(-1, out.shape[-1]), depth_targets.reshape(-1), reduction="sum", ignore_index=-100))
    return logits, mtp_logits, main, mtp_sums
