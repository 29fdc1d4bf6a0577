"""GPU check of the Gluon forward with dropout (issue 17 item 5).

Launches ``attn_fwd_gluon`` through Triton's JIT with the shipped dropout configs (``python/rules.py``,
``dropout`` on) and checks, per case:

* the keep mask bit for bit against the portable kernels' rule (``python/tests/philox_model.py``, the
  numpy model of ``kernels/flash/dropout.py`` that the interpreter tests and the GPU suites hold the
  portable kernels to): V is the identity (or, for long windowed sequences, key ``j`` carries the
  unit vector ``j mod D`` and the window is narrower than D), so O's nonzero entries *are* the kept
  visible (query, key) pairs;
* O against float64 attention with the model's mask, ``dropout(P) V / l / (1 - p)``, within 3x the
  error of the same math in the input dtype + 1e-3; the LSE (of the undropped scores) within 1e-3;
* the (seed, offset) the kernel reports (``STORE_PHILOX``), and NaN-poisoned outputs fully written.

``--rounds-loop 1``: every kernel draws with Philox's rounds as a loop (``kernels/flash_gluon/dropout.py``'s
``ROUNDS_LOOP``); ``--rounds-loop 0``: none does (by default the forward loops at ``fwd.py``'s
``DROPOUT_ROUNDS_LOOP_HEAD_DIM``); ``--one-loop 1``: the forward walks every key block after the first in one masked
loop (``fwd.py``'s ``DROPOUT_ONE_LOOP``), ``--one-loop 2`` in one loop masked at run time where a
block needs it.  Both are patched before anything compiles; the consan
children keep the modules' values.
``--bench``: p = 0.1, bf16, B*S = 16k, H*D = 2048 (hd128 S 2k-8k, hd64 and hd256 at S4k; full and
causal): the forward's TFLOP/s (4*B*H*S^2*D, halved for causal) beside cuDNN's dropout forward
through SDPA, median of ``do_bench``.

usage: python test/gluon/check_fwd_dropout.py [--filter SUBSTR] [--consan] [--bench] [--rounds-loop 0|1]
       [--one-loop 0|1|2]
"""
import argparse
import math
import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_fwd as cf  # noqa: E402  (sets up sys.path for python/)
import packed  # noqa: E402  (run_check: the check scripts' modes)

sys.path.insert(0, os.path.join(cf.ROOT, "python", "tests"))
import philox_model  # noqa: E402
import rules  # noqa: E402
from kernels.flash_gluon import dropout as dropout_gluon  # noqa: E402
from kernels.flash_gluon import fwd as fwd_gluon  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402


def shipped_config(head_dim):
    (c, ) = rules._attn_fwd_gluon_configs("sm_90", {"head_dim": head_dim, "dropout": True})
    return c


@dataclass
class Case(cf.Case):
    """``check_fwd``'s case (shape, mask, GQA, layout) with dropout; its ``store_lse``, ``stages``,
    ``variant`` and ``pers_grid`` keep their defaults (the shipped dropout config, LSE stored)."""
    p: float = 0.2
    probe: str = ""  # "identity": V = I (needs sk <= d); "window": V rows e_{j mod d} (window < d)
    seed: int = 0x5EED_1234_ABCD
    offset: int = 2**32 - 40  # counters cross the 32-bit boundary
    base: int = 7

    def name(self):
        return f"{super().name()} p{self.p}{' ' + self.probe if self.probe else ''}"


def cases():
    out = []
    # The mask itself, exactly: one and two key blocks per head dim, causal both ways, GQA.
    for dtype, d in (("bf16", 64), ("fp16", 128), ("bf16", 256)):
        out.append(Case(dtype, d, 300, min(d, 128), "none", probe="identity"))
        out.append(Case(dtype, d, 129, min(d, 128), "causal_br", p=0.5, hq=4, hk=2, probe="identity"))
        out.append(Case(dtype, d, 64, 64, "causal", p=0.7, probe="identity"))
    # Long sequences through a window narrower than D: every key block of the walk, mask exact.
    out.append(Case("bf16", 128, 1000, 1000, "win64_32", probe="window"))
    out.append(Case("fp16", 256, 777, 2048, "win100_27_br", p=0.1, hq=4, hk=1, probe="window"))
    out.append(Case("bf16", 64, 1000, 777, "win40_20", p=0.3, b=1, probe="window"))
    # Numerics: head dims (padded ones too), masks, Sq != Sk both ways, GQA/MQA, p.
    for dtype in ("fp16", "bf16"):
        for d in (64, 128, 256, 40, 96):
            out.append(Case(dtype, d, 1000, 1000, "none"))
            out.append(Case(dtype, d, 129, 1000, "causal_br", p=0.5))
    for sq, sk in ((1, 1), (17, 129), (129, 17), (1000, 2048), (2048, 1000), (127, 128), (128, 127)):
        out.append(Case("bf16", 128, sq, sk, "causal", b=1))
        out.append(Case("fp16", 64, sq, sk, "none", p=0.1, b=1))
    out.append(Case("bf16", 128, 1000, 777, "win0_0_br", hq=8, hk=1))  # rows that see no key
    out.append(Case("fp16", 128, 777, 1000, "causal_br", hq=4, hk=2, layout="bshd"))  # [B, S, H, D] views
    out.append(Case("bf16", 64, 300, 64, "causal", hq=4, hk=4, layout="bshd", probe="identity"))
    out.append(Case("bf16", 256, 1000, 777, "win64_32", hq=8, hk=2, p=0.9))
    return out


def consan_cases():
    return [Case("bf16", d, 300, 257, "causal_br", hq=4, hk=2, b=1) for d in (64, 128, 256)]


def inputs(case, device="cuda"):
    """``check_fwd.make_inputs`` (NaN-poisoned O and LSE), with the probe's V."""
    q, k, v, o, lse = cf.make_inputs(case, device)
    if case.probe:
        eye = torch.eye(case.d, device=device, dtype=v.dtype)
        v = v.copy_(eye[torch.arange(case.sk, device=device) % case.d].expand(v.shape))
    return q, k, v, o, lse


def launch(case, q, k, v, o, lse, sm_scale, wl, wr, align):
    head_dim = cf.head_dim_bucket(case.d)
    c = shipped_config(head_dim)
    assert not c.get("PERSISTENT"), "dropout takes the one-tile program"
    dev = q.device
    seed = torch.tensor([case.seed], dtype=torch.int64, device=dev)
    offset = torch.tensor([case.offset], dtype=torch.int64, device=dev)
    seed_out = torch.full((1, ), -1, dtype=torch.int64, device=dev)
    offset_out = torch.full((1, ), -1, dtype=torch.int64, device=dev)
    dq, dk = cf.descriptor(q, 64, head_dim, case.dtype), cf.descriptor(k, c["BLOCK_N"], head_dim, case.dtype)
    dv, do = cf.descriptor(v, c["BLOCK_N"], head_dim, case.dtype), cf.descriptor(o, 64, head_dim, case.dtype)
    grid = (triton.cdiv(case.sq, c["BLOCK_M"]), case.hq, case.b)
    cx = {k_: c[k_] for k_ in ("BLOCK_M", "BLOCK_N", "STAGES", *rules.GLUON_FWD_KNOBS) if k_ in c}
    threshold = philox_model.threshold(case.p)
    scale = 1.0 / (1.0 - case.p)
    cf.KERNEL[grid](dq, dk, dv, do, lse, lse.stride(0), lse.stride(1), sm_scale, 1, case.sq, case.sk,
                    case.hq // case.hk, wl, wr, align, *cf.NOT_PACKED, threshold, scale, seed, offset, case.base,
                    seed_out, offset_out, 1, HEAD_DIM=head_dim, DROPOUT=1, **cx, num_warps=c["num_warps"],
                    maxnreg=c["maxnreg"])
    return seed_out, offset_out


def run_case(case):
    q, k, v, o, lse = inputs(case)
    sm_scale = 1.0 / math.sqrt(case.d)
    wl, wr, align = cf.window(case.mask, case.sq, case.sk)
    seed_out, offset_out = launch(case, q, k, v, o, lse, sm_scale, wl, wr, align)
    torch.cuda.synchronize()
    visible = cf.visible_mask(case.sq, case.sk, wl, wr, align, q.device)
    keep = torch.from_numpy(philox_model.keep_mask(case.b, case.hq, case.sq, case.sk, case.seed,
                                                   case.offset + case.base, case.p)).to(q.device)
    notes, ok = [], True
    ok &= seed_out.item() == case.seed and offset_out.item() == case.offset + case.base
    notes.append("philox out ok" if ok else f"PHILOX OUT {seed_out.item()}, {offset_out.item()}")
    o_nan = torch.isnan(o).any().item()
    ok &= not o_nan

    # LSE: of the undropped scores.
    _, lse_ref = cf.reference_f64(q, k, v, sm_scale, visible)
    finite = torch.isfinite(lse_ref)
    lse_ok = torch.equal(torch.isposinf(lse), ~finite) and not torch.isnan(lse).any().item()
    lse_err = cf.max_abs(lse.double()[finite] - lse_ref[finite]) if lse_ok else float("nan")
    ok &= lse_ok and lse_err <= 1e-3
    notes.append(f"lse_err {lse_err:.1e}")

    if case.probe:
        # O[b, h, i, j mod D] != 0 exactly where key j is visible and kept.
        cols = torch.arange(case.sk, device=q.device) % case.d
        seen = (o != 0)[..., cols]  # [B, H, Sq, Sk]: the output column key j lands in
        vis = visible.expand_as(seen)
        mismatches = int(((seen != keep) & vis).sum().item())
        ok &= mismatches == 0 and not o_nan
        kept = (keep & vis).sum().item() / max(1, vis.sum().item())
        notes.append(f"mask {'exact' if mismatches == 0 else f'{mismatches} BITS DIFFER'} (kept {kept:.3f})")
    else:
        group = case.hq // case.hk
        kx, vx = cf.expand_kv(k, group).double(), cf.expand_kv(v, group).double()
        s = (q.double() @ kx.transpose(-1, -2)) * sm_scale
        s = s.masked_fill(~visible, float("-inf"))
        m = s.amax(-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        pr = torch.exp(s - m)
        l = pr.sum(-1, keepdim=True)
        l = torch.where(l > 0, l, torch.ones_like(l))
        scale = 1.0 / (1.0 - case.p)
        o_ref = ((pr * keep) @ vx) / l * scale
        # The same math in the input dtype: fp32 softmax, dropped and scaled P cast to the dtype for
        # P V, O in the dtype (a row with one visible key is then exact only up to O's rounding).
        p32 = torch.softmax(s.float(), -1).nan_to_num(0.0) * keep * scale
        o_naive = (p32.to(q.dtype) @ cf.expand_kv(v, group)).double()
        bound = 3 * cf.max_abs(o_naive - o_ref) + 1e-3
        err = float("nan") if o_nan else cf.max_abs(o.double() - o_ref)
        ok &= err <= bound
        notes.append(f"o_err {err:.2e} (bound {bound:.2e})")
    return ok, f"{'PASS' if ok else 'FAIL'} {case.name()}: " + ", ".join(notes)


def bench():
    """The dropout forward against cuDNN's through SDPA (``--bench``); one line per cell, then a geomean."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    cells = [(128, s, c) for s in (2048, 4096, 8192) for c in (False, True)]
    cells += [(d, 4096, c) for d in (64, 256) for c in (False, True)]
    ratios = []
    for d, s, causal in cells:
        case = Case("bf16", d, s, s, "causal" if causal else "none", p=0.1, hq=2048 // d, hk=2048 // d, b=16384 // s)
        q, k, v, o, lse = inputs(case)
        wl, wr, align = cf.window(case.mask, s, s)
        t_ours = triton.testing.do_bench(lambda: launch(case, q, k, v, o, lse, d**-0.5, wl, wr, align), warmup=25,
                                         rep=100, return_mode="median")
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            t_cudnn = triton.testing.do_bench(
                lambda: scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=causal), warmup=25, rep=100,
                return_mode="median")
        flops = 4 * case.b * case.hq * s * s * d * (0.5 if causal else 1.0)
        ours, ref = flops / t_ours * 1e-9, flops / t_cudnn * 1e-9
        ratios.append(ours / ref)
        print(f"bench {case.name()}: gluon {ours:6.1f} TFLOP/s  cudnn {ref:6.1f}  ratio {ours / ref:.3f}", flush=True)
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"check_fwd_dropout bench (ROUNDS_LOOP {int(dropout_gluon.ROUNDS_LOOP)}, forward loop at hd "
          f"{int(fwd_gluon.DROPOUT_ROUNDS_LOOP_HEAD_DIM)}, DROPOUT_ONE_LOOP "
          f"{int(fwd_gluon.DROPOUT_ONE_LOOP)}): /cuDNN geomean {geo:.3f}, worst {min(ratios):.3f}")
    return True


def patch_switches(rounds_loop=None, one_loop=None, signs_from_words=None, hoist_max_hd=None):
    """``--rounds-loop`` / ``--one-loop`` / ``--signs-from-words`` / ``--hoist-max-hd`` (None: the modules'
    values), before anything compiles."""
    from triton.experimental.gluon import language as gl
    if hoist_max_hd is not None:
        dropout_gluon.BWD_HOIST_MAX_HEAD_DIM = gl.constexpr(hoist_max_hd)
    if signs_from_words is not None:
        dropout_gluon.SIGNS_FROM_WORDS = gl.constexpr(signs_from_words)
    if rounds_loop is not None:
        dropout_gluon.ROUNDS_LOOP = gl.constexpr(rounds_loop)
        if rounds_loop == 0:
            fwd_gluon.DROPOUT_ROUNDS_LOOP_HEAD_DIM = gl.constexpr(0)
            dropout_gluon.BWD_ROUNDS_LOOP_MAX_HEAD_DIM = gl.constexpr(0)
    if one_loop is not None:
        fwd_gluon.DROPOUT_ONE_LOOP = gl.constexpr(one_loop)


def check_main(doc, path, name, what, Case, cases, consan_cases, run_case, bench, one_loop=True):
    """The command line of this file and check_bwd_dropout.py (``what``: "forward" or "backward"): the
    checks (``packed.run_check``), or ``--bench``; ``--rounds-loop``, (``one_loop``) ``--one-loop`` and (not
    ``one_loop``: the backward) ``--signs-from-words`` patch the kernels' switches (``patch_switches``) first."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    packed.add_check_options(ap)
    ap.add_argument("--bench", action="store_true", help=f"time the dropout {what} beside cuDNN's")
    ap.add_argument("--rounds-loop", type=int, choices=(0, 1), default=None,
                    help="Philox's rounds unrolled (0) or as a loop (1) in every kernel (default: dropout.py's "
                         "ROUNDS_LOOP, the forward's loop at fwd.py's DROPOUT_ROUNDS_LOOP_HEAD_DIM and the "
                         "backward's up to dropout.py's BWD_ROUNDS_LOOP_MAX_HEAD_DIM)")
    if not one_loop:
        ap.add_argument("--signs-from-words", type=int, choices=(0, 1), default=None,
                        help="the backward's keep bits into P^T's signs on the Philox words (1) or through a bool "
                             "tile (0) (default: dropout.py's SIGNS_FROM_WORDS)")
        ap.add_argument("--hoist-max-hd", type=int, default=None,
                        help="the backward's round keys and unit indices hoisted out of the step loop up to this "
                             "head dim (0: nowhere; default: dropout.py's BWD_HOIST_MAX_HEAD_DIM)")
    else:
        ap.add_argument("--one-loop", type=int, choices=(0, 1, 2, 3), default=None,
                        help="the forward's later key blocks in a full and a masked loop (0), one masked loop (1), "
                             "one loop masked at run time from the first boundary block (2), or 2 in a CTA that "
                             "walks a boundary block and 0 elsewhere (3) (default: fwd.py's DROPOUT_ONE_LOOP)")
    args = ap.parse_args()
    switches = {"rounds_loop": args.rounds_loop, "one_loop": getattr(args, "one_loop", None),
                "signs_from_words": getattr(args, "signs_from_words", None),
                "hoist_max_hd": getattr(args, "hoist_max_hd", None)}
    patch_switches(**switches)
    if args.bench:
        return 0 if bench() else 1
    child_argv = [arg for key, value in switches.items() if value is not None
                  for arg in ("--" + key.replace("_", "-"), str(value))]
    return 0 if packed.run_check(path, name, args, Case, cases, consan_cases, run_case, child_argv) else 1


def main():
    return check_main(__doc__, __file__, "check_fwd_dropout", "forward", Case, cases, consan_cases, run_case, bench)


if __name__ == "__main__":
    sys.exit(main())
