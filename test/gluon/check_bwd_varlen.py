"""GPU check of the Gluon backward on packed (varlen) batches: the three launches of ``ABI.md``
("Packed batches") through Triton's JIT with the shipped configs and the runtime's ragged
descriptors (``packed.py``).

Per case: a packed batch (``[tokens, H, D]`` tensors with NaN guard rows), O and LSE from a float64
reference forward of each sequence alone, then preprocess -> main -> dQ conversion, and per
sequence dQ, dK, dV against float64 autograd of that sequence, bound ``3 * max|naive - ref64| +
1e-3`` (``check_bwd.py``'s, ``naive`` the same math in the input dtype); DELTA within 1e-3 of
``rowsum(dO * O)``.  Outputs, DELTA and the workspace are poisoned with NaN first; the guard rows
of every packed tensor must stay NaN (no read past a sequence that is not masked, no write outside
the tokens) and the status word 0.  ``COMPUTE_DQ`` 0 (the deterministic mode's main kernel) is
checked on dK/dV, and with dQ from ``attn_bwd_gluon_dq`` (``bwd_dq.py``, cases ``gluon-dq``) on all three.

usage: python test/gluon/check_bwd_varlen.py [--consan] [--filter SUBSTR]
  --consan  a packed batch per head dim again under Gluon's concurrency sanitizer (one process each)
"""
import math
import os
import sys
import zlib
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_bwd  # noqa: E402  (sets up sys.path for python/)
import packed  # noqa: E402
from packed import cu_seqlens, ragged_descriptor  # noqa: E402

import rules  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

from kernels.flash_gluon.bwd import attn_bwd_gluon  # noqa: E402
from kernels.flash_gluon.bwd_dq import attn_bwd_gluon_dq  # noqa: E402
from kernels.flash_gluon.bwd_dq_convert import attn_bwd_gluon_dq_convert  # noqa: E402
from kernels.flash_gluon.bwd_preprocess import attn_bwd_gluon_preprocess  # noqa: E402


def shipped(hd, row_family, compute_dq):
    """(main config, rows per program of the preprocess/convert) of python/rules.py for bucket ``hd``."""
    (main, ) = rules._attn_bwd_gluon_configs("sm_90", {"head_dim": hd, "dq": bool(compute_dq), "varlen": True})
    (rows, ) = row_family("sm_90", {"head_dim": hd})
    return main, rows


class PackedBwd:
    """Workspace, ragged descriptors and the three launches for one packed batch."""

    def __init__(self, q, k, v, o, do, lse, cu_q, cu_k, max_q, max_k, sm_scale, window, compute_dq=1, gluon_dq=None):
        """``gluon_dq``: ``(BLOCK_N, K_STAGES, V_STAGES)`` of ``attn_bwd_gluon_dq`` for dQ (``compute_dq`` 0)."""
        tq, hq, d = q.shape
        tk, hk = k.shape[0], k.shape[1]
        self.hd = hd = check_bwd.bucket(d)
        main, rows_cfg = shipped(hd, rules._attn_bwd_gluon_rows_configs, compute_dq)
        self.aux_m, self.aux_warps = rows_cfg["BLOCK_M"], rows_cfg["num_warps"]
        self.main_cfg = main
        n_seq = cu_q.numel() - 1
        self.block_n = bn = main["BLOCK_N"]
        self.sq_pad = sq_pad = triton.cdiv(max_q, 128) * 128
        ws_rows = n_seq * hq * sq_pad
        self.ws = torch.empty(ws_rows * (hd + 2), device=q.device, dtype=torch.float32)
        self.dq_acc = self.ws[:ws_rows * hd].view(ws_rows, hd)
        self.lse2 = self.ws[ws_rows * hd:ws_rows * (hd + 1)]
        self.delta2 = self.ws[ws_rows * (hd + 1):]
        self.delta_store = torch.full((hq, tq + 2 * packed.GUARD), float("nan"), device=q.device, dtype=torch.float32)
        self.delta = self.delta_store[:, packed.GUARD:packed.GUARD + tq]
        self.outs = [packed.guarded([t], h, d, q.dtype, None, q.device, random=False)
                     for t, h in ((tq, hq), (tk, hk), (tk, hk))]
        (_, self.dq), (_, self.dk), (_, self.dv) = self.outs
        self.status = torch.zeros(4, device=q.device, dtype=torch.int32)
        self.no_partials = torch.empty(1, device=q.device, dtype=torch.float32)  # HEAD_SPLIT 1: unread
        self.q, self.k, self.v, self.o, self.do, self.lse = q, k, v, o, do, lse
        self.cu_q, self.cu_k, self.max_q, self.max_k = cu_q, cu_k, max_q, max_k
        self.sm_scale, self.window, self.compute_dq, self.gluon_dq = sm_scale, window, compute_dq, gluon_dq
        self.n_seq, self.hq, self.hk, self.d, self.tq, self.tk = n_seq, hq, hk, d, tq, tk
        vec = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
        dkv_rows, dkv_cols = (bn, hd // 2) if hd > 128 else (bn // 2, hd)
        self.descs = (
            ragged_descriptor(q, check_bwd.BLOCK_M, hd), ragged_descriptor(k, bn, hd), ragged_descriptor(v, bn, hd),
            ragged_descriptor(do, check_bwd.BLOCK_M, hd), ragged_descriptor(self.dk, dkv_rows, dkv_cols),
            ragged_descriptor(self.dv, dkv_rows, dkv_cols),
            TensorDescriptor.from_tensor(self.dq_acc, [check_bwd.BLOCK_M, 8], vec),
            TensorDescriptor.from_tensor(self.lse2.view(ws_rows // 64, 64), [1, 64], vec),
            TensorDescriptor.from_tensor(self.delta2.view(ws_rows // 64, 64), [1, 64], vec),
        )
        if gluon_dq:
            self.dq_descs = (ragged_descriptor(q, 64, hd), ragged_descriptor(k, gluon_dq[0], hd),
                             ragged_descriptor(v, gluon_dq[0], hd), ragged_descriptor(do, 64, hd),
                             ragged_descriptor(self.dq, 64, hd))

    def poison(self):
        for t in (self.ws, self.delta_store, *(store for store, _ in self.outs)):
            t.fill_(float("nan"))

    def packing_q(self):
        return (1, self.cu_q, self.tq, self.status, 1)

    def run(self):
        o, do, lse, delta, dq = self.o, self.do, self.lse, self.delta, self.dq
        # Packed tensors [tokens, H, D] as the runtime's [1, H, tokens, D] views: batch stride 0.
        attn_bwd_gluon_preprocess[(self.sq_pad // self.aux_m, self.hq, self.n_seq)](
            o, do, 0, o.stride(1), o.stride(0), 0, do.stride(1), do.stride(0), lse, 0, lse.stride(0), delta, 0,
            delta.stride(0), self.lse2, self.delta2, self.dq_acc, self.max_q, self.sq_pad, self.d, self.compute_dq,
            *self.packing_q(), HEAD_DIM=self.hd, BLOCK_M=self.aux_m, num_warps=self.aux_warps)
        wl, wr, abr = self.window
        c = self.main_cfg
        knobs = {k: c[k] for k in rules.GLUON_BWD_KNOBS}
        attn_bwd_gluon[(triton.cdiv(self.max_k, self.block_n), self.hk, self.n_seq)](
            *self.descs, self.sm_scale, self.max_q, self.max_k, self.sq_pad, self.hq, self.hq // self.hk, wl, wr, abr,
            1, self.cu_q, self.cu_k, self.tq, self.tk, self.status, 1, *check_bwd.NO_DROPOUT, 1,
            self.no_partials, HEAD_DIM=self.hd, BLOCK_M=check_bwd.BLOCK_M, BLOCK_N=self.block_n, STAGES=c["STAGES"],
            COMPUTE_DQ=self.compute_dq, **knobs, num_warps=4, maxnreg=c["maxnreg"])
        if self.gluon_dq:
            bn, ks, vs = self.gluon_dq
            attn_bwd_gluon_dq[(triton.cdiv(self.max_q, 128), self.hq, self.n_seq)](
                *self.dq_descs, self.lse2, self.delta2, self.sm_scale, self.max_q, self.max_k, self.sq_pad,
                self.hq // self.hk, wl, wr, abr, 1, self.cu_q, self.cu_k, self.tq, self.tk, self.status, 1,
                *check_bwd.NO_DROPOUT, HEAD_DIM=self.hd, BLOCK_M=128, BLOCK_N=bn, K_STAGES=ks, V_STAGES=vs,
                num_warps=4, maxnreg=c["maxnreg"])
        if self.compute_dq:
            attn_bwd_gluon_dq_convert[(triton.cdiv(self.max_q, self.aux_m), self.hq, self.n_seq)](
                self.dq_acc, dq, 0, dq.stride(1), dq.stride(0), self.sm_scale, self.max_q, self.sq_pad, self.d,
                self.hq, *self.packing_q(), HEAD_DIM=self.hd, BLOCK_M=self.aux_m, num_warps=self.aux_warps)


@dataclass
class Case(packed.PackedCase):
    compute_dq: int = 1
    gluon_dq: int = 0  # dQ from attn_bwd_gluon_dq (rules.GLUON_DQ_CONFIGS), the main kernel without

    def flags(self):
        return " gluon-dq" if self.gluon_dq else "" if self.compute_dq else " dq0"


def cases():
    lens = [300, 1, 129, 0, 500, 17, 128]
    return packed.packed_cases(Case, 500, 1024) + [
        Case("bf16", d, lens, mask="causal_br", hq=4, hk=2, compute_dq=0) for d in (64, 128, 256)] + [
        c for d in (64, 128, 256) for c in (
            Case("bf16", d, lens, mask="causal_br", hq=4, hk=2, gluon_dq=1),
            Case("fp16", d, lens, [17, 300, 0, 129, 40, 600, 128], mask="none", hq=4, hk=1, gluon_dq=1))]


def consan_cases():
    """One packed batch per head dim under the sanitizer (and the dQ-less main kernel at hd128):
    ragged lengths (an empty sequence, a one-token one, tails around the blocks), causal, GQA."""
    lens = [300, 0, 1, 129]
    return ([Case("bf16", d, lens, mask="causal_br", hq=4, hk=2) for d in (64, 128, 256)]
            + [Case("bf16", 128, lens, mask="causal_br", hq=4, hk=2, compute_dq=0)])


def run_case(case, device="cuda"):
    dt = check_bwd.TORCH_DTYPES[case.dtype]
    gen = torch.Generator(device=device).manual_seed(zlib.crc32(case.name().encode()))
    stores = {}
    for name, lens, h in (("q", case.lens_q, case.hq), ("k", case.lens_k, case.hk), ("v", case.lens_k, case.hk),
                          ("do", case.lens_q, case.hq)):
        stores[name] = packed.guarded(lens, h, case.d, dt, gen, device)
    q, k, v, do = (stores[n][1] for n in ("q", "k", "v", "do"))
    tq = q.shape[0]
    o_store, o = packed.guarded(case.lens_q, case.hq, case.d, dt, gen, device, random=False)
    lse = torch.full((case.hq, tq), float("nan"), device=device, dtype=torch.float32)
    cu_q, cu_k = cu_seqlens(case.lens_q, device), cu_seqlens(case.lens_k, device)
    max_q, max_k = max(max(case.lens_q), 1), max(max(case.lens_k), 1)
    sm_scale = 1.0 / math.sqrt(case.d)
    window = check_bwd.window_args(case.mask, max_q, max_k)
    group = case.hq // case.hk

    # The forward's O and LSE per sequence (float64, then the inputs' dtype / fp32), and the references.
    refs = []
    for b, (sq, sk) in enumerate(zip(case.lens_q, case.lens_k)):
        q0, k0 = int(cu_q[b]), int(cu_k[b])
        if sq == 0:
            refs.append(None)
            continue
        if sk == 0:  # no keys: O = 0, LSE = +inf, dQ = 0 exactly (and no dK/dV rows)
            o[q0:q0 + sq] = 0
            lse[:, q0:q0 + sq] = float("inf")
            refs.append((q0, k0, sq, sk, None, None))
            continue
        qs, ks, vs, dos = (packed.sequence(t, s0, n) for t, s0, n in ((q, q0, sq), (k, k0, sk), (v, k0, sk),
                                                                        (do, q0, sq)))
        vis = check_bwd.visible_mask(sq, sk, *window, device)
        o64, lse64, dq64, dk64, dv64 = check_bwd.reference(qs, ks, vs, dos, vis, sm_scale, group)
        o[q0:q0 + sq] = o64[0].permute(1, 0, 2).to(dt)
        lse[:, q0:q0 + sq] = lse64[0].float()
        naive = check_bwd.reference(qs, ks, vs, dos, vis, sm_scale, group, dtype64=dt)
        refs.append((q0, k0, sq, sk, (dq64, dk64, dv64), naive[2:]))

    bwd = PackedBwd(q, k, v, o, do, lse, cu_q, cu_k, max_q, max_k, sm_scale, window,
                    0 if case.gluon_dq else case.compute_dq,
                    check_bwd.gluon_dq_config(case.d) if case.gluon_dq else None)
    bwd.poison()
    bwd.run()
    torch.cuda.synchronize()

    ok, notes, worst = True, [], 0.0
    names = ("dq", "dk", "dv") if case.compute_dq or case.gluon_dq else ("dk", "dv")
    got = {"dq": bwd.dq, "dk": bwd.dk, "dv": bwd.dv}
    for b, r in enumerate(refs):
        if r is None:
            # No queries: the sequence's keys get dK = dV = 0 exactly.
            k0, sk = int(cu_k[b]), case.lens_k[b]
            for n in ("dk", "dv"):
                if sk and not torch.equal(got[n][k0:k0 + sk], torch.zeros_like(got[n][k0:k0 + sk])):
                    ok = False
                    notes.append(f"seq{b} {n} not 0 (no queries)")
            continue
        q0, k0, sq, sk, ref64, naive = r
        if ref64 is None:
            if "dq" in names and not torch.equal(got["dq"][q0:q0 + sq], torch.zeros_like(got["dq"][q0:q0 + sq])):
                ok = False
                notes.append(f"seq{b} dq not 0 (no keys)")
            continue
        for n in names:
            i = ("dq", "dk", "dv").index(n)
            start, length = (q0, sq) if n == "dq" else (k0, sk)
            if length == 0:
                continue
            mine = packed.sequence(got[n], start, length).double()
            if torch.isnan(mine).any().item():
                ok = False
                notes.append(f"seq{b} NaN in {n}")
                continue
            err = check_bwd.max_err(mine, ref64[i])
            bound = 3 * check_bwd.max_err(naive[i].double(), ref64[i]) + 1e-3
            worst = max(worst, err / bound)
            if err > bound:
                ok = False
                notes.append(f"seq{b} {n} {err:.2e} > {bound:.2e}")
        delta_ref = (packed.sequence(do, q0, sq).double() * packed.sequence(o, q0, sq).double()).sum(-1)[0]
        delta_err = (bwd.delta[:, q0:q0 + sq].double() - delta_ref).abs().max().item()
        if not delta_err <= 1e-3:
            ok = False
            notes.append(f"seq{b} delta {delta_err:.2e}")
    for name, (store, _) in list(stores.items()) + [("o", (o_store, o))] + list(zip(("dq", "dk", "dv"), bwd.outs)):
        if not packed.guards_intact(store):
            ok = False
            notes.append(f"{name} guard rows touched")
    if not (torch.isnan(bwd.delta_store[:, :packed.GUARD]).all() and torch.isnan(bwd.delta_store[:, -packed.GUARD:]).all()):
        ok = False
        notes.append("delta guard written")
    if int(bwd.status.sum()) != 0:
        ok = False
        notes.append(f"status {bwd.status.tolist()}")
    line = f"{'PASS' if ok else 'FAIL'} {case.name()}: worst err/bound {worst:.2f}" + (
        "" if not notes else " " + "; ".join(notes))
    return ok, line


def main():
    return packed.check_main(__file__, __doc__, "check_bwd_varlen", Case, cases, consan_cases, run_case)


if __name__ == "__main__":
    sys.exit(main())
