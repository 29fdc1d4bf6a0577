"""GPU check of the Gluon (sm_90) attention backward: the three launches of ``ABI.md`` through the JIT.

usage: python test/gluon/check_bwd.py [--quick] [--consan] [--bench [--compute-dq 0]] [--bench-gqa]
       [--only SUBSTRING] [--buckets 64,128,256] [--variant NAME]
       [--gluon-dq [BLOCK_N:K_STAGES:V_STAGES] | --portable-dq]

Needs an sm_90 GPU, torch and triton 3.6.0; no network.  The kernels run exactly as the runtime
launches them: ``attn_bwd_gluon_preprocess`` -> ``attn_bwd_gluon`` -> ``attn_bwd_gluon_dq_convert``,
host rank-4 TMA descriptors on the 4-D tensors (``TensorDescriptor.from_tensor``, the real head
dim, the bucket as the box) and rank-2 descriptors on views of one fp32 workspace
(``dq_acc | lse2 | delta2``).

Correctness: LSE from a float64 reference forward (cast to fp32, +inf on rows that see no key)
and O from that reference; dQ, dK, dV against float64 autograd of the same masked attention.
Bound per tensor: ``max|out - ref64| <= 3 * max|naive - ref64| + 1e-3`` where ``naive`` is the
same math in the input dtype (torch autograd on fp16/bf16 tensors).  Outputs, DELTA and the whole
workspace are poisoned with NaN first (the preprocess must zero ``dq_acc``).  COMPUTE_DQ=0 is
checked on dK/dV only (dQ then comes from the portable kernel), unless ``--gluon-dq``: every case
then runs the main kernel with COMPUTE_DQ=0 and dQ from ``attn_bwd_gluon_dq`` (``bwd_dq.py``, after the
main kernel; its config per head dim ``rules.GLUON_DQ_CONFIGS`` or the one given), and dQ is checked
too; with ``--bench`` that pair is timed, and beside it in the same process the pair the library runs
today: the main kernel without dQ, then the portable ``attn_bwd_dq`` through the JIT (the fastest of
the configs ``tuning/sm_90.json`` picks among for that head dim).  Then a stability check:
100 launches of one case give bitwise identical dK/dV, and each dQ element within one rounding
step of its dtype (plus 1e-5 x max|dQ| of fp32 reordering noise) of the first launch's: dQ's
fp32 reduce-adds land in a run-dependent order (with WALK 1 the CTAs of one GQA group add into
the same rows together), so an element on a rounding boundary may round either way.

``--consan``: a few shapes per head dim (of ``--buckets``) again under Gluon's concurrency sanitizer
(``triton.knobs.compilation.instrumentation_mode = "consan"``, global scratch through
``triton.set_allocator``), each in its own subprocess (a sanitizer trap kills the CUDA context).
``--bench``: bf16 TFLOP/s (2.5 * 4 * B * H * S^2 * D, halved for causal; preprocess and convert
included) vs torch SDPA's cuDNN backward. ``--bench-gqa``: the same for the GQA rows (``GQA_ROWS``);
with ``--head-split N[,M..]`` also each ``HEAD_SPLIT`` N (a group's query heads over N CTAs per key block,
the dK/dV partials' conversion timed with the kernels).
``--variant NAME``: the correctness list (persistent variants: each case at the full grid and with the
grid capped at 1 and 3 CTAs) (and the stability check, and ``--bench``) on one entry of
``VARIANTS`` (performance constexprs of ``attn_bwd_gluon``); cases of a head dim the variant does not
serve are skipped.  A case that sets ``stages`` keeps it (the variant's other options apply).
"""
import argparse
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

from kernels.flash_gluon.bwd import attn_bwd_gluon  # noqa: E402
from kernels.flash_gluon.bwd_dq import attn_bwd_gluon_dq  # noqa: E402
from kernels.flash_gluon.bwd_dq_convert import attn_bwd_gluon_dq_convert  # noqa: E402
from kernels.flash_gluon.bwd_dkdv_convert import attn_bwd_gluon_dkdv_convert  # noqa: E402
from kernels.flash_gluon.bwd_preprocess import attn_bwd_gluon_preprocess  # noqa: E402
from kernels.flash.bwd_dq import attn_bwd_dq as _attn_bwd_dq_jit  # noqa: E402
import rules  # noqa: E402


# The portable dQ re-jitted to specialize no integer its AOT image leaves free (``ALIGN_BOTTOM_RIGHT`` 1
# as a constexpr would not even compile: ``mask.diag_offset`` takes a runtime value).
attn_bwd_dq = triton.jit(do_not_specialize=rules.jit_free_integers(rules.ATTN_BWD_DQ))(_attn_bwd_dq_jit.fn)


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))

BLOCK_M = 64  # main kernel: queries per step
#: Keys per CTA per head-dim bucket: two compute warpgroups of 64 keys, or at hd256 (bwd_wide.py) 64
#: keys with the head dim split between the warpgroups.
BLOCK_N = {64: 128, 128: 128, 256: 64}
MAXNREG = 168  # 65536 / 384 threads
#: Ring depth per head-dim bucket of the "default" variant: the shipped depth (python/rules.py; hd128
#: STAGES 3 would take 231504 B of shared memory and spills more).
STAGES = {64: 2, 128: 2, 256: 1}
#: Performance variants of attn_bwd_gluon (the constexprs after COMPUTE_DQ, see bwd.py):
#: name -> (head dims it applies to, STAGES, MASK_MODE, CONS_REGS, DK_SS).  "default" = the kernel's
#: defaults with the recommended STAGES above.  All are fully general (same inputs, same results up to
#: fp32 summation order); ``--variant NAME`` runs the whole correctness list on one.
def _variant(st, mm, regs=240, ss=0, hds=(64, 128)):
    return (hds, st, mm, regs, ss)


#: "product" (the default) = the configs python/rules.py ships, read from it.
VARIANTS = {"default": _variant(None, 0, hds=(64, 128, 256)), "product": None}
for _st in (2, 3):
    for _mm in (0, 1, 2):
        for _regs in (240, 232):
            VARIANTS[f"s{_st}_m{_mm}_r{_regs}"] = _variant(_st, _mm, _regs)
    VARIANTS[f"s{_st}_m1_r240_ss"] = _variant(_st, 1, 240, 1)
    VARIANTS[f"s{_st}_m0_r232_ss"] = _variant(_st, 0, 232, 1)
for _mm in (0, 1, 2):
    VARIANTS[f"s4_m{_mm}_r240"] = _variant(4, _mm, 240, 0, hds=(64, ))  # hd128: over the shared-memory limit


#: Variants derived from another: name -> (base variant, extra options).  Extra constexprs of
#: attn_bwd_gluon (``PERSISTENT``: 1 head-major / 2 LPT persistent schedule, grid ``min(#tiles, #SMs)``
#: as ABI.md's rule for persistent kernels) and harness launch options (keys starting with "_"):
#: ``_aux_rows`` (rows per program of the preprocess / dQ convert, divides 128; default 4096 / HEAD_DIM)
#: and ``_aux_warps`` (their num_warps; default 4).  A persistent variant's correctness list runs every
#: case three times: the full grid, and the grid capped at 1 and at 3 CTAs (``PERSISTENT_CAPS``).
DERIVED = {
    "product_p1": ("product", {"PERSISTENT": 1}),
    "product_p2": ("product", {"PERSISTENT": 2}),
    "s2_m1_r240_p1": ("s2_m1_r240", {"PERSISTENT": 1}),
    "s2_m1_r240_p2": ("s2_m1_r240", {"PERSISTENT": 2}),
    "s2_m0_r232_p1": ("s2_m0_r232", {"PERSISTENT": 1}),
    "s2_m2_r240_p1": ("s2_m2_r240", {"PERSISTENT": 1}),
    "product_aux_w8": ("product", {"_aux_warps": 8}),
    "product_aux128_w8": ("product", {"_aux_rows": 128, "_aux_warps": 8}),
    "product_aux64_w8": ("product", {"_aux_rows": 64, "_aux_warps": 8}),
    "product_p1_aux_w8": ("product_p1", {"_aux_warps": 8}),
    "product_aux64_w4": ("product", {"_aux_rows": 64}),
    "product_aux16_w4": ("product", {"_aux_rows": 16}),
    "product_dps": ("product", {"DESC_PER_STEP": 1}),  # hd256 only (bwd.py)
    "product_w0": ("product", {"WALK": 0}),  # the head-major walk hd64 had before WALK 1 was measured
    "product_w2": ("product", {"WALK": 2}),
    "product_p1_w1": ("product_p1", {"WALK": 1}),
    "product_dqr": ("product", {"DQ_IN_RING": 1, "STAGES": 2}),  # hd256 only: dQ tile in the ring, 2 stages
    "product_dqr_dps": ("product", {"DQ_IN_RING": 1, "STAGES": 2, "DESC_PER_STEP": 1}),
    "product_dqr_w1": ("product", {"DQ_IN_RING": 1, "STAGES": 2, "WALK": 1}),
    "product_s1": ("product", {"STAGES": 1}),  # hd256 without dQ: the one-stage ring it had before 2 stages were measured
}
VARIANTS.update({name: None for name in DERIVED})
PERSISTENT_CAPS = (None, 1, 3)


def _product_config(hd, compute_dq=1):
    """The config python/rules.py ships for head-dim bucket ``hd`` (the kernels the library runs)."""
    (c, ) = rules._attn_bwd_gluon_configs("sm_90", {"head_dim": hd, "dq": bool(compute_dq)})
    return c["STAGES"], {k: c[k] for k in rules.GLUON_BWD_KNOBS}


def variant_kwargs(name, hd, compute_dq=1):
    """(stages or None, extra constexprs) of variant ``name`` at head-dim bucket ``hd``; None if it does not apply."""
    if name == "product":
        return _product_config(hd, compute_dq)
    if name in DERIVED:
        base, extra = DERIVED[name]
        if (extra.get("DESC_PER_STEP") or extra.get("DQ_IN_RING")) and hd <= 128:
            return None
        vk = variant_kwargs(base, hd, compute_dq)
        if vk is None:
            return None
        extra = dict(extra)
        return extra.pop("STAGES", vk[0]), {**vk[1], **extra}
    hds, st, mm, regs, ss = VARIANTS[name]
    if hd not in hds:
        return None
    return st, {"MASK_MODE": mm, "CONS_REGS": regs, "DK_SS": ss}


UNBOUNDED = 1 << 30
TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16, torch.float32: gl.float32}


def bucket(d):
    return 64 if d <= 64 else (128 if d <= 128 else 256)


def window_args(mask, sq, sk):
    """(WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT) of ``kernels/flash/mask.py`` for a mask name."""
    if mask == "none":
        return sq + sk, sq + sk, 0
    if mask == "causal_tl":
        return UNBOUNDED, 0, 0
    if mask == "causal_br":
        return UNBOUNDED, 0, 1
    kind, left, right, align = mask.split("_")  # "win_L_R_tl|br"
    return int(left), int(right), int(align == "br")


def visible_mask(sq, sk, wl, wr, abr, device):
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    d = i + ((sk - sq) if abr else 0)
    return (j >= d - wl) & (j <= d + wr)


# --------------------------------------------------------------------------------------------
# references
# --------------------------------------------------------------------------------------------
def attention(q, k, v, vis, sm_scale, group, keep=None, dropout_scale=1.0):
    """Masked attention in the tensors' dtype; rows with no visible key give O = 0 (no NaN).
    ``keep``: a dropout keep mask (bool, broadcast against the scores), kept probabilities scaled
    by ``dropout_scale``; the LSE is of the undropped scores."""
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * sm_scale
    s = s.masked_fill(~vis, float("-inf"))
    m = s.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    l = e.sum(-1, keepdim=True)
    p = e / torch.where(l > 0, l, torch.ones_like(l))
    if keep is not None:
        p = torch.where(keep, p * dropout_scale, torch.zeros_like(p))
    o = torch.matmul(p.to(v.dtype), v)
    lse = torch.where(l > 0, m + torch.log(torch.where(l > 0, l, torch.ones_like(l))),
                      torch.full_like(l, float("inf")))
    return o, lse.squeeze(-1)


def reference(q, k, v, do, vis, sm_scale, group, dtype64=torch.float64, keep=None, dropout_scale=1.0):
    qs, ks, vs = (t.detach().to(dtype64).requires_grad_() for t in (q, k, v))
    o, lse = attention(qs, ks, vs, vis, sm_scale, group, keep, dropout_scale)
    dq, dk, dv = torch.autograd.grad(o, (qs, ks, vs), do.to(dtype64))
    return o.detach(), lse.detach(), dq, dk, dv


# --------------------------------------------------------------------------------------------
# the three launches
# --------------------------------------------------------------------------------------------
_NO_OFFSETS = {}
#: The dropout group of a launch without dropout (DROPOUT_THRESHOLD .. philox_offset_base).
NO_DROPOUT = (0, 1.0, None, None, 0)


def not_packed(device):
    """The packing group of a fixed-length launch (``IS_VARLEN`` 0; check_bwd_varlen.py launches packed
    batches): the offsets pointer is never read, but the row kernels compile its load, so it is a real
    int32 tensor."""
    if device not in _NO_OFFSETS:
        _NO_OFFSETS[device] = torch.zeros(2, device=device, dtype=torch.int32)
    cu = _NO_OFFSETS[device]
    return {"q": (0, cu, 0, cu, 0), "qk": (0, cu, cu, 0, 0, cu, 0)}


def nvmma(block, dtype):
    return gl.NVMMASharedLayout.get_default_for(block, GL_DTYPES[dtype])


def desc4(t, rows, hd):
    block = [1, 1, rows, hd]
    return TensorDescriptor.from_tensor(t, block, nvmma(block, t.dtype))


class GluonBwd:
    """Workspace, descriptors and the three launches for one problem (descriptors built once)."""

    def __init__(self, q, k, v, o, do, lse, sm_scale, wl, wr, abr, stages=None, compute_dq=1, variant="default",
                 grid_cap=None, dropout=None, gluon_dq=None, portable_dq=None, head_split=1):
        """``dropout``: the dropout group ``(DROPOUT_THRESHOLD, dropout_scale, PHILOX_SEED, PHILOX_OFFSET,
        philox_offset_base)`` (seed and offset int64 tensors), None for none.  ``gluon_dq``: ``(BLOCK_N,
        K_STAGES, V_STAGES)`` of ``attn_bwd_gluon_dq``, launched after the main kernel for dQ (which then
        runs with ``compute_dq`` 0), or None.  ``portable_dq``: ``(BLOCK_M, BLOCK_N, num_warps, num_stages)``
        of the portable ``attn_bwd_dq`` in its place (what the runtime pairs with ``compute_dq`` 0 today).
        ``head_split``: the main kernel's ``HEAD_SPLIT`` (CTAs per key block, each walking one part of the GQA
        group's query heads into fp32 partials, summed by ``attn_bwd_gluon_dkdv_convert``)."""
        self.dropout = dropout
        B, hq, sq, d = q.shape
        hk, sk = k.shape[1], k.shape[2]
        self.hd = hd = bucket(d)
        vk = variant_kwargs(variant, hd, compute_dq)
        assert vk is not None, f"variant {variant} does not apply to head-dim bucket {hd}"
        self.variant, self.opts = variant, dict(vk[1])
        # preprocess / convert rows per program (divides 128; 4096 / hd is spill-free) and warps
        self.aux_m = self.opts.pop("_aux_rows", 4096 // hd)
        self.aux_warps = self.opts.pop("_aux_warps", 4)
        assert 128 % self.aux_m == 0, "aux rows per program must divide 128 (SQ_PAD)"
        # the main kernel's grid: (cdiv(Sk, 128), Hk, B), or persistent (min(#tiles, #SMs, grid_cap), 1, 1)
        self.block_n = block_n = BLOCK_N[hd]
        tiles = triton.cdiv(sk, block_n) * hk * B
        if self.opts.get("PERSISTENT", 0):
            sms = torch.cuda.get_device_properties(q.device).multi_processor_count
            self.grid = (max(1, min(tiles, sms, grid_cap or tiles)), 1, 1)
        else:
            self.grid = (triton.cdiv(sk, block_n), hk * head_split, B)
        assert head_split == 1 or not self.opts.get("PERSISTENT", 0), "a head split: PERSISTENT 0"
        self.head_split = head_split
        # [HEAD_SPLIT, 2, B, Hk, Sk, HEAD_DIM] fp32 (bwd_dkdv_convert.py); one element when unused
        self.partials = torch.empty(head_split * 2 * B * hk * sk * hd if head_split > 1 else 1, device=q.device,
                                    dtype=torch.float32)
        if not compute_dq:
            self.opts["DK_SS"] = 0  # DK_SS reads the shared dS^T tile, which exists with COMPUTE_DQ only
            self.opts.pop("DQ_IN_RING", None)  # no dQ tile to place
        self.stages = stages or vk[0] or STAGES[hd]
        self.compute_dq = compute_dq
        assert not ((gluon_dq or portable_dq) and compute_dq), "a dQ kernel pairs with the main kernel's COMPUTE_DQ 0"
        assert not (gluon_dq and portable_dq), "one dQ kernel"
        self.gluon_dq, self.portable_dq = gluon_dq, portable_dq
        self.shape = (B, hq, hk, sq, sk, d)
        self.sq_pad = sq_pad = triton.cdiv(sq, 128) * 128
        rows = B * hq * sq_pad
        self.ws = torch.empty(rows * (hd + 2), device=q.device, dtype=torch.float32)
        self.dq_acc = self.ws[:rows * hd].view(rows, hd)
        self.lse2 = self.ws[rows * hd:rows * (hd + 1)]
        self.delta2 = self.ws[rows * (hd + 1):]
        self.delta = torch.empty((B, hq, sq), device=q.device, dtype=torch.float32)
        self.dq, self.dk, self.dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self.q, self.k, self.v, self.o, self.do, self.lse = q, k, v, o, do, lse
        self.sm_scale, self.window = sm_scale, (wl, wr, abr)
        vec = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
        # dK/dV: one compute warpgroup's share (its 64 keys, or at hd256 its half of the columns)
        dkv_rows, dkv_cols = (block_n, hd // 2) if hd > 128 else (block_n // 2, hd)
        self.descs = (
            desc4(q, BLOCK_M, hd), desc4(k, block_n, hd), desc4(v, block_n, hd), desc4(do, BLOCK_M, hd),
            desc4(self.dk, dkv_rows, dkv_cols), desc4(self.dv, dkv_rows, dkv_cols),
            TensorDescriptor.from_tensor(self.dq_acc, [BLOCK_M, 8], vec),  # one column strip of the dQ tile
            TensorDescriptor.from_tensor(self.lse2.view(rows // 64, 64), [1, 64], vec),
            TensorDescriptor.from_tensor(self.delta2.view(rows // 64, 64), [1, 64], vec),
        )
        if gluon_dq:
            dq_bn = gluon_dq[0]
            self.dq_descs = (desc4(q, 64, hd), desc4(k, dq_bn, hd), desc4(v, dq_bn, hd), desc4(do, 64, hd),
                             desc4(self.dq, 64, hd))

    def poison(self):
        for t in (self.ws, self.delta, self.dq, self.dk, self.dv, self.partials):
            t.fill_(float("nan"))

    def preprocess(self):
        B, hq, hk, sq, sk, d = self.shape
        o, do, lse, delta = self.o, self.do, self.lse, self.delta
        attn_bwd_gluon_preprocess[(self.sq_pad // self.aux_m, hq, B)](
            o, do, o.stride(0), o.stride(1), o.stride(2), do.stride(0), do.stride(1), do.stride(2),
            lse, lse.stride(0), lse.stride(1), delta, delta.stride(0), delta.stride(1),
            self.lse2, self.delta2, self.dq_acc, sq, self.sq_pad, d, self.compute_dq, *not_packed(o.device)["q"],
            HEAD_DIM=self.hd, BLOCK_M=self.aux_m, num_warps=self.aux_warps)

    def main(self):
        B, hq, hk, sq, sk, d = self.shape
        wl, wr, abr = self.window
        attn_bwd_gluon[self.grid](
            *self.descs, self.sm_scale, sq, sk, self.sq_pad, hq, hq // hk, wl, wr, abr, *not_packed(self.q.device)["qk"],
            *(self.dropout or NO_DROPOUT), self.head_split, self.partials, HEAD_DIM=self.hd, BLOCK_M=BLOCK_M,
            BLOCK_N=self.block_n, STAGES=self.stages,
            COMPUTE_DQ=self.compute_dq, DROPOUT=int(self.dropout is not None), **self.opts, num_warps=4,
            maxnreg=MAXNREG)
        if self.gluon_dq:
            bn, ks, vs = self.gluon_dq
            attn_bwd_gluon_dq[(triton.cdiv(sq, 128), hq, B)](
                *self.dq_descs, self.lse2, self.delta2, self.sm_scale, sq, sk, self.sq_pad, hq // hk, wl, wr, abr,
                *not_packed(self.q.device)["qk"], *(self.dropout or NO_DROPOUT), HEAD_DIM=self.hd, BLOCK_M=128,
                BLOCK_N=bn, K_STAGES=ks, V_STAGES=vs, DROPOUT=int(self.dropout is not None), num_warps=4,
                maxnreg=MAXNREG)
        if self.portable_dq:
            self.run_portable_dq(*self.portable_dq)

    def run_portable_dq(self, block_m, block_n, warps, stages):
        """The portable ``attn_bwd_dq`` (kernels/flash/bwd_dq.py) into ``self.dq``: reads the caller's DELTA,
        which the preprocess wrote."""
        B, hq, hk, sq, sk, d = self.shape
        wl, wr, abr = self.window
        q, k, v, do, dq, lse, delta = self.q, self.k, self.v, self.do, self.dq, self.lse, self.delta
        st = lambda x: (x.stride(0), x.stride(1), x.stride(2))  # noqa: E731
        attn_bwd_dq[(triton.cdiv(sq, block_m), hq, B)](
            q, k, v, do, lse, delta, dq, q, lse, self.sm_scale, 0.0, *st(q), *st(k), *st(v), *st(do),
            lse.stride(0), lse.stride(1), delta.stride(0), delta.stride(1), *st(dq), 0, 0, 0, 0,
            sq, sk, d, hq // hk, wl, wr, abr, *not_packed(q.device)["qk"], *(self.dropout or NO_DROPOUT), d,
            HEAD_DIM=self.hd, BLOCK_M=block_m, BLOCK_N=block_n, DROPOUT=int(self.dropout is not None), HAS_BIAS=0,
            ALLOW_TF32=0, SOFTCAP=0, HAS_ALIBI=0, HEAD_DIM_V=0, num_warps=warps, num_stages=stages)

    def convert(self):
        B, hq, hk, sq, sk, d = self.shape
        if self.compute_dq:
            dq = self.dq
            attn_bwd_gluon_dq_convert[(triton.cdiv(sq, self.aux_m), hq, B)](
                self.dq_acc, dq, dq.stride(0), dq.stride(1), dq.stride(2), self.sm_scale, sq, self.sq_pad, d, hq,
                *not_packed(dq.device)["q"], HEAD_DIM=self.hd, BLOCK_M=self.aux_m, num_warps=self.aux_warps)
        if self.head_split > 1:
            dk, dv = self.dk, self.dv
            attn_bwd_gluon_dkdv_convert[(triton.cdiv(sk, self.aux_m), hk, B)](
                self.partials, dk, dv, dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1),
                dv.stride(2), sk, d, self.head_split, HEAD_DIM=self.hd, BLOCK_N=self.aux_m, num_warps=self.aux_warps)

    def run_aux(self):
        """The preprocess and convert launches alone (their share of the backward's time)."""
        self.preprocess()
        self.convert()

    def run(self):
        self.preprocess()
        self.main()
        self.convert()
        return self.dq, self.dk, self.dv


# --------------------------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------------------------
def make_problem(dtype, B, hq, hk, sq, sk, d, mask, layout="bhsd", seed=0):
    torch.manual_seed(seed)
    dt = TORCH_DTYPES[dtype]

    def rnd(h, s):
        if layout == "bshd":  # a non-contiguous [B, H, S, D] view of a [B, S, H, D] tensor
            return torch.randn((B, s, h, d), device="cuda", dtype=dt).transpose(1, 2)
        return torch.randn((B, h, s, d), device="cuda", dtype=dt)

    q, k, v, do = rnd(hq, sq), rnd(hk, sk), rnd(hk, sk), rnd(hq, sq)
    wl, wr, abr = window_args(mask, sq, sk)
    vis = visible_mask(sq, sk, wl, wr, abr, "cuda")
    sm_scale = 1.0 / math.sqrt(d)
    group = hq // hk
    o64, lse64, dq64, dk64, dv64 = reference(q, k, v, do, vis, sm_scale, group)
    _, _, dqn, dkn, dvn = reference(q, k, v, do, vis, sm_scale, group, dtype64=dt)  # naive, input dtype
    if layout == "bshd":
        o = torch.empty((B, sq, hq, d), device="cuda", dtype=dt).transpose(1, 2)
        o.copy_(o64)
    else:
        o = o64.to(dt).contiguous()
    lse = lse64.float().contiguous()
    return dict(q=q, k=k, v=v, o=o, do=do, lse=lse, sm_scale=sm_scale, window=(wl, wr, abr),
                ref=(dq64, dk64, dv64), naive=(dqn, dkn, dvn))


def cases(quick=False):
    out = []
    add = lambda *a, **kw: out.append((a, kw))  # noqa: E731
    # (dtype, B, Hq, Hk, Sq, Sk, D, mask)
    for dt in ("fp16", "bf16"):
        for d in (64, 128, 256):
            add(dt, 2, 2, 2, 128, 128, d, "none")
            add(dt, 1, 4, 1, 1000, 1000, d, "causal_tl")             # MQA
            add(dt, 1, 4, 2, 129, 1000, d, "causal_br")              # GQA 2, Sq < Sk
            add(dt, 2, 4, 1, 1000, 129, d, "causal_br")              # MQA, Sq > Sk: rows with no key
            add(dt, 1, 2, 2, 2048, 2048, d, "none")
            add(dt, 1, 8, 2, 127, 17, d, "win_16_0_tl")              # GQA 4
            add(dt, 1, 2, 2, 1000, 2048, d, "win_64_32_br")
            add(dt, 1, 2, 2, 1, 1, d, "none")
            add(dt, 1, 2, 1, 17, 1000, d, "win_0_0_tl")
            add(dt, 1, 2, 2, 1000, 1000, d, "causal_tl", layout="bshd")
            add(dt, 1, 4, 1, 1000, 17, d, "win_64_32_tl", compute_dq=0)
            add(dt, 1, 2, 2, 1000, 1000, d, "causal_tl", compute_dq=0)
            if d <= 128:
                add(dt, 1, 2, 2, 129, 127, d, "none", stages=5 - STAGES[d])  # the other ring depth
            # head split (HEAD_SPLIT CTAs per key block, fp32 partials summed by attn_bwd_gluon_dkdv_convert)
            add(dt, 1, 8, 2, 1000, 1000, d, "causal_tl", head_split=2)         # GQA 4: 2 + 2 heads
            add(dt, 2, 7, 1, 129, 1000, d, "causal_br", head_split=2)          # GQA 7: 4 + 3, Sq < Sk
            add(dt, 1, 6, 2, 1000, 17, d, "win_64_32_tl", head_split=3, compute_dq=0)  # one head each
            add(dt, 1, 4, 2, 300, 333, d, "none", head_split=4)                # parts 2, 3 walk no head
            add(dt, 1, 8, 1, 1000, 1000, d, "causal_br", layout="bshd", head_split=8)
        for d in (40, 72, 96, 136, 200):  # padded head dims: the descriptors cover the real D
            add(dt, 1, 2, 2, 128, 129, d, "none")
            add(dt, 1, 4, 1, 1000, 1000, d, "causal_br")
            add(dt, 1, 4, 2, 129, 17, d, "win_16_0_br")
            add(dt, 1, 2, 2, 17, 1000, d, "win_64_32_tl", layout="bshd")
            add(dt, 1, 2, 2, 2048, 1000, d, "win_0_0_br")
            add(dt, 1, 2, 2, 1000, 127, d, "causal_br", compute_dq=0)
    if quick:
        out = out[::4]
    return out


def case_name(a, kw):
    dt, B, hq, hk, sq, sk, d, mask = a
    extra = "".join(f" {k}={v}" for k, v in kw.items())
    return f"{dt} B{B} Hq{hq} Hk{hk} Sq{sq} Sk{sk} D{d} {mask}{extra}"


def max_err(x, ref):
    return float((x.double() - ref).abs().nan_to_num(float("inf")).max()) if x.numel() else 0.0


def gluon_dq_config(d, given=None):
    """``--gluon-dq``'s ``(BLOCK_N, K_STAGES, V_STAGES)`` for head dim ``d``: ``given`` ("64:2:1") or
    ``rules.GLUON_DQ_CONFIGS``."""
    return tuple(int(x) for x in given.split(":")) if given else rules.GLUON_DQ_CONFIGS[bucket(d)]


def check_case(a, kw, variant="default", problem=None, grid_cap=None, gluon_dq=None, portable_dq=None):
    """``gluon_dq`` / ``portable_dq``: dQ from ``attn_bwd_gluon_dq`` / the portable ``attn_bwd_dq`` with this
    config (the main kernel without dQ)."""
    dt, B, hq, hk, sq, sk, d, mask = a
    layout = kw.get("layout", "bhsd")
    p = problem or make_problem(dt, B, hq, hk, sq, sk, d, mask, layout)
    compute_dq = 0 if gluon_dq or portable_dq else kw.get("compute_dq", 1)
    bwd = GluonBwd(p["q"], p["k"], p["v"], p["o"], p["do"], p["lse"], p["sm_scale"], *p["window"],
                   stages=kw.get("stages"), compute_dq=compute_dq, variant=variant, grid_cap=grid_cap,
                   gluon_dq=gluon_dq, portable_dq=portable_dq, head_split=kw.get("head_split", 1))
    bwd.poison()
    outs = bwd.run()
    torch.cuda.synchronize()
    names = ("dq", "dk", "dv") if bwd.compute_dq or bwd.gluon_dq or bwd.portable_dq else ("dk", "dv")
    ok, parts = True, []
    for n, x, r, nv in zip(("dq", "dk", "dv"), outs, p["ref"], p["naive"]):
        if n not in names:
            continue
        err, bound = max_err(x, r), 3 * max_err(nv, r) + 1e-3
        good = err <= bound  # NaN / inf -> err = inf -> fails
        ok &= good
        parts.append(f"{n} {err:.2e}/{bound:.2e}{'' if good else ' FAIL'}")
    # the caller's DELTA (read by the portable dQ kernel in deterministic mode)
    delta_ref = (p["do"].double() * p["o"].double()).sum(-1)
    derr = max_err(bwd.delta, delta_ref)
    dgood = derr <= 1e-3 * max(1.0, float(delta_ref.abs().max()))
    ok &= dgood
    parts.append(f"delta {derr:.1e}{'' if dgood else ' FAIL'}")
    return ok, "  ".join(parts)


def stability(n=100, variant="default", gluon_dq=None, head_split=1):
    """``gluon_dq``: (a config of) ``attn_bwd_gluon_dq``, which writes each dQ element once: then dQ
    must be bitwise identical too.  ``head_split``: dK/dV summed from that many partials (still bitwise)."""
    # the first head dim (128, 64, 256) the variant applies to
    d = next(d for d in (128, 64, 256) if variant_kwargs(variant, bucket(d)) is not None)
    a = ("bf16", 1, 4, 1, 1000, 1000, d, "causal_tl")
    p = make_problem(*a)
    dq_cfg = gluon_dq_config(d, gluon_dq or None) if gluon_dq is not None else None
    bwd = GluonBwd(p["q"], p["k"], p["v"], p["o"], p["do"], p["lse"], p["sm_scale"], *p["window"], variant=variant,
                   compute_dq=0 if dq_cfg else 1, gluon_dq=dq_cfg, head_split=head_split)
    dq0, dk0, dv0 = (t.clone() for t in bwd.run())
    scale = float(dq0.float().abs().max())
    eps = torch.finfo(dq0.dtype).eps
    worst, worst_ulps, same = 0.0, 0.0, True
    for _ in range(n):
        bwd.poison()
        dq, dk, dv = bwd.run()
        same &= bool(torch.equal(dk, dk0) and torch.equal(dv, dv0))
        diff = (dq.float() - dq0.float()).abs().nan_to_num(float("inf"))
        worst = max(worst, float(diff.max()) / scale)
        # dQ's fp32 reduce-adds land in a run-dependent order, so an element that sits on a rounding
        # boundary of dQ's dtype may round either way: one unit in the last place of the larger of
        # the two values, plus fp32 reordering noise for elements that cancel to near zero.
        m = torch.maximum(dq.float().abs(), dq0.float().abs())
        ulp = eps * torch.exp2(torch.floor(torch.log2(m.clamp_min(1e-30))))
        # (a NaN left in dQ makes the ratio NaN: counted as infinitely far)
        worst_ulps = max(worst_ulps, float((diff / (ulp + 1e-5 * scale)).nan_to_num(float("inf")).max()))
    ok = same and (worst == 0.0 if dq_cfg else worst_ulps <= 1.0)
    limit = "0: attn_bwd_gluon_dq writes it once" if dq_cfg else "at most 1"
    kw = {"head_split": head_split} if head_split > 1 else {}
    print(f"{'PASS' if ok else 'FAIL'} stability x{n} ({case_name(a, kw)}{f' gluon dq {dq_cfg}' if dq_cfg else ''}): "
          f"dK/dV bitwise {'identical' if same else 'DIFFER'}, dQ max rel diff {worst:.1e} ({worst_ulps:.2f} of one "
          f"rounding step, {limit})", flush=True)
    return ok


# --------------------------------------------------------------------------------------------
# consan
# --------------------------------------------------------------------------------------------
# One process per shipped kernel shape family (head dim x dQ mode), each covering ragged tails, GQA
# and a mask with boundary and interior steps.
CONSAN_CASES = [(a, {}) for d in (64, 128, 256) for a in (
    ("bf16", 1, 8, 2, 300, 333, d, "causal_br"),
    ("fp16", 1, 4, 1, 129, 200, d, "win_64_32_br"),
)] + [(("bf16", 1, 4, 2, 200, 257, d, "none"), {"compute_dq": 0}) for d in (64, 128, 256)] + [
    # dQ from attn_bwd_gluon_dq (rules.GLUON_DQ_CONFIGS) after the main kernel without dQ
    (("bf16", 1, 8, 2, 300, 333, d, "causal_br"), {"gluon_dq": 1}) for d in (64, 128, 256)] + [
    # a head split (the partials' epilogue instead of the TMA stores)
    (("bf16", 1, 8, 2, 300, 333, d, "causal_br"), {"head_split": 2}) for d in (64, 128, 256)]


def consan_child(idx):
    triton.knobs.compilation.instrumentation_mode = "consan"
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    a, kw = CONSAN_CASES[idx]
    kw = dict(kw)
    dq_cfg = gluon_dq_config(a[6]) if kw.pop("gluon_dq", 0) else None
    ok, msg = check_case(a, kw, variant="product", gluon_dq=dq_cfg)
    print(f"consan-child {'PASS' if ok else 'FAIL'}: {msg}", flush=True)
    return 0 if ok else 3


def consan(buckets=(64, 128, 256), only=None):
    """Every case (of the head-dim ``buckets``; with ``only``, those whose name contains it) in its own
    process (a sanitizer trap kills the CUDA context), all at once: the instrumented compiles dominate
    and run in parallel."""
    t0 = time.time()
    picked = [i for i, (a, kw) in enumerate(CONSAN_CASES)
              if bucket(a[6]) in buckets and (not only or only in case_name(a, kw))]
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--consan-child", str(i)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in picked]
    flagged = 0
    for (a, kw), p in zip([CONSAN_CASES[i] for i in picked], procs):
        try:
            text = p.communicate(timeout=max(1.0, 500 - (time.time() - t0)))[0].strip()
        except subprocess.TimeoutExpired:
            p.kill()
            text = "timed out"
        clean = p.returncode == 0
        flagged += not clean
        tail = " | ".join(text.splitlines()[-6:])[:1200]
        print(f"{'CLEAN  ' if clean else 'FLAGGED'} consan {case_name(a, kw)} ({time.time() - t0:.0f}s): {tail}",
              flush=True)
    print(f"consan: {len(picked) - flagged} clean, {flagged} flagged or failed")
    return flagged == 0


# --------------------------------------------------------------------------------------------
# bench
# --------------------------------------------------------------------------------------------
def fa3_cell(d, s, causal, dtype=torch.bfloat16):
    """One cell of the FlashAttention-3 grid: B*S = 16k, H*D = 2048 (``bench_cell``)."""
    return bench_cell(max(1, 16384 // s), 2048 // d, 2048 // d, s, d, causal, dtype)


def bench_cell(b, hq, hk, s, d, causal, dtype=torch.bfloat16, dropout_p=0.0):
    """Q, K, V, dO, O and LSE (torch's flash forward, K/V expanded to Hq heads) of one (B, Hq, Hk,
    S, D) problem (seed 0), the backward's FLOPs (2.5 * 4 * B * Hq * S^2 * D, halved when causal),
    the window arguments, and ``cudnn``: torch SDPA's cuDNN backward of the same problem (fresh
    gradients per call; with ``dropout_p``, its dropout backward). GQA: with ``enable_gqa`` where
    torch's cuDNN backend takes it, else on K/V expanded to Hq heads (autograd then sums dK/dV over
    each group: cuDNN's head reduce)."""
    from types import SimpleNamespace

    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    torch.manual_seed(0)
    q, do = (torch.randn((b, hq, s, d), device="cuda", dtype=dtype) for _ in range(2))
    k, v = (torch.randn((b, hk, s, d), device="cuda", dtype=dtype) for _ in range(2))
    group = hq // hk
    expand = (lambda t: t.repeat_interleave(group, dim=1)) if group > 1 else (lambda t: t)
    fw = torch.ops.aten._scaled_dot_product_flash_attention(q, expand(k), expand(v), 0.0, causal, False, scale=d**-0.5)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    cudnn_gqa = "cudnn"
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        try:
            out = F.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=group > 1, dropout_p=dropout_p)
        except RuntimeError:
            out = F.scaled_dot_product_attention(leaves[0], expand(leaves[1]), expand(leaves[2]), is_causal=causal,
                                                 dropout_p=dropout_p)
            cudnn_gqa = "cudnn (K/V expanded)"

    def cudnn():
        for t in leaves:
            t.grad = None
        out.backward(do, retain_graph=True)

    return SimpleNamespace(b=b, h=hq, q=q, k=k, v=v, do=do, o=fw[0].contiguous(),
                           lse=fw[1][..., :s].contiguous().float(), flops=2.5 * 4 * b * hq * s * s * d / (2 if causal else 1),
                           window=window_args("causal_tl" if causal else "none", s, s), cudnn=cudnn, cudnn_name=cudnn_gqa)


#: GQA rows of the training-speed issue: (Hq, Hk) at hd128, causal, S 2k-16k with B*S = 16k tokens.
GQA_ROWS = ((28, 4), (32, 8), (64, 8))


def _time_cell(c, d, variant, compute_dq=1, gluon_dq=None, portable_dq=None, head_split=1):
    """Our launches (with ``gluon_dq`` or ``portable_dq``: a dQ kernel after the main one) and cuDNN's
    backward on one bench cell: ``(GluonBwd, ours TFLOP/s, cuDNN TFLOP/s, ours ms, cuDNN ms)``
    (``do_bench`` medians)."""
    from triton.testing import do_bench
    bwd = GluonBwd(c.q, c.k, c.v, c.o, c.do, c.lse, d**-0.5, *c.window, variant=variant,
                   compute_dq=0 if gluon_dq or portable_dq else compute_dq, gluon_dq=gluon_dq,
                   portable_dq=portable_dq, head_split=head_split)
    t_ours = do_bench(bwd.run, warmup=25, rep=100, return_mode="median")
    t_cudnn = do_bench(c.cudnn, warmup=25, rep=100, return_mode="median")
    return bwd, c.flops / t_ours * 1e-9, c.flops / t_cudnn * 1e-9, t_ours, t_cudnn


def tuned_portable_dq_configs(d, dtype="bf16"):
    """``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` of every ``attn_bwd_dq`` config that tuning/sm_90.json
    picks for head dim ``d`` (no dropout, no bias): what the runtime's dQ kernel is chosen among."""
    import json
    import re
    with open(os.path.join(HERE, "..", "..", "tuning", "sm_90.json")) as f:
        entries = json.load(f)["entries"]
    tags = {e["winner"] for e in entries if e["family"] == "attn_bwd_dq" and e["functional"]["head_dim"] == d
            and e["functional"]["dtype"] == dtype and not e["functional"]["dropout"] and not e["functional"]["bias"]}
    return sorted(tuple(int(x) for x in re.fullmatch(r"m(\d+)n(\d+)w(\d+)s(\d+)", tag).groups()) for tag in tags)


def bench(variant="default", buckets=(64, 128, 256), compute_dq=1, gluon_dq=False, gluon_dq_given=None):
    """``gluon_dq``: dQ from ``attn_bwd_gluon_dq`` (``gluon_dq_config``), timed with the rest."""
    what = ("preprocess + main without dQ + attn_bwd_gluon_dq; 'portable dq': the same with the portable "
            "attn_bwd_dq instead (the fastest of its tuned configs)" if gluon_dq else "preprocess + convert"
            + ("" if compute_dq else "; ours WITHOUT dQ (COMPUTE_DQ 0: the deterministic mode's dK/dV kernel), so "
               "the ratio only compares variants"))
    print("bench: bf16, B*S = 16k, H*D = 2048; TFLOP/s = 2.5*4*B*H*S^2*D (/2 causal); ours includes " + what)
    if gluon_dq:
        compute_dq = 0
    for d in buckets:
        if variant_kwargs(variant, d, compute_dq) is None:
            continue
        dq_cfg = gluon_dq_config(d, gluon_dq_given) if gluon_dq else None
        ratios, portable_ratios = [], []
        for s in (1024, 2048, 4096, 8192, 16384):
            for causal in (False, True):
                c = fa3_cell(d, s, causal)
                bwd, ours, ref, _, _ = _time_cell(c, d, variant, compute_dq, dq_cfg)
                portable = ""
                if dq_cfg:  # the pair the library runs today, in the same process
                    best = max((_time_cell(c, d, variant, 0, None, pc)[1], pc) for pc in tuned_portable_dq_configs(d))
                    portable = f"  portable dq {best[0]:6.1f} (ratio {best[0] / ref:.3f}, {best[1]})"
                    portable_ratios.append(best[0] / ref)
                ratios.append(ours / ref)
                print(f"hd{d} S{s:5d} B{c.b:2d} H{c.h} {'causal' if causal else 'full  '}: gluon {ours:6.1f}  "
                      f"cudnn {ref:6.1f}  ratio {ours / ref:.3f}{portable}  ({bwd.variant}: stages {bwd.stages} "
                      f"{bwd.opts}{f' gluon dq {dq_cfg}' if dq_cfg else ''})", flush=True)
                del bwd, c
        print(f"check_bwd bench hd{d}: /cuDNN geomean {geomean(ratios):.3f}, worst {min(ratios):.3f}"
              + (f"; with the portable dQ {geomean(portable_ratios):.3f}, worst {min(portable_ratios):.3f}"
                 if portable_ratios else ""), flush=True)


def bench_gqa(variant="default", seqs=(2048, 4096, 8192, 16384), head_splits=()):
    """``head_splits``: each of these (> 1, at most the row's group) is timed as well: ``HEAD_SPLIT`` CTAs per
    key block, each walking one part of the group's query heads, + attn_bwd_gluon_dkdv_convert (the split's dK/dV
    checked against the unsplit run's: a timing of wrong work proves nothing)."""
    print("bench GQA: bf16 hd128 causal, B*S = 16k; TFLOP/s = 2.5*4*B*Hq*S^2*D/2; ours includes preprocess + convert"
          + ("; 'split N': HEAD_SPLIT N, + the dK/dV partials' conversion" if head_splits else ""))
    ratios, best_ratios = [], []
    for hq, hk in GQA_ROWS:
        for s in seqs:
            c = bench_cell(max(1, 16384 // s), hq, hk, s, 128, True)
            bwd, ours, ref, t_ours, t_cudnn = _time_cell(c, 128, variant)
            ratios.append(ours / ref)
            best, split = ours / ref, ""
            for n in (n for n in head_splits if 1 < n <= hq // hk):
                sb, ours_n, _, t_n, _ = _time_cell(c, 128, variant, head_split=n)
                for name, got, want in (("dK", sb.dk, bwd.dk), ("dV", sb.dv, bwd.dv)):
                    err = (got.float() - want.float()).abs().max().item() / max(want.float().abs().max().item(), 1e-6)
                    assert err < 2e-2, f"head split {n}: {name} off by {err:.2e} of max |{name}|"
                best = max(best, ours_n / ref)
                split += f"  split {n} {ours_n:6.1f} ({t_n:.3f} ms) {ours_n / ref:.3f}"
                del sb
            best_ratios.append(best)
            print(f"GQA {hq}/{hk} S{s:5d} B{c.b:2d}: gluon {ours:6.1f} ({t_ours:.3f} ms)  {c.cudnn_name} {ref:6.1f} "
                  f"({t_cudnn:.3f} ms)  ratio {ours / ref:.3f}{split}  ({bwd.variant}: grid {bwd.grid})", flush=True)
            del bwd, c
    print(f"check_bwd bench-gqa: /cuDNN geomean {geomean(ratios):.3f}, worst {min(ratios):.3f}"
          + (f"; best split per row geomean {geomean(best_ratios):.3f}, worst {min(best_ratios):.3f}"
             if head_splits else ""))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="every 4th case")
    ap.add_argument("--only", default=None, help="cases whose name contains this")
    ap.add_argument("--buckets", default="64,128,256", help="head-dim buckets whose cases run (comma-separated)")
    ap.add_argument("--consan", action="store_true")
    ap.add_argument("--consan-child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--bench-gqa", action="store_true", help="the GQA rows (GQA_ROWS) vs cuDNN")
    ap.add_argument("--head-split", default="",
                    help="--bench-gqa: also time HEAD_SPLIT N for each of these (comma-separated) up to the row's "
                         "group")
    ap.add_argument("--compute-dq", type=int, choices=(0, 1), default=1,
                    help="--bench: 0 times the kernel without dQ (the deterministic mode's dK/dV pass)")
    ap.add_argument("--gluon-dq", nargs="?", const="", default=None, metavar="BLOCK_N:K_STAGES:V_STAGES",
                    help="dQ from attn_bwd_gluon_dq (bwd_dq.py; config rules.GLUON_DQ_CONFIGS or the one given); "
                         "the main kernel without dQ")
    ap.add_argument("--portable-dq", action="store_true",
                    help="dQ from the portable attn_bwd_dq through the JIT (the first of its tuned configs), the main "
                         "kernel without dQ: checks the pair --bench --gluon-dq times beside the Gluon one")
    ap.add_argument("--variant", default="product", choices=sorted(VARIANTS),
                    help="performance variant of attn_bwd_gluon (VARIANTS; test/gluon/sweep_bwd.py times them)")
    args = ap.parse_args()
    if os.environ.get("TRITON_CACHE_DIR") is None:
        import tempfile
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="check-bwd-cache-")
    if args.consan_child is not None:
        return consan_child(args.consan_child)
    assert torch.cuda.get_device_capability() == (9, 0), "needs an sm_90 GPU"
    if args.bench_gqa:
        bench_gqa(args.variant, head_splits=[int(n) for n in args.head_split.split(",") if n])
        return 0
    if args.bench:
        bench(args.variant, [int(b) for b in args.buckets.split(",")], args.compute_dq, args.gluon_dq is not None,
              args.gluon_dq or None)
        return 0
    if args.consan:
        return 0 if consan([int(b) for b in args.buckets.split(",")], args.only) else 1
    t0 = time.time()
    passed = failed = 0
    for a, kw in cases(args.quick):
        name = case_name(a, kw)
        if (args.only and args.only not in name) or str(bucket(a[6])) not in args.buckets.split(","):
            continue
        if variant_kwargs(args.variant, bucket(a[6])) is None:
            print(f"SKIP {name}: variant {args.variant} is not for head dim {a[6]}", flush=True)
            continue
        persistent = variant_kwargs(args.variant, bucket(a[6]))[1].get("PERSISTENT", 0)
        if persistent and kw.get("head_split", 1) > 1:
            print(f"SKIP {name}: a head split runs the non-persistent kernel only", flush=True)
            continue
        problem = None
        for cap in (PERSISTENT_CAPS if persistent else (None, )):
            try:
                if problem is None:
                    problem = make_problem(*a, kw.get("layout", "bhsd"))
                dq_cfg = gluon_dq_config(a[6], args.gluon_dq or None) if args.gluon_dq is not None else None
                pdq = tuned_portable_dq_configs(bucket(a[6]))[0] if args.portable_dq else None
                ok, msg = check_case(a, kw, args.variant, problem=problem, grid_cap=cap, gluon_dq=dq_cfg,
                                     portable_dq=pdq)
            except Exception as e:  # noqa: BLE001 (report and go on)
                ok, msg = False, f"{type(e).__name__}: {' | '.join(str(e).strip().splitlines()[-4:])[:800]}"
            passed += ok
            failed += not ok
            print(f"{'PASS' if ok else 'FAIL'} {name}{'' if cap is None else f' grid<={cap}'}: {msg}", flush=True)
    if not args.only and not args.portable_dq:
        for split in (1, 2):
            ok = stability(variant=args.variant, gluon_dq=args.gluon_dq, head_split=split)
            passed += ok
            failed += not ok
    print(f"check_bwd: {passed} passed, {failed} failed ({time.time() - t0:.0f}s)")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
