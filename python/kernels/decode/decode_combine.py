"""``attn_decode_combine``: the split-KV partials of ``attn_decode`` merged into O and LSE.

Split ``s`` left, per query row, ``O_s`` (normalised over its chunk of keys) and ``LSE_s`` (``-inf``
when the chunk had no visible key).  The row's ``LSE = ln(sum_s exp(LSE_s))`` and ``O = sum_s
exp(LSE_s - LSE) O_s``, in fp32, the splits in order (bitwise reproducible).  A row no split saw a
key for gets ``O = 0`` and ``LSE = +inf``, as every forward.  Contract: ``ABI.md``.

Grid ``(B * Hq,)``: one program per (sequence, query head), its ``N_CTX_Q <= BLOCK_M`` tokens.
"""
import triton
import triton.language as tl

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)


@triton.jit
def attn_decode_combine(O_PART, LSE_PART, O, LSE, stride_oz, stride_oh, stride_om, stride_lz, stride_lh,
                        N_BATCH, N_HEADS_Q, N_CTX_Q, D_HEAD, N_SPLITS, STORE_LSE,
                        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    z = tl.program_id(0) // N_HEADS_Q
    head = tl.program_id(0) % N_HEADS_Q
    token = tl.arange(0, BLOCK_M)
    row_ok = token < N_CTX_Q
    offs_d = tl.arange(0, HEAD_DIM)
    # Row r of split s: ((s * B + z) * Hq + head) * N_CTX_Q + token.
    first = (z.to(tl.int64) * N_HEADS_Q + head) * N_CTX_Q + token
    split_rows = N_BATCH.to(tl.int64) * N_HEADS_Q * N_CTX_Q

    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    for s in range(0, N_SPLITS):
        m = tl.maximum(m, tl.load(LSE_PART + s * split_rows + first, mask=row_ok, other=float("-inf")))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    total = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for s in range(0, N_SPLITS):
        rows = s * split_rows + first
        w = tl.math.exp2((tl.load(LSE_PART + rows, mask=row_ok, other=float("-inf")) - m_safe) * LOG2E)
        o_s = tl.load(O_PART + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        total += w
        acc += w[:, None] * o_s
    has_key = total > 0.0
    o = acc * tl.where(has_key, 1.0 / tl.where(has_key, total, 1.0), 0.0)[:, None]
    o_ptrs = O + z.to(tl.int64) * stride_oz + head.to(tl.int64) * stride_oh + token[:, None] * stride_om + offs_d[None, :]
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < D_HEAD))
    if STORE_LSE != 0:
        lse = tl.where(has_key, m_safe + tl.math.log2(tl.where(has_key, total, 1.0)) * LN2, float("inf"))
        tl.store(LSE + z.to(tl.int64) * stride_lz + head.to(tl.int64) * stride_lh + token, lse, mask=row_ok)
