"""GPU check of the Gluon forward on packed (varlen) batches: ragged TMA descriptors.

Launches ``attn_fwd_gluon`` through Triton's JIT with the shipped configs (``python/rules.py``,
``varlen`` on) and the descriptors the runtime builds (``python/kernels/flash_gluon/ragged.py``:
rank 5 over the packed ``[tokens, H, D]`` tensors), and checks each sequence against float64
attention of that sequence alone (``check_fwd.reference_f64``), with the bound of ``check_fwd``
(3x the error of the same math in the input dtype, + 1e-3; LSE within 1e-3, +inf exactly on rows
that see no key).  Outputs are poisoned with NaN and the packed tensors carry NaN guard rows
before and after the tokens: a row the kernel fails to write, a read past a sequence that is not
masked, or a write outside the tokens shows up.  The status word must stay 0.

usage: python test/gluon/check_fwd_varlen.py [--bench | --consan] [--filter SUBSTR]
  --consan  a packed batch per head dim again under Gluon's concurrency sanitizer (one process each)
  --bench   a packed batch of 16 sequences (~42k tokens, Hq/Hk 32/8, hd128, causal and not) beside
            the fixed-length Gluon forward on the same token count and torch's varlen_attn
"""
import argparse
import math
import os
import sys
import zlib
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_fwd  # noqa: E402  (sets up sys.path for python/)
from check_bwd import window_args  # noqa: E402
import packed  # noqa: E402
from packed import GUARD, cu_seqlens, packed_batch, ragged_descriptor  # noqa: E402

import rules  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402


def shipped_config(head_dim):
    (c, ) = rules._attn_fwd_gluon_configs("sm_90", {"head_dim": head_dim, "varlen": True})
    return c


def launch_varlen(q, k, v, o, lse, status, cu_q, cu_k, max_q, max_k, dtype, sm_scale, wl, wr, align, store_lse=True):
    """One launch over packed q/k/v/o (``[tokens, H, D]`` views), lse ``[Hq, tokens]``."""
    _, hq, d = q.shape
    hk = k.shape[1]
    head_dim = check_fwd.head_dim_bucket(d)
    c = shipped_config(head_dim)
    assert not c.get("PERSISTENT"), "packed batches take the one-tile program"
    n_seq = cu_q.numel() - 1
    dq_, dk_ = ragged_descriptor(q, 64, head_dim), ragged_descriptor(k, c["BLOCK_N"], head_dim)
    dv_, do_ = ragged_descriptor(v, c["BLOCK_N"], head_dim), ragged_descriptor(o, 64, head_dim)
    grid = (triton.cdiv(max_q, c["BLOCK_M"]), hq, n_seq)
    cx = {k_: c[k_] for k_ in ("BLOCK_M", "BLOCK_N", "STAGES", *rules.GLUON_FWD_KNOBS) if k_ in c}

    def launch():
        check_fwd.KERNEL[grid](dq_, dk_, dv_, do_, lse, 0, lse.stride(0), sm_scale, int(store_lse), max_q, max_k,
                               hq // hk, wl, wr, align, 1, cu_q, cu_k, q.shape[0], k.shape[0], status, 1,
                               *check_fwd.NO_DROPOUT, HEAD_DIM=head_dim, **cx, num_warps=c["num_warps"], maxnreg=c["maxnreg"])
    return launch


@dataclass
class Case(packed.PackedCase):
    store_lse: bool = True

    def flags(self):
        return "" if self.store_lse else " no-lse"


def cases():
    return packed.packed_cases(Case, 1000, 2048) + [
        Case("bf16", 128, [300, 1, 129, 0, 1000, 17, 128], mask="causal_tl", store_lse=False),
        Case("bf16", 128, [1], mask="none"),
    ]


def consan_cases():
    """One packed batch per head dim under the sanitizer: ragged lengths (an empty sequence, a
    one-token one, tails around the blocks), causal, GQA."""
    return [Case("bf16", d, [300, 0, 1, 129], mask="causal_br", hq=4, hk=2) for d in (64, 128, 256)]


def run_case(case, device="cuda"):
    dt = check_fwd.TORCH_DTYPES[case.dtype]
    gen = torch.Generator(device=device).manual_seed(zlib.crc32(case.name().encode()))
    q_store, q = packed.guarded(case.lens_q, case.hq, case.d, dt, gen, device)
    k_store, k = packed.guarded(case.lens_k, case.hk, case.d, dt, gen, device)
    v_store, v = packed.guarded(case.lens_k, case.hk, case.d, dt, gen, device)
    o_store, o = packed.guarded(case.lens_q, case.hq, case.d, dt, gen, device, random=False)
    tq = sum(case.lens_q)
    lse_store = torch.full((case.hq, tq + 2 * GUARD), float("nan"), device=device, dtype=torch.float32)
    lse = lse_store[:, GUARD:GUARD + tq]
    status = torch.zeros(4, dtype=torch.int32, device=device)
    cu_q, cu_k = cu_seqlens(case.lens_q, device), cu_seqlens(case.lens_k, device)
    max_q, max_k = max(max(case.lens_q), 1), max(max(case.lens_k), 1)
    sm_scale = 1.0 / math.sqrt(case.d)
    wl, wr, align = window_args(case.mask, max_q, max_k)  # the generic mask names of packed.packed_cases
    launch_varlen(q, k, v, o, lse, status, cu_q, cu_k, max_q, max_k, case.dtype, sm_scale, wl, wr, align,
                  case.store_lse)()
    torch.cuda.synchronize()

    ok, worst, worst_bound, notes = True, 0.0, 0.0, []
    for b, (sq, sk) in enumerate(zip(case.lens_q, case.lens_k)):
        q0, k0 = int(cu_q[b]), int(cu_k[b])
        if sq == 0:
            continue  # no rows (the guards catch a write)
        os_ = packed.sequence(o, q0, sq)
        if sk == 0:  # no keys: O = 0 and LSE = +inf exactly (the references reduce over no key)
            if not torch.equal(os_, torch.zeros_like(os_)):
                ok = False
                notes.append(f"seq{b} O not 0 (no keys)")
            if case.store_lse and not torch.isposinf(lse[:, q0:q0 + sq]).all():
                ok = False
                notes.append(f"seq{b} LSE not +inf (no keys)")
            continue
        qs, ks, vs = packed.sequence(q, q0, sq), packed.sequence(k, k0, sk), packed.sequence(v, k0, sk)
        visible = check_fwd.visible_mask(sq, sk, wl, wr, align, q.device)
        o_ref, lse_ref = check_fwd.reference_f64(qs, ks, vs, sm_scale, visible)
        o_naive = check_fwd.reference_naive(qs, ks, vs, sm_scale, visible)
        bound = 3 * check_fwd.max_abs(o_naive.double() - o_ref) + 1e-3
        if torch.isnan(os_).any().item():
            ok = False
            notes.append(f"seq{b} NaN-in-O")
            continue
        err = check_fwd.max_abs(os_.double() - o_ref)
        worst, worst_bound = max(worst, err), max(worst_bound, bound)
        if err > bound:
            ok = False
            notes.append(f"seq{b} o_err {err:.2e} > {bound:.2e}")
        if case.store_lse:
            ls = lse[:, q0:q0 + sq].unsqueeze(0)
            inf_ref = torch.isinf(lse_ref)
            if not torch.equal(torch.isposinf(ls), inf_ref) or torch.isnan(ls).any().item():
                ok = False
                notes.append(f"seq{b} LSE inf/NaN mismatch")
            elif (~inf_ref).any() and check_fwd.max_abs(ls.double()[~inf_ref] - lse_ref[~inf_ref]) > 1e-3:
                ok = False
                notes.append(f"seq{b} lse_err")
    guards = [("q", q_store), ("k", k_store), ("v", v_store), ("o", o_store)]
    for name, store in guards:
        if not packed.guards_intact(store):
            ok = False
            notes.append(f"{name} guard rows written")
    if not torch.isnan(lse_store[:, :GUARD]).all() or not torch.isnan(lse_store[:, -GUARD:]).all():
        ok = False
        notes.append("lse guard written")
    if not case.store_lse and not torch.isnan(lse).all():
        ok = False
        notes.append("LSE WRITTEN WITH STORE_LSE=0")
    if int(status.sum()) != 0:
        ok = False
        notes.append(f"status {status.tolist()}")
    line = (f"{'PASS' if ok else 'FAIL'} {case.name()}: o_err {worst:.2e} (bound {worst_bound:.2e})"
            + ("" if not notes else " " + "; ".join(notes)))
    return ok, line


def bench():
    dt, dtype = torch.bfloat16, "bf16"
    hq, hk, d = packed_batch.HEADS_Q, packed_batch.HEADS_K, packed_batch.HEAD_DIM
    lens = packed_batch.lengths()
    flops = packed_batch.flops
    total = sum(lens)
    dev = "cuda"
    q = torch.randn(total, hq, d, device=dev, dtype=dt)
    k = torch.randn(total, hk, d, device=dev, dtype=dt)
    v = torch.randn(total, hk, d, device=dev, dtype=dt)
    o = torch.empty_like(q)
    lse = torch.empty(hq, total, device=dev, dtype=torch.float32)
    status = torch.zeros(4, dtype=torch.int32, device=dev)
    cu = cu_seqlens(lens, dev)
    sm_scale = 1 / math.sqrt(d)
    # Fixed length on the same token count: B sequences of the mean length.
    b_fixed, s_fixed = len(lens), total // len(lens)
    qf = torch.randn(b_fixed, hq, s_fixed, d, device=dev, dtype=dt)
    kf = torch.randn(b_fixed, hk, s_fixed, d, device=dev, dtype=dt)
    vf = torch.randn(b_fixed, hk, s_fixed, d, device=dev, dtype=dt)
    of = torch.empty_like(qf)
    lsef = torch.empty(b_fixed, hq, s_fixed, device=dev, dtype=torch.float32)
    print(f"packed batch: {len(lens)} sequences, {total} tokens (min {min(lens)}, max {max(lens)}), "
          f"Hq/Hk {hq}/{hk}, hd{d}, bf16; fixed length: B{b_fixed} S{s_fixed}")
    for mask in ("none", "causal"):
        causal = mask == "causal"
        wl, wr, align = check_fwd.window(mask, max(lens), max(lens))
        ours = launch_varlen(q, k, v, o, lse, status, cu, cu, max(lens), max(lens), dtype, sm_scale, wl, wr, align)
        wlf, wrf, alf = check_fwd.window(mask, s_fixed, s_fixed)
        fixed = check_fwd.prepare(qf, kf, vf, of, lsef, dtype, sm_scale, wlf, wrf, alf, variant="product")
        ms = triton.testing.do_bench(ours, warmup=25, rep=200)
        ms_f = triton.testing.do_bench(fixed, warmup=25, rep=200)
        tf = flops(lens, hq, d, causal) / ms / 1e9
        tf_f = flops([s_fixed] * b_fixed, hq, d, causal) / ms_f / 1e9
        line = (f"varlen {mask:6s}: gluon {tf:6.1f} TFLOP/s ({ms:.3f} ms)  fixed-length gluon {tf_f:6.1f} "
                f"({ms_f:.3f} ms)  ratio {tf / tf_f:.3f}")
        peer = packed_batch.torch_varlen_attn(q, k, v, cu, max(lens), causal)
        if peer is not None:
            try:
                ms_p = triton.testing.do_bench(peer, warmup=25, rep=200)
                tf_p = flops(lens, hq, d, causal) / ms_p / 1e9
                line += f"  torch varlen_attn {tf_p:6.1f} ({ms_p:.3f} ms)  ours/varlen_attn {tf / tf_p:.3f}"
            except Exception as e:  # noqa: BLE001
                line += f"  torch varlen_attn: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
        else:
            line += "  torch varlen_attn: not in this torch"
        print(line, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", action="store_true")
    packed.add_check_options(ap)
    args = ap.parse_args()
    ok = packed.run_check(__file__, "check_fwd_varlen", args, Case, cases, consan_cases, run_case)
    if args.bench and not (args.consan or args.consan_child):
        bench()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
