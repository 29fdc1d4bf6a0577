#!/usr/bin/env python3
"""A transformers Llama or Mistral (random weights, no download) trained with aotriton attention vs
torch SDPA.

Model (--arch llama): LlamaConfig(vocab 32000, hidden 2048, 4 layers, 16 heads of dim 128, 4 KV
heads (GQA), intermediate 5632), bf16, batch 2 x 512 tokens; --arch mistral: the same sizes as a
MistralConfig with sliding_window 128 (so the window cuts every row past 128). Attention goes
through aotriton via transformers' AttentionInterface (aotriton.hf.register; falls back to
patching torch.nn.functional.scaled_dot_product_attention where the interface does not exist);
aotriton's use is counted at the extension's forward op (one call per layer).

1b. (llama) The registered path, no model change: attn_implementation="sdpa" after
   torch.nn.attention.activate_flash_attention_impl("aotriton"), with torch's flash backend:
   one aotriton forward per layer, and the same bounds as 1.

1. One forward + backward from the same weights with each backend. Tolerance: relative L2 error
   ||a - b|| / ||b|| <= 2e-2 per tensor (logits, loss, every parameter gradient). A tensor over it
   still passes if aotriton is as close to an fp32 run of the same model (weights upcast, torch
   SDPA in fp32) as torch's bf16 SDPA is: rel(aot, fp32) <= 1.5 * rel(sdpa, fp32) + 1e-3, i.e. the
   difference is bf16 noise. The worst tensor is reported.
2. 20 AdamW steps (lr 1e-4, no dropout, 4 fixed random token batches cycled) from identical initial
   weights with each backend: |loss_aot - loss_sdpa| <= 2e-2 * loss_sdpa at every step; both curves
   are printed.

    PYTHONPATH=bindings/torch/python python test/torch/test_llama.py [--arch llama|mistral] [--steps 20]
Last line: `torch-<arch>: N passed, M failed` (test_mistral.py runs --arch mistral).
"""
import argparse

import torch

from harness import Runner, rel_l2

import aotriton.hf as H
import aotriton.torch as A

DEV = "cuda"
R = None  # the Runner, named after --arch
CALLS = [0]


def count_calls():
    """Counts aotriton's forward kernel calls at the extension op (to prove a run really used it,
    whichever Python entry point led there)."""
    ops = A._ops()

    class Counting:
        def fwd(self, *args):
            CALLS[0] += 1
            return ops.fwd(*args)

        def __getattr__(self, name):
            return getattr(ops, name)

    counting = Counting()
    A._ops = lambda: counting


class Backend:
    """Switches a model between torch SDPA and aotriton attention."""

    def __init__(self):
        self.name = H.register("aotriton")
        self.mode = "AttentionInterface" if self.name else "patched torch SDPA"
        self._patch = None

    def set(self, model, which):
        if self._patch is not None:
            self._patch.__exit__(None, None, None)
            self._patch = None
        if which == "aotriton" and self.name is None:
            self._patch = H.patch_sdpa()
            self._patch.__enter__()
            which = "sdpa"
        elif which == "aotriton":
            which = self.name
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(which)
        else:
            model.config._attn_implementation = which


def fwd_bwd(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids, use_cache=False)
    out.loss.backward()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach().float(), out.loss.detach().float(), grads


def main(argv=None):
    global R
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", choices=("llama", "mistral"), default="llama")
    ap.add_argument("--sliding-window", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=2)
    args = ap.parse_args(argv)
    R = Runner(args.arch)
    if not torch.cuda.is_available():
        R.check("CUDA device present", False)
        R.finish()
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    backend = Backend()
    count_calls()
    print("torch", torch.__version__, "| transformers", transformers.__version__, "| aotriton", A.version(), "|",
          torch.cuda.get_device_name(), "| attention via", backend.mode, flush=True)
    heads, kv_heads = 16, 4
    sizes = dict(vocab_size=32000, hidden_size=args.hidden, intermediate_size=int(args.hidden * 2.75),
                 num_hidden_layers=args.layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                 head_dim=args.hidden // heads, max_position_embeddings=max(2048, args.seq),
                 attention_dropout=0.0, tie_word_embeddings=False, attn_implementation="sdpa")
    if args.arch == "llama":
        config_class, model_class = LlamaConfig, LlamaForCausalLM
    else:
        config_class, model_class = MistralConfig, MistralForCausalLM
        sizes["sliding_window"] = args.sliding_window
    cfg = config_class(**sizes)
    torch.manual_seed(0)
    model = model_class(cfg).to(DEV, torch.bfloat16)
    model.train()
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    gen = torch.Generator(device="cpu").manual_seed(1)
    batches = [torch.randint(0, cfg.vocab_size, (args.batch, args.seq), generator=gen).to(DEV) for _ in range(4)]

    # 1. forward + backward, same weights
    backend.set(model, "sdpa")
    CALLS[0] = 0
    ref = fwd_bwd(model, batches[0])
    R.check("sdpa run does not call aotriton", CALLS[0] == 0, f"{CALLS[0]} calls")
    backend.set(model, "aotriton")
    CALLS[0] = 0
    got = fwd_bwd(model, batches[0])
    R.check("aotriton run calls aotriton once per layer", CALLS[0] == args.layers, f"{CALLS[0]} calls")
    backend.set(model, "sdpa")
    registered = None
    if args.arch == "llama" and hasattr(torch.nn.attention, "activate_flash_attention_impl"):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        torch.nn.attention.activate_flash_attention_impl("aotriton")
        CALLS[0] = 0
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            registered = fwd_bwd(model, batches[0])
        torch.nn.attention.restore_flash_attention_impl()
        R.check("registered path (sdpa + activated impl) calls aotriton once per layer", CALLS[0] == args.layers,
                f"{CALLS[0]} calls")
    model32 = model_class(cfg).to(DEV, torch.float32)
    model32.load_state_dict({k: v.float() for k, v in init.items()})
    model32.train()
    backend.set(model32, "sdpa")
    truth = fwd_bwd(model32, batches[0])
    del model32
    torch.cuda.empty_cache()

    for label, run in (("", got), ("registered path: ", registered)):
        if run is None:
            continue
        pairs = [("logits", run[0], ref[0], truth[0]), ("loss", run[1], ref[1], truth[1])]
        pairs += [(f"grad {n}", run[2][n], ref[2][n], truth[2][n]) for n in ref[2]]
        R.check(f"{label}same parameters have gradients", set(run[2]) == set(ref[2]),
                f"{len(run[2])} vs {len(ref[2])}")
        worst = ("", 0.0)
        for name, a, b, t in pairs:
            e = rel_l2(a, b)
            ea, es = rel_l2(a, t), rel_l2(b, t)
            ok = e <= 2e-2 or ea <= 1.5 * es + 1e-3
            if e > worst[1]:
                worst = (name, e)
            R.check(f"{label}fwd/bwd {name}", ok, f"rel L2 vs sdpa {e:.2e}; vs fp32: aotriton {ea:.2e}, sdpa {es:.2e}")
        print(f"{label}worst tensor: {worst[0]} rel L2 {worst[1]:.3e}")

    # 2. training curves
    curves = {}
    for which in ("sdpa", "aotriton"):
        model.load_state_dict(init)
        backend.set(model, which)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        losses = []
        for step in range(args.steps):
            opt.zero_grad(set_to_none=True)
            ids = batches[step % len(batches)]
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves[which] = losses
        del opt
    backend.set(model, "sdpa")
    print("step   loss sdpa   loss aotriton   rel diff")
    worst_step = 0.0
    for i, (a, b) in enumerate(zip(curves["sdpa"], curves["aotriton"])):
        d = abs(b - a) / abs(a)
        worst_step = max(worst_step, d)
        print(f"{i:4d}  {a:10.5f}  {b:14.5f}   {d:.2e}")
    finite = all(map(lambda x: x == x and abs(x) != float("inf"), curves["aotriton"]))
    R.check("training loss curves agree (|dloss| <= 2e-2 relative at every step)", finite and worst_step <= 2e-2,
            f"worst {worst_step:.2e}")
    print(f"aotriton loss {curves['aotriton'][0]:.4f} -> {curves['aotriton'][-1]:.4f} over {args.steps} steps")
    R.finish()


if __name__ == "__main__":
    main()
