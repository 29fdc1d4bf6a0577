"""GPU check of the Gluon backward with dropout (issue 17 item 5).

The three launches of ``ABI.md`` through Triton's JIT (``check_bwd.GluonBwd``) with the shipped
configs and the dropout group; O and the LSE come from the float64 reference with the portable
kernels' mask (``python/tests/philox_model.py``, the model of ``kernels/flash/dropout.py`` that the
portable kernels are held to), and dQ, dK, dV are checked against float64 autograd through the same
mask, within 3x the error of the same math in the input dtype + 1e-3 (``check_bwd``'s bound).  A
backward that drew another mask than the model's misses that bound by far (every dropped element's
dV and dS term is wrong), so this checks the mask as well; the forward's is checked bit for bit by
``check_fwd_dropout.py``.

``--bench``: p = 0.1, bf16, B*S = 16k, H*D = 2048 (hd128 S 2k-8k, hd64 and hd256 at S4k; full and
causal): the shipped backward (preprocess + main + dQ conversion, or at hd256 the dK/dV kernel + the
Gluon dQ) and, at hd64/128, the same with dQ from ``attn_bwd_gluon_dq`` instead of the fused
reduce-adds ("split": the fused kernel spills with dropout at hd128, the dK/dV-only one less), beside
cuDNN's dropout backward through SDPA (its own mask), ``do_bench`` medians.

``--rounds-loop 0|1``: the backward draws its keep tiles with Philox's rounds unrolled (0) or as a
loop (1) at every head dim (default: a loop up to ``kernels/flash_gluon/dropout.py``'s
``BWD_ROUNDS_LOOP_MAX_HEAD_DIM``, its ``ROUNDS_LOOP`` above; sm_90 bf16 hd128 fused-dQ
kernel: 170 -> 98 spill instructions), patched before anything compiles (and passed on to the consan
children); ``--signs-from-words 0|1`` likewise (``dropout.py``'s ``SIGNS_FROM_WORDS``), and
``--hoist-max-hd N`` (``BWD_HOIST_MAX_HEAD_DIM``: the round keys hoisted out of the step loop up to
head dim N; 0: nowhere).

usage: python test/gluon/check_bwd_dropout.py [--filter SUBSTR] [--consan] [--bench] [--rounds-loop 0|1]
       [--signs-from-words 0|1] [--hoist-max-hd N]
"""
import os
import sys
import zlib
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_bwd as cb  # noqa: E402  (sets up sys.path for python/)
import check_fwd_dropout  # noqa: E402  (its Case)

sys.path.insert(0, os.path.join(cb.HERE, "..", "..", "python", "tests"))
import philox_model  # noqa: E402
import torch  # noqa: E402


@dataclass
class Case(check_fwd_dropout.Case):
    """``check_fwd_dropout``'s case (its masks in ``check_bwd.window_args``' names) and ``COMPUTE_DQ``;
    ``gluon_dq``: dQ from ``attn_bwd_gluon_dq`` (``rules.GLUON_DQ_CONFIGS``), the main kernel without;
    ``head_split``: the main kernel's ``HEAD_SPLIT`` (each part draws its own heads' masks)."""
    b: int = 1
    compute_dq: int = 1
    gluon_dq: int = 0
    head_split: int = 1

    def name(self):
        return (super().name() + ("" if self.compute_dq or self.gluon_dq else " dq0")
                + (" gluon-dq" if self.gluon_dq else "") + (f" head-split {self.head_split}" if self.head_split > 1
                                                            else ""))


def cases():
    out = []
    for dt in ("fp16", "bf16"):
        for d in (64, 128, 256, 72, 200):
            out.append(Case(dt, d, 1000, 1000, "none"))
            out.append(Case(dt, d, 129, 1000, "causal_br", p=0.5, hq=4, hk=2))
            out.append(Case(dt, d, 1000, 129, "causal_br", p=0.1, hq=4, hk=1))  # rows with no key
    out.append(Case("bf16", 128, 2048, 2048, "causal_tl", p=0.9, b=2))
    out.append(Case("bf16", 128, 127, 17, "win_16_0_tl", hq=8, hk=2))
    out.append(Case("fp16", 64, 1000, 2048, "win_64_32_br"))
    out.append(Case("bf16", 256, 1, 1, "none"))
    out.append(Case("bf16", 128, 1000, 1000, "causal_tl", compute_dq=0))  # deterministic mode's dK/dV
    for d in (64, 128, 256, 200):  # dQ from its own Gluon kernel (bwd_dq.py)
        out.append(Case("bf16", d, 1000, 1000, "none", gluon_dq=1))
        out.append(Case("fp16", d, 129, 1000, "causal_br", p=0.5, hq=4, hk=2, gluon_dq=1))
    for d in (64, 128, 256):  # a GQA head split: parts of 2 + 2 and 4 + 3 heads
        out.append(Case("bf16", d, 1000, 1000, "causal_tl", p=0.3, hq=8, hk=2, head_split=2))
        out.append(Case("fp16", d, 129, 1000, "causal_br", p=0.5, hq=7, hk=1, head_split=2, compute_dq=0))
    return out


def consan_cases():
    return [Case("bf16", d, 300, 257, "causal_br", hq=4, hk=2) for d in (64, 128, 256)]


def naive_backward(q, k, v, do, o, vis, sm_scale, group, keep, scale):
    """dQ, dK, dV by the kernels' method in the input dtype: fp32 scores and softmax, P^T and dS^T
    cast to the dtype for the products, delta = rowsum(dO * O) of the stored (dtype) O.  autograd's
    low-precision gradients differ in that last point: with one visible key per row, exact math
    gives dS = 0 and autograd does too, but delta from a rounded O leaves O's rounding error."""
    dt = q.dtype
    kx, vx = k.repeat_interleave(group, dim=1).float(), v.repeat_interleave(group, dim=1).float()
    s = (q.float() @ kx.transpose(-1, -2)) * sm_scale
    s = s.masked_fill(~vis, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    pz = (p * keep * scale).to(dt).float()
    dp = do.float() @ vx.transpose(-1, -2)
    delta = (do.float() * o.float()).sum(-1, keepdim=True)
    ds = (p * (torch.where(keep, dp * scale, torch.zeros_like(dp)) - delta)).to(dt).float()
    dq = (ds @ kx) * sm_scale
    dk = (ds.transpose(-1, -2) @ q.float()) * sm_scale
    dv = pz.transpose(-1, -2) @ do.float()
    fold = lambda t: t.unflatten(1, (t.shape[1] // group, group)).sum(2)  # noqa: E731  (the GQA group)
    return dq.to(dt), fold(dk).to(dt), fold(dv).to(dt)


def run_case(case):
    dt = cb.TORCH_DTYPES[case.dtype]
    torch.manual_seed(zlib.crc32(case.name().encode()))
    dev = "cuda"

    def rnd(h, s):
        return torch.randn((case.b, h, s, case.d), device=dev, dtype=dt)

    q, k, v, do = rnd(case.hq, case.sq), rnd(case.hk, case.sk), rnd(case.hk, case.sk), rnd(case.hq, case.sq)
    wl, wr, abr = cb.window_args(case.mask, case.sq, case.sk)
    vis = cb.visible_mask(case.sq, case.sk, wl, wr, abr, dev)
    sm_scale = case.d ** -0.5
    group = case.hq // case.hk
    scale = 1.0 / (1.0 - case.p)
    keep = torch.from_numpy(philox_model.keep_mask(case.b, case.hq, case.sq, case.sk, case.seed,
                                                   case.offset + case.base, case.p)).to(dev)
    o64, lse64, dq64, dk64, dv64 = cb.reference(q, k, v, do, vis, sm_scale, group, keep=keep, dropout_scale=scale)
    o, lse = o64.to(dt).contiguous(), lse64.float().contiguous()
    dqn, dkn, dvn = naive_backward(q, k, v, do, o, vis, sm_scale, group, keep, scale)
    seed = torch.tensor([case.seed], dtype=torch.int64, device=dev)
    offset = torch.tensor([case.offset], dtype=torch.int64, device=dev)
    dropout = (philox_model.threshold(case.p), scale, seed, offset, case.base)
    bwd = cb.GluonBwd(q, k, v, o, do, lse, sm_scale, wl, wr, abr, compute_dq=0 if case.gluon_dq else case.compute_dq,
                      variant="product", dropout=dropout,
                      gluon_dq=cb.gluon_dq_config(case.d) if case.gluon_dq else None, head_split=case.head_split)
    bwd.poison()
    outs = bwd.run()
    torch.cuda.synchronize()
    ok, parts = True, []
    for n, x, r, nv in zip(("dq", "dk", "dv"), outs, (dq64, dk64, dv64), (dqn, dkn, dvn)):
        if n == "dq" and not (case.compute_dq or case.gluon_dq):
            continue
        err, bound = cb.max_err(x, r), 3 * cb.max_err(nv, r) + 1e-3
        good = err <= bound
        ok &= good
        parts.append(f"{n} {err:.2e}/{bound:.2e}{'' if good else ' FAIL'}")
    kept = (keep & vis).sum().item() / max(1, (vis.expand_as(keep)).sum().item())
    return ok, f"{'PASS' if ok else 'FAIL'} {case.name()}: " + "  ".join(parts) + f"  (kept {kept:.3f})"


def dropout_group(p):
    """``GluonBwd``'s ``dropout`` argument for probability ``p`` (a fixed seed, offset 0)."""
    seed = torch.tensor([0x5EED], dtype=torch.int64, device="cuda")
    offset = torch.tensor([0], dtype=torch.int64, device="cuda")
    return (philox_model.threshold(p), 1.0 / (1.0 - p), seed, offset, 0)


def bench():
    """The dropout backward against cuDNN's (``--bench``): one line per cell, then the geomeans."""
    from triton.testing import do_bench
    cells = [(128, s, c) for s in (2048, 4096, 8192) for c in (False, True)]
    cells += [(d, 4096, c) for d in (64, 256) for c in (False, True)]
    p = 0.1
    dropout = dropout_group(p)
    ratios, split_ratios = [], []
    for d, s, causal in cells:
        c = cb.bench_cell(16384 // s, 2048 // d, 2048 // d, s, d, causal, dropout_p=p)
        separate = d > cb.rules.GLUON_FUSED_DQ_MAX_HEAD_DIM  # the runtime's rule (gluon.rs separate_dq)
        shipped = cb.GluonBwd(c.q, c.k, c.v, c.o, c.do, c.lse, d**-0.5, *c.window, variant="product",
                              compute_dq=0 if separate else 1, dropout=dropout,
                              gluon_dq=cb.gluon_dq_config(d) if separate else None)
        t_ours = do_bench(shipped.run, warmup=25, rep=100, return_mode="median")
        t_cudnn = do_bench(c.cudnn, warmup=25, rep=100, return_mode="median")
        ours, ref = c.flops / t_ours * 1e-9, c.flops / t_cudnn * 1e-9
        ratios.append(ours / ref)
        split = ""
        if not separate:
            alt = cb.GluonBwd(c.q, c.k, c.v, c.o, c.do, c.lse, d**-0.5, *c.window, variant="product", compute_dq=0,
                              dropout=dropout, gluon_dq=cb.gluon_dq_config(d))
            t_alt = do_bench(alt.run, warmup=25, rep=100, return_mode="median")
            split_ratios.append(c.flops / t_alt * 1e-9 / ref)
            split = f"  split {c.flops / t_alt * 1e-9:6.1f} ratio {split_ratios[-1]:.3f}"
            del alt
        print(f"bench bf16 d{d} b{c.b} h{c.h} s{s} {'causal' if causal else 'none'} p{p}: gluon {ours:6.1f} TFLOP/s  "
              f"cudnn {ref:6.1f}  ratio {ours / ref:.3f}{split}", flush=True)
        del shipped, c
    print(f"check_bwd_dropout bench: /cuDNN geomean {cb.geomean(ratios):.3f}, worst {min(ratios):.3f}; split (hd64/128 "
          f"rows) geomean {cb.geomean(split_ratios):.3f}, worst {min(split_ratios):.3f}")
    return True


def main():
    return check_fwd_dropout.check_main(__doc__, __file__, "check_bwd_dropout", "backward", Case, cases, consan_cases,
                                        run_case, bench, one_loop=False)


if __name__ == "__main__":
    sys.exit(main())
