"""Named configurations ("variants") of the Gluon forward ``attn_fwd_gluon`` for the tests.

Shared by ``check_fwd.py`` (``--variant NAME``), ``sweep_fwd.py`` (times them all against
cuDNN) and ``aot_fwd.py`` (``--variant NAME`` / ``--all-variants``: compiles them, reports
shared memory and spills).  No GPU or torch needed to import this module.

A variant maps each head-dim bucket (64, 128, 256) to a config dict or ``None`` (not
applicable: does not fit shared memory / registers).  A config holds every constexpr after
``STAGES`` in ``fwd.py`` plus the launch options:

    BLOCK_M        64 * NUM_CONSUMERS
    BLOCK_N        keys per K/V stage (power of two; hd256: 64)
    STAGES         K/V ring depth
    NUM_CONSUMERS  1 | 2 | 3 consumer warpgroups
    CONSUMER_REGS  setmaxnreg of the consumer worker warpgroups (multiple of 8, 24..256)
    LOADER_REGS    setmaxnreg of the loader warpgroup
    PEEL_FULL      0 | 1: walk step 0 unmasked when it is a full block
    OVERLAP        1 | 0: intra-warpgroup overlap of softmax and PV (FA3) or the serial order
    SCHED          0 | 1: heaviest-first per head (0) or over all heads (1, query block slowest)
    PERSISTENT     0 | 1: one CTA per tile (grid (cdiv(Sq, BLOCK_M), Hq, B)) or the persistent kernel
                   (grid (min(#tiles, #SMs * CTAS_PER_SM), 1, 1), #tiles = cdiv(Sq, BLOCK_M) * Hq * B)
    Q_BUFS         1 | 2 (PERSISTENT only): Q/O buffer sets; 2 lets the next tile's Q load overlap the
                   current tile (32 KiB more at hd128), 1 waits for the O store to drain first
    num_warps      4 (the default partition)
    maxnreg        the per-thread register cap of the launch (decides CTAs per SM)
    CTAS_PER_SM    the CTAs per SM the config is sized for (launch option: the persistent grid)

Register budget: the CTA has ``4 * NUM_CONSUMERS + 4`` warps (the 1-warp loader is padded to a
warpgroup); ``(4 * NUM_CONSUMERS + 4) * 32 * maxnreg * ctas_per_sm <= 65536``.  The default
partition (consumer 0) gets what is left of ``maxnreg * threads`` after the workers.
"""

SMEM_LIMIT = 232448  # sm_90 dynamic shared memory per block (227 KiB)
HEAD_DIMS = (64, 128, 256)


def cfg(block_n, stages, consumers=2, consumer_regs=None, loader_regs=24, peel=0, overlap=1, sched=0, maxnreg=None,
        ctas_per_sm=1, persistent=0, q_bufs=2):
    threads = (4 * consumers + 4) * 32
    if maxnreg is None:
        maxnreg = (65536 // ctas_per_sm // threads) // 8 * 8
    if consumer_regs is None:
        # Everything but the loader split evenly over the consumers, rounded down to 8.
        consumer_regs = min(256, ((maxnreg * (consumers + 1) - loader_regs) // consumers) // 8 * 8)
    return dict(BLOCK_M=64 * consumers, BLOCK_N=block_n, STAGES=stages, NUM_CONSUMERS=consumers,
                CONSUMER_REGS=consumer_regs, LOADER_REGS=loader_regs, PEEL_FULL=peel, OVERLAP=overlap, SCHED=sched,
                PERSISTENT=persistent, Q_BUFS=q_bufs, num_warps=4, maxnreg=maxnreg, CTAS_PER_SM=ctas_per_sm)


def smem_bytes(head_dim, c, elem=2):
    """Shared memory of a config (without the barriers' few bytes)."""
    q = c["NUM_CONSUMERS"] * 64 * head_dim * elem * (c.get("Q_BUFS", 2) if c.get("PERSISTENT", 0) else 1)
    kv = c["STAGES"] * 2 * c["BLOCK_N"] * head_dim * elem
    return q + kv


def _fits(head_dim, c):
    per_cta = (SMEM_LIMIT + 1024) // (c or {}).get("CTAS_PER_SM", 1) - 1024  # 228 KiB per SM, 1 KiB per CTA
    return c if c is not None and smem_bytes(head_dim, c) + 1024 <= min(SMEM_LIMIT, per_cta) else None


def _v(**per_hd):
    """A variant: hd64=..., hd128=..., hd256=... (missing: not applicable)."""
    return {hd: _fits(hd, per_hd.get(f"hd{hd}")) for hd in HEAD_DIMS}


VARIANTS = {
    # The original kernel as check_fwd.py ran it (STAGES 2 everywhere).
    "base": _v(hd64=cfg(128, 2), hd128=cfg(128, 2), hd256=cfg(64, 2)),
    "base_s3": _v(hd64=cfg(128, 3), hd128=cfg(128, 3)),
    # Idea 1: walk step 0 unmasked when it is a full block.
    "peel": _v(hd64=cfg(128, 2, peel=1), hd128=cfg(128, 2, peel=1), hd256=cfg(64, 2, peel=1)),
    "peel_s3": _v(hd64=cfg(128, 3, peel=1), hd128=cfg(128, 3, peel=1)),
    # LPT order over all heads (query block slowest), heaviest causal blocks first.
    "peel_sched": _v(hd64=cfg(128, 2, peel=1, sched=1), hd128=cfg(128, 2, peel=1, sched=1),
                     hd256=cfg(64, 2, peel=1, sched=1)),
    "peel_s3_sched": _v(hd64=cfg(128, 3, peel=1, sched=1), hd128=cfg(128, 3, peel=1, sched=1)),
    # Smaller key blocks (BN256 at hd64 spills ~450 B: left out).
    "peel_bn64_s3": _v(hd64=cfg(64, 3, peel=1), hd128=cfg(64, 3, peel=1), hd256=cfg(64, 3, peel=1)),
    # Idea 2: three consumer warpgroups (BLOCK_M 192): maxnreg 128, workers 160, default partition 168,
    # loader 24.  BN128 with the overlap spills (48 B at hd64, 1.1 KB at hd128): BN64, or the serial order.
    "n3_bn64": _v(hd64=cfg(64, 3, consumers=3, peel=1), hd128=cfg(64, 3, consumers=3, peel=1)),
    "n3_bn64_sched": _v(hd64=cfg(64, 3, consumers=3, peel=1, sched=1), hd128=cfg(64, 3, consumers=3, peel=1, sched=1)),
    "n3_serial": _v(hd64=cfg(128, 2, consumers=3, peel=1, overlap=0), hd128=cfg(64, 3, consumers=3, peel=1, overlap=0)),
    "n3_serial_s3": _v(hd64=cfg(128, 3, consumers=3, peel=1, overlap=0)),
    # Idea 3: two CTAs per SM for hd64: maxnreg 80, workers 104, default partition 112, loader 24.
    # The overlapped order spills at 104/112 registers (60 B): serial order only.
    "cta2_serial": _v(hd64=cfg(64, 2, peel=1, overlap=0, ctas_per_sm=2)),
    "cta2_serial_s3": _v(hd64=cfg(64, 3, peel=1, overlap=0, ctas_per_sm=2)),
    "cta2_serial_sched": _v(hd64=cfg(64, 2, peel=1, overlap=0, sched=1, ctas_per_sm=2)),
    # Persistent kernel (PERSISTENT=1): grid min(#tiles, #SMs * CTAS_PER_SM); two Q buffer sets
    # (next tile's Q load and this tile's O store overlap the main loop); hd256 has room for one.
    "pers": _v(hd64=cfg(128, 2, persistent=1), hd128=cfg(128, 2, persistent=1),
               hd256=cfg(64, 2, persistent=1, q_bufs=1)),
    "pers_peel": _v(hd64=cfg(128, 2, peel=1, persistent=1), hd128=cfg(128, 2, peel=1, persistent=1),
                    hd256=cfg(64, 2, peel=1, persistent=1, q_bufs=1)),
    "pers_s3": _v(hd64=cfg(128, 3, persistent=1), hd128=cfg(64, 3, persistent=1)),
    "pers_bn64": _v(hd64=cfg(64, 2, persistent=1), hd128=cfg(64, 2, persistent=1)),
    "pers_q1": _v(hd64=cfg(128, 2, persistent=1, q_bufs=1), hd128=cfg(128, 2, persistent=1, q_bufs=1)),
    # Two CTAs per SM (hd64): serial order, as cta2_serial.
    "pers_cta2": _v(hd64=cfg(64, 2, peel=1, overlap=0, ctas_per_sm=2, persistent=1)),
    "pers_cta2_s3": _v(hd64=cfg(64, 3, peel=1, overlap=0, ctas_per_sm=2, persistent=1)),
    # One consumer (BLOCK_M 64) with two CTAs per SM, for short causal sequences: the SM's
    # scheduler interleaves independent CTAs, so one tile's softmax, prologue and epilogue run under
    # another's products (the lockstep of two consumers in one CTA cannot).  The default partition
    # gets what the loader leaves: 232 registers.  (Three CTAs per SM, maxnreg 80: ptxas needs 90.)
    "n1_cta2": _v(hd64=cfg(128, 2, consumers=1, peel=1, ctas_per_sm=2), hd128=cfg(64, 2, consumers=1, peel=1, ctas_per_sm=2)),
    "n1_cta2_s3": _v(hd64=cfg(128, 3, consumers=1, peel=1, ctas_per_sm=2), hd128=cfg(64, 3, consumers=1, peel=1, ctas_per_sm=2)),
    "n1_cta2_pers": _v(hd64=cfg(128, 2, consumers=1, peel=1, ctas_per_sm=2, persistent=1),
                       hd128=cfg(64, 2, consumers=1, peel=1, ctas_per_sm=2, persistent=1)),
    # Untimed alternatives: hd64 with 64-key blocks (the BLOCK_N 128 form above lost at every hd64
    # cell), hd128 with a 3-stage K/V ring and one Q buffer set.
    "n1_cta2_pers_alt": _v(hd64=cfg(64, 2, consumers=1, peel=1, ctas_per_sm=2, persistent=1),
                            hd128=cfg(64, 3, consumers=1, peel=1, ctas_per_sm=2, persistent=1, q_bufs=1)),
}



def _product():
    """The configs python/rules.py ships (the kernels the library runs), as a variant."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import rules
    out = {}
    for hd in HEAD_DIMS:
        c = rules._attn_fwd_gluon_configs("sm_90", {"head_dim": hd})[0]  # the main kernel (not the short causal one)
        c = dict(c)
        c.setdefault("PERSISTENT", 0)
        c.setdefault("Q_BUFS", 2)
        threads = (4 * c["NUM_CONSUMERS"] + 4) * 32
        c.setdefault("CTAS_PER_SM", max(1, 65536 // (threads * c["maxnreg"])))
        out[hd] = c
    return out


VARIANTS["product"] = _product()

#: The constexprs after STAGES, in the kernel's order (what the build rules must pass).
OPTION_CONSTEXPRS = ("NUM_CONSUMERS", "CONSUMER_REGS", "LOADER_REGS", "PEEL_FULL", "OVERLAP", "SCHED", "PERSISTENT",
                     "Q_BUFS")
CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "STAGES") + OPTION_CONSTEXPRS


def config(variant, head_dim):
    """The config of ``variant`` for a head-dim bucket, or None."""
    return VARIANTS[variant][head_dim]


def constexprs(c):
    return {k: c[k] for k in CONSTEXPRS}


def describe(c):
    if c is None:
        return "n/a"
    return (f"BM{c['BLOCK_M']} BN{c['BLOCK_N']} S{c['STAGES']} cons{c['NUM_CONSUMERS']} "
            f"regs{c['CONSUMER_REGS']}/{c['LOADER_REGS']} maxnreg{c['maxnreg']} peel{c['PEEL_FULL']} "
            f"ovl{c['OVERLAP']} sched{c['SCHED']}"
            + (f" PERSISTENT qbufs{c['Q_BUFS']} ctas/SM{c['CTAS_PER_SM']}" if c["PERSISTENT"] else ""))


def grid(c, sq, hq, b, num_sms):
    """The launch grid of a config: ``(cdiv(Sq, BLOCK_M), Hq, B)``, or for ``PERSISTENT`` ``(min(#tiles,
    #SMs * CTAS_PER_SM), 1, 1)`` with ``#tiles = cdiv(Sq, BLOCK_M) * Hq * B``."""
    n_m = -(-sq // c["BLOCK_M"])
    if c["PERSISTENT"]:
        return (max(1, min(n_m * hq * b, num_sms * c["CTAS_PER_SM"])), 1, 1)
    return (n_m, hq, b)
