"""``attn_decode_combine``: the split-KV partials of ``attn_decode`` merged into O and LSE.

Split ``s`` left, per query row, ``O_s`` (normalised over its chunk of keys) and ``LSE_s`` (``-inf``
when the chunk had no visible key).  The row's ``LSE = ln(sum_s exp(LSE_s))`` and ``O = sum_s
exp(LSE_s - LSE) O_s``, in fp32, the splits summed in a fixed order (bitwise reproducible).  A row
no split saw a key for gets ``O = 0`` and ``LSE = +inf``, as every forward.  Contract: ``ABI.md``.

Grid ``(B * Hq * N_CTX_Q,)``: one program per query row (sequence, query head, token), so the
rows of a multi-token step merge side by side; ``BLOCK_M`` splits are read at once (one
``[BLOCK_M, HEAD_DIM]`` tile of partials), so a step is a few wide loads rather than one dependent
load per split.
"""
import triton
import triton.language as tl

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)


@triton.jit
def attn_decode_combine(O_PART, LSE_PART, O, LSE, stride_oz, stride_oh, stride_om, stride_lz, stride_lh,
                        N_BATCH, N_HEADS_Q, N_CTX_Q, D_HEAD, N_SPLITS, STORE_LSE,
                        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    # Program i merges partial row i = (z * Hq + head) * N_CTX_Q + t of every split; split s's copy
    # of it is row s * split_rows + i.
    row = tl.program_id(0).to(tl.int64)
    t = tl.program_id(0) % N_CTX_Q
    head = (tl.program_id(0) // N_CTX_Q) % N_HEADS_Q
    z = tl.program_id(0) // (N_CTX_Q * N_HEADS_Q)
    offs_s = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    split_rows = tl.cast(N_BATCH, tl.int64) * N_HEADS_Q * N_CTX_Q
    m = float("-inf")
    for first in range(0, N_SPLITS, BLOCK_M):
        s = first + offs_s
        m = tl.maximum(m, tl.max(tl.load(LSE_PART + s * split_rows + row, mask=s < N_SPLITS,
                                         other=float("-inf")), 0))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    total = 0.0
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for first in range(0, N_SPLITS, BLOCK_M):
        s = first + offs_s
        rows = s * split_rows + row
        w = tl.math.exp2((tl.load(LSE_PART + rows, mask=s < N_SPLITS, other=float("-inf")) - m_safe) * LOG2E)
        o_s = tl.load(O_PART + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=(s < N_SPLITS)[:, None],
                      other=0.0)
        total += tl.sum(w, 0)
        acc += tl.sum(w[:, None] * o_s, 0)
    has_key = total > 0.0
    o = acc * tl.where(has_key, 1.0 / tl.where(has_key, total, 1.0), 0.0)
    o_ptrs = O + z.to(tl.int64) * stride_oz + head.to(tl.int64) * stride_oh + t * stride_om + offs_d
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=offs_d < D_HEAD)
    if STORE_LSE != 0:
        lse = tl.where(has_key, m_safe + tl.math.log2(tl.where(has_key, total, 1.0)) * LN2, float("inf"))
        tl.store(LSE + z.to(tl.int64) * stride_lz + head.to(tl.int64) * stride_lh + t, lse)
