"""aotriton.hf's transformers glue, on the CPU (no GPU, no extension): masks, padding, windows.

A tiny Mistral (random weights, sliding window 8, GQA) runs with attn_implementation="aotriton"
where aotriton.hf's two kernel entry points (aotriton.flash_attn's flash_attn_func and
flash_attn_varlen_func) are replaced by float64 stand-ins with FlashAttention-2's semantics
(bottom-right causal, windows, packed batches). Its logits, loss and gradients must equal
transformers' own "sdpa" attention (which builds the causal, sliding-window and padding masks
itself; its "eager" attention gives NaN on left-padded rows in float64) on batches without and with left padding: this checks what aotriton.hf sends
(window W -> (W - 1, 0), the padding mask -> packed sequences and back). The kernels themselves are
proven by test_llama.py on the GPU. A tiny gpt-oss (attention sinks, alternating sliding and full
layers) checks that its sinks (``s_aux``) reach the kernels and get their gradient, against its own
"eager" attention.

    PYTHONPATH=bindings/torch/python:test/torch python test/torch/test_hf_plumbing.py
Last line: `torch-hf_plumbing: N passed, M failed`.
"""
import math

import torch

from harness import Runner, attention_ref, max_err, visible

import aotriton.hf as H

R = Runner("hf_plumbing")
CALLS = {"dense": 0, "varlen": 0, "sinks": 0}


def dense(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, sinks=None):
    CALLS["dense"] += 1
    assert dropout_p == 0.0
    d = q.size(-1)
    scale = 1 / math.sqrt(d) if softmax_scale is None else softmax_scale
    vis = visible(q.size(1), k.size(1), window_size[0], window_size[1], 1, causal, device="cpu")
    if sinks is not None:  # the sink as one more column of the scaled scores, dropped after the softmax
        assert sinks.dtype == torch.float32 and sinks.shape == (q.size(2),)
        CALLS["sinks"] += 1
        qh, kh, vh = (t.transpose(1, 2).double() for t in (q, k, v))
        g = qh.size(1) // kh.size(1)
        kh, vh = kh.repeat_interleave(g, 1), vh.repeat_interleave(g, 1)
        s = torch.where(vis, qh @ kh.transpose(-1, -2) * scale, torch.tensor(-math.inf, dtype=torch.float64))
        t = sinks.double().reshape(1, -1, 1, 1).expand(*s.shape[:-1], 1)
        p = torch.softmax(torch.cat([s, t], -1), -1)[..., :-1]
        return (p @ vh).transpose(1, 2).to(q.dtype)
    out = attention_ref(*(t.transpose(1, 2).double() for t in (q, k, v)), scale, vis=vis, softcap=softcap)
    return out.transpose(1, 2).to(q.dtype)


def varlen(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.0, softmax_scale=None, causal=False,
           window_size=(-1, -1), softcap=0.0, sinks=None):
    CALLS["varlen"] += 1
    assert cu_q.dtype == torch.int32 and cu_k.dtype == torch.int32
    cq, ck = cu_q.tolist(), cu_k.tolist()
    assert max_q == max(b - a for a, b in zip(cq, cq[1:])) and max_k == max(b - a for a, b in zip(ck, ck[1:]))
    outs = [dense(q[cq[i]:cq[i + 1]].unsqueeze(0), k[ck[i]:ck[i + 1]].unsqueeze(0), v[ck[i]:ck[i + 1]].unsqueeze(0),
                  dropout_p, softmax_scale, causal, window_size, softcap, sinks).squeeze(0) for i in range(len(cq) - 1)]
    return torch.cat(outs, 0)


class StandIn:
    flash_attn_func = staticmethod(dense)
    flash_attn_varlen_func = staticmethod(varlen)


def paddings():
    """(label, attention mask) of a batch of 2 × 24 tokens: none padded, and the second row
    left-padded by 5."""
    left = torch.cat([torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 19, dtype=torch.long)], 1)
    return (("no padding", torch.ones(2, 24, dtype=torch.long)),
            ("left padding", torch.cat([torch.ones(1, 24, dtype=torch.long), left], 0)))


def run(model, ids, mask):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100), use_cache=False)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), out.loss.detach(), grads


def main():
    from transformers import MistralConfig, MistralForCausalLM

    H.fa = StandIn  # aotriton.hf's kernel entry points -> float64 stand-ins (this process only)
    name = H.register("aotriton")
    R.check("register() returns the name", name == "aotriton")
    cfg = MistralConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
                        max_position_embeddings=64, attn_implementation="eager")
    torch.manual_seed(0)
    model = MistralForCausalLM(cfg).double()
    ids = torch.randint(0, cfg.vocab_size, (2, 24))
    for label, mask in paddings():
        model.set_attn_implementation("sdpa")
        ref = run(model, ids, mask)
        model.set_attn_implementation("aotriton")
        before = dict(CALLS)
        got = run(model, ids, mask)
        keep = mask.bool()
        e_logits = max_err(got[0][keep], ref[0][keep])
        e_grads = max(max_err(got[2][n], ref[2][n]) for n in ref[2])
        R.check(f"mistral sliding window 8, {label}: logits, loss and grads equal sdpa attention (1e-6: the model's norms run in fp32)",
                e_logits <= 1e-6 and abs(got[1].item() - ref[1].item()) <= 1e-6 and e_grads <= 1e-6,
                f"logits {e_logits:.1e} loss {abs(got[1].item() - ref[1].item()):.1e} grads {e_grads:.1e}")
        used = "varlen" if label == "left padding" else "dense"
        R.check(f"{label}: aotriton.hf sent the {used} call once per layer",
                CALLS[used] - before[used] == cfg.num_hidden_layers, str(CALLS))

    # A padding-free packed row (DataCollatorWithFlattening): position ids restart per sequence;
    # each sequence must come out as if it ran alone.
    lengths = [9, 4, 11]
    packed_ids = torch.cat([ids[0, :n] for n in lengths]).unsqueeze(0)
    positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    model.set_attn_implementation("aotriton")
    before = dict(CALLS)
    with torch.no_grad():
        packed = model(input_ids=packed_ids, position_ids=positions, use_cache=False).logits
    model.set_attn_implementation("sdpa")
    errs, start = [], 0
    with torch.no_grad():
        for n in lengths:
            alone = model(input_ids=ids[:1, :n], use_cache=False).logits
            errs.append(max_err(packed[:, start:start + n], alone))
            start += n
    R.check("packed row (position ids restart): each sequence as if alone", max(errs) <= 1e-6, f"errs {errs}")
    R.check("packed row: aotriton.hf sent the packed (varlen) call once per layer",
            CALLS["varlen"] - before["varlen"] == cfg.num_hidden_layers, str(CALLS))
    gpt_oss()
    R.finish()


def gpt_oss():
    """A tiny gpt-oss (sinks in every layer, sliding and full layers): logits, loss and gradients,
    the sinks' included, equal its own eager attention, with and without left padding."""
    try:
        from transformers import GptOssConfig, GptOssForCausalLM
    except ImportError:
        print("skipped: gpt-oss plumbing (this transformers has no GptOss)")
        return
    cfg = GptOssConfig(vocab_size=97, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                       num_experts_per_tok=2, sliding_window=8, max_position_embeddings=64,
                       attn_implementation="eager")
    cfg._experts_implementation = "eager"  # the grouped-mm experts take no float64
    torch.manual_seed(1)
    model = GptOssForCausalLM(cfg).double()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)
    ids = torch.randint(0, cfg.vocab_size, (2, 24))
    for label, mask in paddings():
        model.set_attn_implementation("eager")
        ref = run(model, ids, mask)
        model.set_attn_implementation("aotriton")
        before = CALLS["sinks"]
        got = run(model, ids, mask)
        keep = mask.bool()
        e_logits = max_err(got[0][keep], ref[0][keep])
        e_grads = max(max_err(got[2][n], ref[2][n]) for n in ref[2])
        sink_grads = [n for n in got[2] if n.endswith("sinks")]
        R.check(f"gpt-oss (sinks), {label}: logits, loss and grads equal eager attention",
                e_logits <= 1e-6 and abs(got[1].item() - ref[1].item()) <= 1e-6 and e_grads <= 1e-6
                and len(sink_grads) == cfg.num_hidden_layers and CALLS["sinks"] > before,
                f"logits {e_logits:.1e} loss {abs(got[1].item() - ref[1].item()):.1e} grads {e_grads:.1e} "
                f"sink grads {len(sink_grads)} sink calls {CALLS['sinks'] - before}")


if __name__ == "__main__":
    main()
