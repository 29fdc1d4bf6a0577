"""The query-step walk of the Gluon backward and its boundary mask, shared by ``bwd.py`` (head dims up
to 128) and ``bwd_wide.py`` (256): every partition of a CTA walks the same (query head, query block)
steps (``bwd.py``'s module docstring, MASK_MODE 2 for the split walk), and a masked step zeroes P^T
outside the window per key row.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def masked_coords(j, n_mblk, n_lead, start, f_gap, BLOCK_M: gl.constexpr):
    """Step ``j`` of the masked walk (``MASK_MODE`` 2): ``(h_off, start_m)``.

    Per head ``n_mblk`` boundary blocks: the ``n_lead`` leading ones from ``start``, then the
    trailing ones from ``full_hi`` (``f_gap = full_hi - full_lo`` skips the interior).
    """
    h_off = j // n_mblk
    r = j - h_off * n_mblk
    start_m = start + r * BLOCK_M + (r >= n_lead).to(gl.int32) * f_gap
    return h_off, start_m


@gluon.jit
def full_coords(j, n_mask_steps, n_fblk, f_lo, n_steps, BLOCK_M: gl.constexpr, WALK: gl.constexpr):
    """Step ``j`` (``>= n_mask_steps``) of the contiguous walk: ``(h_off, start_m)``, ``n_fblk`` blocks from ``f_lo``
    for each of the ``(n_steps - n_mask_steps) / n_fblk`` heads of the group.

    ``WALK`` 0: head-major (every block of head 0, then head 1, ...).  1: block-major with the heads
    innermost, from the last block down: under a causal mask every key block's walk ends at the last
    query block, so the CTAs of one K/V head read the same Q/dO tiles in the same step and share them in
    L2.  2: block-major, heads innermost, from the first block up.
    """
    jj = j - n_mask_steps
    if WALK == 0:
        h_off = jj // n_fblk
        blk = jj - h_off * n_fblk
    else:
        n_heads = gl.maximum((n_steps - n_mask_steps) // n_fblk, 1)
        blk = jj // n_heads
        h_off = jj - blk * n_heads
        if WALK == 1:
            blk = n_fblk - 1 - blk
    return h_off, f_lo + blk * BLOCK_M


@gluon.jit
def key_bounds(offs_k, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, diag):
    """``mask.score_mask`` solved per key row ``j`` (``offs_k``): the queries ``[key_lo, key_hi]``
    that see it; ``key_hi = -1`` (none) past the key tail."""
    key_lo = offs_k - diag - WINDOW_RIGHT
    key_hi = gl.where(offs_k < N_CTX_K, gl.minimum(offs_k - diag + WINDOW_LEFT, N_CTX_Q - 1), -1)
    return key_lo, key_hi


@gluon.jit
def mask_boundary(pt, start_m, key_lo, key_hi, BLOCK_M: gl.constexpr, col_layout: gl.constexpr):
    """Zero P^T ``[keys, queries]`` outside ``mask.score_mask`` (window, both sequence tails).

    The same predicate, solved per key row: key ``j`` is seen by the queries
    ``i`` in ``[key_lo, key_hi] = [j - diag - right, min(j - diag + left, Sq - 1)]`` (``key_hi = -1``
    if ``j >= Sk``; see ``key_bounds``): two compares per element against the block-local query index.
    """
    lo = key_lo - start_m
    hi = key_hi - start_m
    cols = gl.expand_dims(gl.arange(0, BLOCK_M, layout=col_layout), 0)
    visible = (cols >= gl.expand_dims(lo, 1)) & (cols <= gl.expand_dims(hi, 1))
    return gl.where(visible, pt, 0.0)


@gluon.jit
def store_partials(DKV_PARTIALS, HEAD_SPLIT, dk, dv, desc_dk, b, hk, N_CTX_K, row0, col0, HEAD_DIM: gl.constexpr):
    """A head split's epilogue: this warpgroup's fp32 ``dk`` (already scaled) and ``dv`` tiles, keys from ``row0``
    and columns from ``col0``, into part ``program_id(1) % HEAD_SPLIT`` of the workspace's partials
    ``[HEAD_SPLIT, 2 (dK, dV), B, Hk, Sk, HEAD_DIM]`` (keys past ``Sk`` are not written).  Plain stores, no
    atomics: ``bwd_dkdv_convert.py`` sums the parts in part order, so the result is the same every run."""
    layout: gl.constexpr = dk.type.layout
    part = gl.program_id(1) % HEAD_SPLIT
    n_b = desc_dk.shape[0]
    n_hk = desc_dk.shape[1]
    rows = row0 + gl.arange(0, dk.shape[0], layout=gl.SliceLayout(1, layout))
    cols = col0 + gl.arange(0, dk.shape[1], layout=gl.SliceLayout(0, layout))
    offs = gl.expand_dims(rows.to(gl.int64) * HEAD_DIM, 1) + gl.expand_dims(cols, 0)
    keep = gl.expand_dims(rows < N_CTX_K, 1) & gl.expand_dims(cols < HEAD_DIM, 0)
    per_head = N_CTX_K.to(gl.int64) * HEAD_DIM
    dk_head = ((part * 2 * n_b + b) * n_hk + hk).to(gl.int64)
    dv_head = (((part * 2 + 1) * n_b + b) * n_hk + hk).to(gl.int64)
    gl.store(DKV_PARTIALS + dk_head * per_head + offs, dk, mask=keep)
    gl.store(DKV_PARTIALS + dv_head * per_head + offs, dv, mask=keep)
