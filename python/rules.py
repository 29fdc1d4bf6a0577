"""What to compile: kernel families, functional axes, tuning configs, targets.

Pure data plus small functions; importing this module does not import Triton,
so it is cheap for build tools and tests.

Vocabulary
----------
* **family**     -- one Triton kernel function, one per file under ``kernels/flash/``:
  ``attn_fwd`` (``fwd.py``), ``attn_bwd_preprocess`` (``bwd_preprocess.py``),
  ``attn_bwd_dkdv`` (``bwd_dkdv.py``), ``attn_bwd_dq`` (``bwd_dq.py``).
* **functional** -- one point of the family's functional axes: what the kernel
  computes.  ``attn_fwd``, ``attn_bwd_dkdv``, ``attn_bwd_dq``: (dtype, tf32,
  head_dim, dropout, bias); ``attn_bwd_dbias``: (dtype, tf32, head_dim, dropout);
  ``attn_bwd_preprocess``: (dtype, head_dim); ``debug_dropout_mask``: (dtype = fp32).
  ``dtype``: fp16, bf16, fp32.  ``tf32``: fp32 dots in TF32 (``True``, fp32 only)
  or IEEE fp32 (``False``; 16-bit dtypes always ``False``).  On an arch without
  TF32 dot support (gfx90a, gfx950: ``NO_TF32_ARCHS``) the ``tf32=True`` functionals
  are compiled with IEEE dots (``ALLOW_TF32`` False): the same functionals
  everywhere, never less precise.
  ``head_dim`` is a power-of-two bucket (``HEAD_DIMS``): the kernel serves every
  real head dim ``D_HEAD`` (runtime, a multiple of 8) up to it.  ``dropout``:
  Philox dropout (``kernels/flash/dropout.py``); ``bias``: additive bias
  (``kernels/flash/bias.py``).  ``softcap`` (``attn_fwd``, ``attn_bwd_dkdv``,
  ``attn_bwd_dq``): logit soft-capping (``kernels/flash/softcap.py``), ``alibi``
  (``kernels/flash/alibi.py``), ``sinks`` (``attn_fwd`` only: attention sinks,
  ``kernels/flash/sinks.py``; their gradient is ``attn_bwd_dsink``'s) and ``head_dim_v`` (V's
  own head-dim bucket, ``HEAD_DIM_V_PAIRS``): *optional* axes,
  compiled for fp16/bf16 without dropout, bias or each other only, up to head dim 256
  (``OPTIONAL_AXES_MAX_HEAD_DIM``; fp32 too stops at 256: ``FP32_MAX_HEAD_DIM``), and present in a
  functional (and its kernel ids) only when on, so every other functional's id and
  tuning entry stay what they were.  Masks (causal either alignment, sliding windows,
  none) and varlen batches are runtime arguments of every kernel.
  Every functional is compiled for every arch.
* **config**     -- performance parameters (BLOCK_M, BLOCK_N where the family has
  it, num_warps, num_stages; on AMD archs also ``waves_per_eu``, the occupancy
  the AMD backend compiles for); they change speed, never results.  Every
  compiled kernel must fit its arch: shared memory (LDS) at most
  ``SHARED_MEMORY_LIMIT[arch]``, and no scratch (spilled registers) on AMD --
  the compile driver refuses the rest.
* **variant**    -- ``aligned``: every pointer carries ``tt.divisibility=16``
  (16-byte aligned; BIAS and DBIAS included) except the scalar words (``SCALAR_WORD_POINTERS``:
  the Philox seed/offset slots, 8 bytes; the varlen offsets and status word, 4 bytes), every
  batch/head/row stride of the Q/K/V/O/DO/DQ/DK/DV/BIAS/DBIAS/OUT tensors a hint
  of 16 bytes in elements (8 for fp16/bf16, 4 for fp32), and ``D_HEAD`` a hint of
  8; nothing else is hinted (not the LSE/DELTA strides, sequence lengths,
  window or dropout arguments).  ``generic``: no hints, correct for any layout
  whose last dimension is contiguous and any ``D_HEAD`` multiple of 8.

What is compiled
----------------
Per (functional, arch) every config of the family's config function as an
``aligned`` kernel plus one ``generic`` kernel (the smallest-BLOCK_M config).
``attn_fwd`` has two configs (main, small BLOCK_M) for fp16/bf16 without
dropout, bias and the optional axes; every other functional of every family one.

Runtime choice between kernels (implemented by the Rust runtime)
----------------------------------------------------------------
0. Functional: the smallest ``head_dim`` bucket ``>= D_HEAD``.
1. Variant: ``aligned`` when every hinted argument of the kernel divides by its
   recorded hint (the runtime checks each kernel's recorded hints against the
   real values); otherwise ``generic``.
2. Forward config among the ``aligned`` kernels: use the largest BLOCK_M whose
   grid ``cdiv(Sq, BLOCK_M) * Hq * B`` fills every SM (CU on AMD) at least once;
   otherwise (small problems) the smallest BLOCK_M.  Backward families: their
   single ``aligned`` config when its hints hold, else ``generic``.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

# --------------------------------------------------------------------------
# Targets
# --------------------------------------------------------------------------

#: AOTRITON_TARGET_ARCH name -> (backend, arch, warp_size), the GPUTarget fields.
TARGETS: dict[str, tuple[str, int | str, int]] = {
    "sm_90": ("cuda", 90, 32),
    "sm_80": ("cuda", 80, 32),
    "gfx942": ("hip", "gfx942", 64),
    "gfx90a": ("hip", "gfx90a", 64),
    "gfx950": ("hip", "gfx950", 64),
}

#: Dynamic shared memory (LDS on AMD) one block / workgroup may use, in bytes: the compile driver
#: refuses a kernel whose compiled ``shared`` exceeds its arch's.  CUDA: the opt-in maximum per block
#: (H100/H200 227 KiB, A100 163 KiB); AMD: the LDS per workgroup (CDNA2/CDNA3 64 KiB, CDNA4 160 KiB).
SHARED_MEMORY_LIMIT = {"sm_90": 232448, "sm_80": 166912, "gfx942": 65536, "gfx90a": 65536, "gfx950": 163840}

#: GPU image file extension per backend.
IMAGE_EXT = {"cuda": "cubin", "hip": "hsaco"}


class UnknownArchError(ValueError):
    pass


def target_of(arch: str) -> tuple[str, int | str, int]:
    """``(backend, arch, warp_size)`` for an arch name, or UnknownArchError listing the known ones."""
    try:
        return TARGETS[arch]
    except KeyError:
        raise UnknownArchError(
            f"unknown target arch {arch!r}; known: {', '.join(sorted(TARGETS))}") from None


def parse_arch_list(text: str) -> list[str]:
    """``"sm_90;sm_80"`` (``;`` or ``,`` separated, as in AOTRITON_TARGET_ARCH) -> validated names."""
    archs = [a.strip() for a in text.replace(",", ";").split(";") if a.strip()]
    if not archs:
        raise UnknownArchError(f"no target arch given; known: {', '.join(sorted(TARGETS))}")
    for a in archs:
        target_of(a)
    return list(dict.fromkeys(archs))  # de-duplicate, keep order


# --------------------------------------------------------------------------
# Functional axes
# --------------------------------------------------------------------------

DTYPES = ["fp16", "bf16", "fp32"]
#: fp32 dots in TF32 (True) or IEEE (False); True exists only for fp32 (see ``functionals``).
TF32 = [False, True]
#: Head-dim buckets compiled (powers of two).  The runtime passes the real head
#: dim ``D_HEAD`` (a multiple of 8) and picks the smallest bucket >= D_HEAD.  512 serves 264..512
#: in fp16/bf16 (``HD512``: one small config per functional, what registers and shared memory allow).
HEAD_DIMS = [16, 32, 64, 128, 256, 512]
DROPOUT = [False, True]
BIAS = [False, True]
#: Logit soft-capping; an optional axis (``OPTIONAL_AXES``): absent from a functional means off.
SOFTCAP = [False, True]
#: ALiBi slopes; an optional axis like softcap.
ALIBI = [False, True]
#: Attention sinks (a logit per query head in the softmax normaliser); forward only: the backward's
#: dQ/dK/dV kernels see the sink through the LSE, and its gradient has its own family.
SINKS = [False, True]
#: Packed (varlen) batches as a compile-time axis: the Gluon forward and backward read them through
#: ragged TMA descriptors (kernels/flash_gluon/ragged.py).  The portable kernels take packing at run time
#: (``IS_VARLEN``) and have no such axis.
VARLEN = [False, True]
#: The optional axes that change the scores or V's shape (``_optional_on``).
SCORE_AXES = ("softcap", "alibi", "sinks", "head_dim_v")
#: Axes whose off value is left out of the functional (its dict, kernel ids, the runtime's query),
#: so that adding one leaves the existing functionals unchanged.
OPTIONAL_AXES = (*SCORE_AXES, "varlen")
#: The Gluon forward's dropout is optional too (added after its kernels shipped); the portable
#: families always name it.
GLUON_OPTIONAL_AXES = (*OPTIONAL_AXES, "dropout")
#: V's head-dim bucket where it differs from Q/K's (``head_dim``): an optional axis (0 = V's head dim
#: is Q/K's), compiled for these (Q/K bucket, V bucket) pairs: DeepSeek-style MLA prefill's 192/128
#: and 128/64. Output and dV use V's head dim; the kernels take ``HEAD_DIM_V`` and ``D_HEAD_V``.
HEAD_DIM_V_PAIRS = {256: 128, 128: 64}
HEAD_DIM_V = [0, 64, 128]
#: The optional axes are compiled up to this head dim (no model in use pairs them with a larger
#: one; each would add its functionals at 512 to every arch's build).
OPTIONAL_AXES_MAX_HEAD_DIM = 256
#: fp32 is compiled up to this head dim (``HD512`` says why).
FP32_MAX_HEAD_DIM = 256
#: The Gluon backward computes dQ itself (``dq=True``: fp32 reduce-adds, then the dQ conversion)
#: up to this head dim; above it the runtime always takes dQ from the portable ``attn_bwd_dq``
#: after the dK/dV-only Gluon kernel (H100, bf16 hd256, FA3 grid: 0.77 -> 0.97 of cuDNN), so the
#: fused kernels are not compiled there.  The runtime's ``gluon::FUSED_DQ_MAX_BUCKET`` is the
#: same number (its test ``compiled_gluon_kernels_take_the_runtime_arguments`` checks the archive).
GLUON_FUSED_DQ_MAX_HEAD_DIM = 128
#: ``attn_bwd_gluon_dq`` (kernels/flash_gluon/bwd_dq.py: dQ in a Gluon kernel of its own, written once,
#: no reduce-adds): ``(BLOCK_N, K_STAGES, V_STAGES)`` per head-dim bucket, spill-free at 240 registers
#: per consumer warpgroup in the CPU compile (python/tests/test_gluon_dq.py; at hd256 BLOCK_N 64 with
#: K 2 / V 1 stages spills 40 bytes, 512 without the per-step Q/dO descriptors).  Checked and
#: timed through the JIT (test/gluon/check_bwd.py --gluon-dq, check_bwd_dropout.py and
#: check_bwd_varlen.py's gluon-dq cases); compiled into the archive at ``GLUON_DQ_SHIPPED_HEAD_DIMS``
#: (see ``ATTN_BWD_GLUON_DQ``).
GLUON_DQ_CONFIGS = {64: (128, 2, 2), 128: (64, 2, 2), 256: (32, 3, 3)}
GLUON_DQ_SHIPPED_HEAD_DIMS = [256]
#: Archs whose Triton backend has no TF32 dot: ``tf32=True`` compiles with IEEE dots there.  Triton
#: 3.6 allows ``input_precision="tf32"`` on gfx942 only among the AMD archs (its xf32 MFMA,
#: ``v_mfma_f32_32x32x4_xf32``); on gfx90a and gfx950 ``tl.dot`` refuses it ("input_precision must be
#: one of ('bf16x3', 'bf16x6', 'ieee')"): CDNA2 has no xf32 MFMA and CDNA4 dropped it.
NO_TF32_ARCHS = {"gfx90a", "gfx950"}

#: Bytes per element of each pointer dtype.
ELEMENT_SIZE = {"fp16": 2, "bf16": 2, "fp32": 4, "fp8e4nv": 1}
#: Pointer alignment (bytes) and the byte multiple every hinted stride has in ``aligned``.
ALIGN_BYTES = 16
#: ``D_HEAD`` hint in ``aligned``: keeps the head-dim mask constant over 8 elements (16 bytes).
D_HEAD_DIVISIBILITY = 8

#: Tensors in the input/output dtype; their z/h/row strides are hinted in ``aligned``.
_DATA_TENSORS = ("Q", "K", "V", "O", "DO", "DQ", "DK", "DV", "BIAS", "DBIAS", "OUT", "VT", "K_NEW", "V_NEW")
#: fp32 per-row tensors (pointers hinted, strides not: a hint would send every odd Sq to `generic`).
_ROW_TENSORS = ("LSE", "DELTA")
#: Row strides (i32: the runtime guarantees ``row * stride`` fits in int32).
_ROW_STRIDES = {"stride_qm", "stride_kn", "stride_vn", "stride_om", "stride_dom", "stride_dqm", "stride_dkn",
                "stride_dvn", "stride_xkm", "stride_xvm"}
#: stride argument prefix -> tensor
_STRIDE_TENSOR = {"stride_q": "Q", "stride_k": "K", "stride_v": "V", "stride_o": "O", "stride_do": "DO",
                  "stride_dq": "DQ", "stride_dk": "DK", "stride_dv": "DV", "stride_l": "LSE",
                  "stride_delta": "DELTA", "stride_b": "BIAS", "stride_db": "DBIAS", "stride_a": "ALIBI_SLOPES",
                  "stride_vt": "VT", "stride_dsq": "DESCALE_Q", "stride_dsk": "DESCALE_K", "stride_dsv": "DESCALE_V",
                  "stride_xk": "K_NEW", "stride_xv": "V_NEW", "stride_pt": "PAGE_TABLE"}
#: i64 pointers of the dropout group.
_I64_POINTERS = ("PHILOX_SEED", "PHILOX_OFFSET", "PHILOX_SEED_OUT", "PHILOX_OFFSET_OUT")
#: i32 pointers of the varlen group.
_I32_POINTERS = ("CU_SEQLENS_Q", "CU_SEQLENS_K", "VARLEN_STATUS", "PAGE_TABLE", "CACHE_SEQLENS", "KV_STATUS")
#: fp32 workspace of the decode's split-KV partials.
_DECODE_PARTIALS = ("O_PART", "LSE_PART")


def _strides(prefix: str, dims: str) -> list[str]:
    return [f"stride_{prefix}{d}" for d in dims]


def stride_tensor(name: str) -> str:
    """``stride_dkn`` -> ``DK``: the tensor a stride argument belongs to."""
    assert name.startswith("stride_")
    return _STRIDE_TENSOR[name[:-1]]


#: What bounds a packed batch's offsets (kernels/flash/varlen.py): token counts, the status word.
VARLEN_BOUNDS = ["N_TOKENS_Q", "N_TOKENS_K", "VARLEN_STATUS", "STORE_VARLEN_STATUS"]
#: Attention group (fwd, dkdv, dq, dbias), after the stride and kernel-specific arguments.
ATTENTION_GROUP = ["N_CTX_Q", "N_CTX_K", "D_HEAD", "GQA_GROUP", "WINDOW_LEFT", "WINDOW_RIGHT", "ALIGN_BOTTOM_RIGHT",
                   "IS_VARLEN", "CU_SEQLENS_Q", "CU_SEQLENS_K", *VARLEN_BOUNDS]
#: V's real head dim (fwd, dkdv, dq; read only with ``HEAD_DIM_V``): the last runtime argument, so
#: the earlier arguments keep their offsets and the kernels without it their machine code.
HEAD_DIM_V_ARGS = ["D_HEAD_V"]
#: Dropout group (fwd, dkdv, dq, dbias); the forward appends ``FWD_PHILOX_OUTPUTS``.
DROPOUT_GROUP = ["DROPOUT_THRESHOLD", "dropout_scale", "PHILOX_SEED", "PHILOX_OFFSET", "philox_offset_base"]
FWD_PHILOX_OUTPUTS = ["PHILOX_SEED_OUT", "PHILOX_OFFSET_OUT", "STORE_PHILOX"]
_BIAS_STRIDES = _strides("b", "zhm")
#: The ALiBi slopes' batch stride (0: one slope per query head for every sequence).
_ALIBI_STRIDES = _strides("a", "z")
_ATTN_CONSTEXPRS = ["HEAD_DIM", "BLOCK_M", "BLOCK_N", "DROPOUT", "HAS_BIAS", "ALLOW_TF32", "SOFTCAP", "HAS_ALIBI"]

ATTN_FWD_ARGS = (
    ["Q", "K", "V", "O", "LSE", "BIAS", "ALIBI_SLOPES", "SINKS", "sm_scale", "softcap"]
    + _strides("q", "zhm") + _strides("k", "zhn") + _strides("v", "zhn") + _strides("o", "zhm")
    + _strides("l", "zh") + _BIAS_STRIDES + _ALIBI_STRIDES
    + ["STORE_LSE"]
    + ATTENTION_GROUP + DROPOUT_GROUP + FWD_PHILOX_OUTPUTS + HEAD_DIM_V_ARGS
    + _ATTN_CONSTEXPRS + ["HAS_SINKS", "HEAD_DIM_V"]
)
ATTN_BWD_PREPROCESS_ARGS = (
    ["O", "DO", "DELTA"]
    + _strides("o", "zhm") + _strides("do", "zhm") + _strides("delta", "zh")
    + ["N_CTX_Q", "D_HEAD", "IS_VARLEN", "CU_SEQLENS_Q", "N_TOKENS_Q", "VARLEN_STATUS", "STORE_VARLEN_STATUS"]
    + ["HEAD_DIM", "BLOCK_M"]
)
_BWD_INPUT_STRIDES = (_strides("q", "zhm") + _strides("k", "zhn") + _strides("v", "zhn") + _strides("do", "zhm")
                      + _strides("l", "zh") + _strides("delta", "zh"))
ATTN_BWD_DKDV_ARGS = (
    ["Q", "K", "V", "DO", "LSE", "DELTA", "DK", "DV", "BIAS", "ALIBI_SLOPES", "sm_scale", "softcap"]
    + _BWD_INPUT_STRIDES + _strides("dk", "zhn") + _strides("dv", "zhn") + _BIAS_STRIDES + _ALIBI_STRIDES
    + ATTENTION_GROUP + DROPOUT_GROUP + HEAD_DIM_V_ARGS
    + _ATTN_CONSTEXPRS + ["HEAD_DIM_V"]
)
ATTN_BWD_DQ_ARGS = (
    ["Q", "K", "V", "DO", "LSE", "DELTA", "DQ", "BIAS", "ALIBI_SLOPES", "sm_scale", "softcap"]
    + _BWD_INPUT_STRIDES + _strides("dq", "zhm") + _BIAS_STRIDES + _ALIBI_STRIDES
    + ATTENTION_GROUP + DROPOUT_GROUP + HEAD_DIM_V_ARGS
    + _ATTN_CONSTEXPRS + ["HEAD_DIM_V"]
)
ATTN_BWD_DBIAS_ARGS = (
    ["Q", "K", "V", "DO", "LSE", "DELTA", "BIAS", "DBIAS", "sm_scale"]
    + _BWD_INPUT_STRIDES + _BIAS_STRIDES + _strides("db", "zhm")
    + ["N_BATCH", "BIAS_BATCHES", "BIAS_HEADS", "BIAS_ROWS", "N_HEADS_Q"]
    + ATTENTION_GROUP + DROPOUT_GROUP
    + ["HEAD_DIM", "BLOCK_M", "BLOCK_N", "DROPOUT", "ALLOW_TF32"]
)
ATTN_BWD_DSINK_ARGS = (
    ["LSE", "DELTA", "SINKS", "DSINK"] + _strides("l", "zh") + _strides("delta", "zh")
    + ["N_BATCH", "N_CTX_Q", "IS_VARLEN", "CU_SEQLENS_Q", "N_TOKENS_Q", "VARLEN_STATUS", "STORE_VARLEN_STATUS"]
    + ["BLOCK_M"]
)
DEBUG_DROPOUT_MASK_ARGS = (
    ["OUT"] + _strides("o", "zhm")
    + ["N_CTX_Q", "N_CTX_K", "N_HEADS", "DROPOUT_THRESHOLD", "PHILOX_SEED", "PHILOX_OFFSET", "philox_offset_base"]
    + ["BLOCK_M", "BLOCK_N"]
)
#: KV-cache decoding (kernels/decode/ABI.md): the append of new tokens, the split-KV attention
#: over a dense or paged cache with the GQA group packed into the rows, the merge of the splits.
_KV_CACHE_GEOMETRY = ["CACHE_CAPACITY", "PAGE_SIZE_LOG2", "N_PAGES"]
ATTN_DECODE_ARGS = (
    ["Q", "K", "V", "O", "LSE", "O_PART", "LSE_PART", "PAGE_TABLE", "CACHE_SEQLENS", "KV_STATUS", "sm_scale"]
    + _strides("q", "zhm") + _strides("k", "zhn") + _strides("v", "zhn") + _strides("o", "zhm")
    + _strides("l", "zh") + ["stride_ptz"]
    + ["N_CTX_Q", "N_NEW", "D_HEAD", "GQA_GROUP", "N_HEADS_Q", "WINDOW_LEFT", "WINDOW_RIGHT", *_KV_CACHE_GEOMETRY,
       "N_SPLITS", "STORE_LSE", "STORE_KV_STATUS"]
    + ["HEAD_DIM", "BLOCK_M", "BLOCK_N", "PAGED", "SMALL_PAGE"]
)
ATTN_DECODE_COMBINE_ARGS = (
    ["O_PART", "LSE_PART", "O", "LSE"] + _strides("o", "zhm") + _strides("l", "zh")
    + ["N_BATCH", "N_HEADS_Q", "N_CTX_Q", "D_HEAD", "N_SPLITS", "STORE_LSE"]
    + ["HEAD_DIM", "BLOCK_M"]
)
KVCACHE_APPEND_ARGS = (
    ["K_NEW", "V_NEW", "K", "V", "PAGE_TABLE", "CACHE_SEQLENS", "KV_STATUS"]
    + _strides("xk", "zhm") + _strides("xv", "zhm") + _strides("k", "zhn") + _strides("v", "zhn") + ["stride_ptz"]
    + ["N_NEW", "N_HEADS_K", "D_HEAD", *_KV_CACHE_GEOMETRY, "STORE_KV_STATUS"]
    + ["HEAD_DIM", "BLOCK_M", "PAGED"]
)
#: Performance knobs of the Gluon kernels (constexprs after the ABI's; values from the config).
GLUON_FWD_KNOBS = ["NUM_CONSUMERS", "CONSUMER_REGS", "LOADER_REGS", "PEEL_FULL", "OVERLAP", "SCHED", "PERSISTENT",
                   "Q_BUFS"]
GLUON_BWD_KNOBS = ["MASK_MODE", "CONS_REGS", "DK_SS", "PERSISTENT", "DESC_PER_STEP", "WALK", "DQ_IN_RING"]
_CONSTEXPRS = ("HEAD_DIM", "HEAD_DIM_V", "BLOCK_M", "BLOCK_N", "DROPOUT", "HAS_BIAS", "ALLOW_TF32", "SOFTCAP",
               "HAS_ALIBI", "HAS_SINKS",
               "STAGES",
               "COMPUTE_DQ", "PAGED", "SMALL_PAGE", "K_STAGES", "V_STAGES",
               *GLUON_FWD_KNOBS, *GLUON_BWD_KNOBS, "PINGPONG")

# The Gluon backend (sm_90; contract: kernels/flash_gluon/ABI.md).  Q/K/V/O/dO/dK/dV are rank-4
# host TMA descriptors over [B, H, S, D]; the backward's workspace views are rank 2.
_GLUON_WINDOW = ["WINDOW_LEFT", "WINDOW_RIGHT", "ALIGN_BOTTOM_RIGHT"]
#: The packing group of the Gluon kernels (kernels/flash/varlen.py): read by the ``varlen`` functionals.
_GLUON_PACKING = ["IS_VARLEN", "CU_SEQLENS_Q", "CU_SEQLENS_K", *VARLEN_BOUNDS]
#: The query side of it (the backward's row kernels: preprocess, dQ conversion).
_GLUON_PACKING_Q = [n for n in _GLUON_PACKING if not n.endswith("_K")]
ATTN_FWD_GLUON_ARGS = (
    ["desc_q", "desc_k", "desc_v", "desc_o", "LSE", "stride_lz", "stride_lh", "sm_scale", "STORE_LSE",
     "N_CTX_Q", "N_CTX_K", "GQA_GROUP", *_GLUON_WINDOW, *_GLUON_PACKING, *DROPOUT_GROUP, *FWD_PHILOX_OUTPUTS]
    + ["HEAD_DIM", "BLOCK_M", "BLOCK_N", "STAGES", "DROPOUT"] + GLUON_FWD_KNOBS
)
#: The fp8 forward (kernels/flash_gluon/fwd_fp8.py): fp32 dequantisation factors per (batch, KV head).
_DESCALES = ("DESCALE_Q", "DESCALE_K", "DESCALE_V")
GLUON_FP8_FWD_KNOBS = ["NUM_CONSUMERS", "CONSUMER_REGS", "LOADER_REGS", "PEEL_FULL", "OVERLAP", "SCHED", "PINGPONG"]
ATTN_FWD_GLUON_FP8_ARGS = (
    ["desc_q", "desc_k", "desc_vt", "desc_o", "LSE", "stride_lz", "stride_lh", "sm_scale", "STORE_LSE",
     "N_CTX_Q", "N_CTX_K", "GQA_GROUP", *_GLUON_WINDOW,
     "DESCALE_Q", "stride_dsqz", "stride_dsqh", "DESCALE_K", "stride_dskz", "stride_dskh",
     "DESCALE_V", "stride_dsvz", "stride_dsvh"]
    + ["HEAD_DIM", "BLOCK_M", "BLOCK_N", "STAGES"] + GLUON_FP8_FWD_KNOBS
)
#: Vᵀ in the fp8 forward's key order (kernels/flash_gluon/fwd_fp8_vt.py).
TRANSPOSE_V_FP8_ARGS = (
    ["V", "stride_vz", "stride_vh", "stride_vn", "VT", "stride_vtz", "stride_vth", "stride_vtd",
     "N_CTX_K", "KEYS_PAD", "D_HEAD"]
    + ["HEAD_DIM", "BLOCK_N"]
)
ATTN_BWD_GLUON_PREPROCESS_ARGS = (
    ["O", "DO"] + _strides("o", "zhm") + _strides("do", "zhm")
    + ["LSE", "stride_lz", "stride_lh", "DELTA", "stride_deltaz", "stride_deltah", "LSE2", "DELTA2", "DQ_ACC",
       "N_CTX_Q", "SQ_PAD", "D_HEAD", "ZERO_DQ_ACC", *_GLUON_PACKING_Q]
    + ["HEAD_DIM", "BLOCK_M"]
)
ATTN_BWD_GLUON_ARGS = (
    ["desc_q", "desc_k", "desc_v", "desc_do", "desc_dk", "desc_dv", "desc_dq_acc", "desc_lse2", "desc_delta2",
     "sm_scale", "N_CTX_Q", "N_CTX_K", "SQ_PAD", "N_HEADS_Q", "GQA_GROUP", *_GLUON_WINDOW, *_GLUON_PACKING,
     *DROPOUT_GROUP, "HEAD_SPLIT", "DKV_PARTIALS"]
    + ["HEAD_DIM", "BLOCK_M", "BLOCK_N", "STAGES", "COMPUTE_DQ", "DROPOUT"] + GLUON_BWD_KNOBS
)
#: dQ in a Gluon kernel of its own (kernels/flash_gluon/bwd_dq.py): the forward's tile program over Q/dO,
#: the workspace's lse2 / delta2 rows (bwd_preprocess.py) as plain pointers.
ATTN_BWD_GLUON_DQ_ARGS = (
    ["desc_q", "desc_k", "desc_v", "desc_do", "desc_dq", "LSE2", "DELTA2", "sm_scale", "N_CTX_Q", "N_CTX_K", "SQ_PAD",
     "GQA_GROUP", *_GLUON_WINDOW, *_GLUON_PACKING, *DROPOUT_GROUP]
    + ["HEAD_DIM", "BLOCK_M", "BLOCK_N", "K_STAGES", "V_STAGES", "DROPOUT", "CONSUMER_REGS", "LOADER_REGS"]
)
ATTN_BWD_GLUON_DQ_CONVERT_ARGS = (
    ["DQ_ACC", "DQ"] + _strides("dq", "zhm") + ["sm_scale", "N_CTX_Q", "SQ_PAD", "D_HEAD", "N_HEADS_Q",
                                                *_GLUON_PACKING_Q]
    + ["HEAD_DIM", "BLOCK_M"]
)
#: A head split's dK/dV partials summed and cast (kernels/flash_gluon/bwd_dkdv_convert.py).
ATTN_BWD_GLUON_DKDV_CONVERT_ARGS = (
    ["DKV_PARTIALS", "DK", "DV"] + _strides("dk", "zhn") + _strides("dv", "zhn") + ["N_CTX_K", "D_HEAD", "HEAD_SPLIT"]
    + ["HEAD_DIM", "BLOCK_N"]
)
#: fp32 workspace pointers of the Gluon backward.
_WORKSPACE_TENSORS = ("LSE2", "DELTA2", "DQ_ACC", "DKV_PARTIALS")


def nvmma_layout_repr(block: list[int], bits: int, swizzle: int | None = None) -> str:
    """``repr`` of ``gl.NVMMASharedLayout.get_default_for(block, dtype)`` (Triton 3.6), without Triton.

    The largest swizzle (128/64/32 B) dividing the contiguous row; none when fewer than 8 rows.
    ``test_rules`` checks this against Triton's own function.  ``swizzle`` (bytes) overrides it.
    """
    if swizzle is None:
        row_bytes = block[-1] * bits // 8
        swizzle = next((w for w in (128, 64, 32) if row_bytes >= w and row_bytes % w == 0), 0)
        outer = 1
        for size in block[:-1]:
            outer *= size
        if len(block) < 2 or outer < 8:
            swizzle = 0
    return (f"NVMMASharedLayout(swizzle_byte_width={swizzle}, element_bitwidth={bits}, rank={len(block)}, "
            "transposed=False, fp4_padded=False, cga_layout=[])")


def tensordesc_type(dtype: str, block: list[int], swizzle: int | None = None) -> str:
    """Gluon signature type of a host TMA descriptor: the default NVMMA shared layout, or ``swizzle`` bytes."""
    bits = 8 * ELEMENT_SIZE[dtype]
    return f"tensordesc<{dtype}[{', '.join(map(str, block))}],{nvmma_layout_repr(block, bits, swizzle)}>"


def _gluon_desc_blocks(family: str, functional: dict[str, Any], config: dict[str, int]) -> dict[str, tuple]:
    """Descriptor argument -> (dtype, block) or (dtype, block, swizzle bytes) per ABI.md."""
    hd, dt = functional["head_dim"], functional["dtype"]
    # The leading (size-1 box) dimensions: [B, H] of a [B, H, S, D] tensor, or the two address-only
    # ones and H of a packed batch's ragged descriptor (flash_gluon/ragged.py).
    lead = [1, 1, 1] if functional.get("varlen") else [1, 1]
    if family == "attn_fwd_gluon_fp8":  # fp8 Q/K/Vᵀ, bf16 O; Vᵀ's tiles are [HEAD_DIM, BLOCK_N]
        q = [1, 1, 64, hd]
        return {"desc_q": (dt, q), "desc_k": (dt, [1, 1, config["BLOCK_N"], hd]),
                "desc_vt": (dt, [1, 1, hd, config["BLOCK_N"]]), "desc_o": ("bf16", q)}
    if family in ("attn_fwd_gluon", "attn_bwd_gluon_dq"):
        q = lead + [64, hd]  # one consumer warpgroup's 64 rows
        kv = lead + [config["BLOCK_N"], hd]
        if family == "attn_bwd_gluon_dq":  # dQ goes out through the Q tile: the same block
            return {"desc_q": (dt, q), "desc_k": (dt, kv), "desc_v": (dt, kv), "desc_do": (dt, q), "desc_dq": (dt, q)}
        return {"desc_q": (dt, q), "desc_k": (dt, kv), "desc_v": (dt, kv), "desc_o": (dt, q)}
    q = lead + [config["BLOCK_M"], hd]
    kv = lead + [config["BLOCK_N"], hd]
    # one compute warpgroup's share of dK/dV: its 64 keys, or at hd256 (bwd_wide.py) its half of the columns
    dkv = lead + ([config["BLOCK_N"], hd // 2] if hd > 128 else [config["BLOCK_N"] // 2, hd])
    vec = ("fp32", [1, config["BLOCK_M"]])
    return {"desc_q": (dt, q), "desc_k": (dt, kv), "desc_v": (dt, kv), "desc_do": (dt, q),
            "desc_dk": (dt, dkv), "desc_dv": (dt, dkv),
            # one unswizzled [BLOCK_M, 8] column strip of the fp32 dQ tile (bwd.py's module docstring)
            "desc_dq_acc": ("fp32", [config["BLOCK_M"], 8], 0),
            "desc_lse2": vec, "desc_delta2": vec}


def _gluon_signature_of(family: str, args: list[str], constexprs: list[str]):
    def signature(functional: dict[str, Any], config: dict[str, int] | None = None) -> dict[str, str]:
        has_desc = any(n.startswith("desc_") for n in args)
        blocks = _gluon_desc_blocks(family, functional, config) if config and has_desc else {}
        out = {}
        for n in args:
            if n in constexprs:
                out[n] = "constexpr"
            elif n.startswith("desc_"):
                dt, block, *swizzle = blocks.get(n, (functional["dtype"], [1]))
                out[n] = tensordesc_type(dt, block, *swizzle)
            else:
                out[n] = arg_type(n, functional["dtype"])
        return out
    return signature


def arg_type(name: str, dtype: str) -> str:
    """Triton type of one (non-constexpr) argument; the same rules for every family."""
    if name in _DATA_TENSORS:
        return f"*{dtype}"
    if name in _ROW_TENSORS or name in _WORKSPACE_TENSORS or name in ("ALIBI_SLOPES", "SINKS", "DSINK") \
            or name in _DESCALES or name in _DECODE_PARTIALS:
        return "*fp32"
    if name in _I64_POINTERS:
        return "*i64"
    if name in _I32_POINTERS:
        return "*i32"
    if name in ("sm_scale", "dropout_scale", "softcap"):
        return "fp32"
    if name == "DROPOUT_THRESHOLD":
        return "u32"
    if name == "philox_offset_base":
        return "i64"
    if name in _ROW_STRIDES:
        return "i32"
    if name.startswith("stride_"):
        return "i64"  # batch / head strides may exceed 2**31; LSE/DELTA strides too
    return "i32"      # sequence lengths, D_HEAD, GQA_GROUP, window, flags, bias broadcast counts


def _signature_of(args: list[str], constexprs: list[str]):
    def signature(functional: dict[str, Any], config: dict[str, int] | None = None) -> dict[str, str]:
        """Triton signature (argument name -> type) for one functional, in ABI order."""
        return {n: ("constexpr" if n in constexprs else arg_type(n, functional["dtype"])) for n in args}
    return signature


#: Pointers the kernels only read or write one scalar word through (never a vector): the ``aligned``
#: variant assumes no more than the word's own alignment for them, so that callers whose seed/offset
#: pair or offsets sit in one tensor (torch's ``rng_state`` int64[2]: the offset 8 bytes in) still
#: get the aligned kernels.
SCALAR_WORD_POINTERS = {"PHILOX_SEED": 8, "PHILOX_OFFSET": 8, "PHILOX_SEED_OUT": 8, "PHILOX_OFFSET_OUT": 8,
                        "CU_SEQLENS_Q": 4, "CU_SEQLENS_K": 4, "VARLEN_STATUS": 4}


def aligned_hints(signature: dict[str, str]) -> dict[str, int]:
    """``tt.divisibility`` per runtime argument in the ``aligned`` variant (1 = no hint).

    Pointers: 16 bytes, the scalar words of ``SCALAR_WORD_POINTERS`` their own size.  Batch/head/row strides of the
    Q/K/V/O/DO/DQ/DK/DV/BIAS/DBIAS/OUT tensors: 16 bytes in elements (8 for
    fp16/bf16, 4 for fp32).  ``D_HEAD``: 8.  Nothing else (LSE/DELTA strides,
    sequence lengths, window and dropout arguments are free).
    """
    hints = {}
    for name, ty in signature.items():
        if ty == "constexpr":
            continue
        d = 1
        if ty.startswith("*"):
            d = SCALAR_WORD_POINTERS.get(name, ALIGN_BYTES)
        elif name.startswith("stride_") and stride_tensor(name) in _DATA_TENSORS:
            tensor = stride_tensor(name)
            if tensor not in signature:  # debug_dropout_mask: stride_o* belong to OUT
                tensor = "OUT"
            d = ALIGN_BYTES // ELEMENT_SIZE[signature[tensor][1:]]
        elif name in ("D_HEAD", "D_HEAD_V"):
            d = D_HEAD_DIVISIBILITY
        hints[name] = d
    return hints


# --------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------

def jit_free_integers(family: "Family") -> list[str]:
    """The integer arguments of ``family``'s kernels that the AOT images leave free (no
    ``aligned_hints`` hint): a JIT launch (the GPU checks in test/gluon) must not specialize them, or
    it would compile an integer equal to 1 as a constexpr and hint one divisible by 16, checking and
    timing code the runtime never launches."""
    functional = functionals(family)[0]
    sig = family.signature(functional, family.configs("sm_90", functional)[0])
    return [n for n, d in aligned_hints(sig).items() if d == 1 and sig[n] in ("i1", "i32", "i64", "u32", "u64")]


def _optional_on(functional: dict[str, Any]) -> bool:
    """Whether one of the ``SCORE_AXES`` (softcap, alibi, sinks, head_dim_v) is on."""
    return any(functional.get(a) for a in SCORE_AXES)


def _cfg(bm, bn, w, s, waves_per_eu=None):
    """A config dict; ``waves_per_eu`` (HIP only) is set by the AMD configs and absent from CUDA ones."""
    c = {"BLOCK_M": bm}
    if bn is not None:
        c["BLOCK_N"] = bn
    c.update(num_warps=w, num_stages=s)
    if waves_per_eu is not None:
        c["waves_per_eu"] = waves_per_eu
    return c


def _plain16(functional: dict[str, Any]) -> bool:
    """fp16/bf16 without dropout, bias and softcap: the functionals with the tuned two-config forward
    (the softcap forward takes the small config alone, as dropout and bias do)."""
    return (functional["dtype"] != "fp32" and not functional.get("dropout") and not functional.get("bias")
            and not _optional_on(functional))


# AMD (gfx90a, gfx942, gfx950; wave64).  Every config: 4 waves of 64 lanes (8 for the decode
# kernel's 64-row tile at hd256, where 4 need a stack object on gfx90a), one pipeline stage
# (``num_stages`` 1: tiles pass through the LDS once, no prefetch buffers), and ``waves_per_eu``, the
# occupancy the AMD backend compiles for (LLVM ``amdgpu-waves-per-eu``: at most 512 / waves_per_eu
# VGPRs + AGPRs per lane).  The picks are the largest waves_per_eu whose ``aligned`` *and* ``generic``
# kernels compile without scratch (register spills) on gfx942 in every functional of the bucket --
# the compile driver refuses any AMD kernel with scratch, on every arch -- and blocks whose LDS fits
# 64 KiB (gfx90a/gfx942; gfx950 has 160 KiB and takes the same configs).  Not timed (no AMD GPU here).
# The ``generic`` variants hold a 64-bit address per element and need far more registers than the
# ``aligned`` ones, so most configs end at waves_per_eu 1 (the whole register file); 2 where both fit
# in 256 registers: the 16-bit forward without dropout and bias and the 16-bit dQ up to head dim 64,
# the other forward, dQ and dBias kernels up to head dim 32 (the forward without bias), dK/dV at 16,
# and the preprocess; the debug mask: 4.

def _amd(bm, bn, waves_per_eu):
    return _cfg(bm, bn, 4, 1, waves_per_eu)


# Head dim 512 (D_HEAD 264..512), fp16/bf16: one config per family for every functional (dropout
# and bias too). Picked from ptxas -v (sm_90) and the AMD compile (no scratch on gfx942), not timed:
# the [BLOCK, 512] fp32 accumulators and the 16-bit tiles held in registers leave 16-32 rows per
# program. sm_90 registers per thread (aligned / generic; without dropout and bias no spills, with
# them up to 40 bytes per thread, dQ with dropout 464 / 520), shared memory:
#   attn_fwd 32x32, 8 warps, 2 stages: 188 / 255, 98 KiB;  dK/dV 16x16, 8 warps: 179 / 224, 64 KiB;
#   dQ 16x16, 8 warps: 255 / 252, 64 KiB;                  dBias 16x16, 8 warps: 112 / 201, 64 KiB.
# sm_80 (163 KiB of shared memory) takes the same tiles. AMD: the forward 32x16, the rest 16x16, 4
# waves, waves_per_eu 1 (the whole register file), within gfx90a/gfx942's 64 KiB of LDS.
# fp32 stops at 256 (``FP32_MAX_HEAD_DIM``): its backward holds K, V, dK and dV in fp32, which at
# 16x16 spills on sm_90 (2 KiB per thread) and needs scratch on gfx942 (124 VGPRs spilled with 4
# waves, 230 with 8), which the AMD kernels may not use.
HD512 = {
    "cuda": {"attn_fwd": _cfg(32, 32, 8, 2), "attn_bwd_dkdv": _cfg(16, 16, 8, 1), "attn_bwd_dq": _cfg(16, 16, 8, 1),
             "attn_bwd_dbias": _cfg(16, 16, 8, 1)},
    "hip": {"attn_fwd": _amd(32, 16, 1), "attn_bwd_dkdv": _amd(16, 16, 1), "attn_bwd_dq": _amd(16, 16, 1),
            "attn_bwd_dbias": _amd(16, 16, 1)},
}


def _hd512(functional: dict[str, Any]) -> bool:
    """Whether the functional is of the head-dim bucket 512 (its configs: ``HD512``)."""
    return functional.get("head_dim") == 512


def _hd512_first(family: str):
    """Decorates a family's config function: the bucket 512 takes its ``HD512`` config (what the
    tuner's candidates start from too), every other bucket the function's."""
    def wrap(configs):
        def pick(arch: str, functional: dict[str, Any]) -> list[dict[str, int]]:
            if _hd512(functional):
                return [HD512[TARGETS[arch][0]][family]]
            return configs(arch, functional)
        pick.__doc__ = configs.__doc__
        return pick
    return wrap


@_hd512_first("attn_fwd")
def _attn_fwd_configs(arch: str, functional: dict[str, Any]) -> list[dict[str, int]]:
    """Forward configs per (functional, arch), largest BLOCK_M first.

    fp16/bf16 without dropout and bias: main + small BLOCK_M.  Not measured per
    arch except sm_90 hd128 (probe on H200: BLOCK_M 128, BLOCK_N 64, 4 warps,
    2 stages was the best of 24 configs for bf16).  hd256 uses 8 warps (the
    128x256 fp32 accumulator) and BLOCK_N 32 where shared memory is smaller than
    sm_90's.  fp16/bf16 with dropout or bias: the small config alone.  fp32: one
    smaller config (twice the bytes per element in shared memory and registers).
    AMD archs: ``_amd_attn_fwd_configs``.  The tuning database will replace these picks.
    """
    hd = functional["head_dim"]
    if TARGETS[arch][0] == "hip":
        return _amd_attn_fwd_configs(functional)
    if functional["dtype"] == "fp32":
        if hd <= 64:
            return [_cfg(64, 32, 4, 2)]
        if hd == 128:
            return [_cfg(64, 32, 4, 2 if arch == "sm_90" else 1)]
        return [_cfg(32, 32, 4, 1)]
    if hd == 256:
        # 8 warps for the 128x256 / 64x256 fp32 accumulators (no spills on sm_90, ptxas -v).
        configs = [_cfg(128, 64 if arch == "sm_90" else 32, 8, 2), _cfg(64, 32, 8, 2)]
    else:
        stages = 3 if hd <= 64 else 2
        if arch == "sm_80" and hd > 64:
            main = _cfg(128, 64, 8, stages)  # A100: 8 warps keep the 128x128 fp32 accumulator in registers
        elif arch == "sm_90" and hd == 128:
            # Timed on the H200 (bench/tune.py, bf16 S4096): 1.05 ms vs 1.26 ms for 128/64/4w/2s.
            main = _cfg(128, 128, 8, 3)
        else:
            main = _cfg(128, 64, 4, stages)
        configs = [main, _cfg(64, 64, 4, stages)]
    # Dropout / bias: the small-BLOCK_M config alone (the main one spills with the Philox block on sm_90).
    return configs if _plain16(functional) else configs[1:]


def _amd_attn_fwd_configs(functional: dict[str, Any]) -> list[dict[str, int]]:
    """AMD forward: 16-bit without dropout and bias: (128, 64) + (64, 64), BLOCK_N 32 at hd256 (the
    128x256 Q tile alone fills the 64 KiB LDS), waves_per_eu 2 up to hd64, 1 above.  16-bit with
    dropout or bias: the small config alone, BLOCK_N 32 from hd128 (64x64 spills in ``generic``).
    fp32: (64, 32), (32, 16) at hd256.  waves_per_eu 2 up to hd32 without bias (with a bias the
    ``generic`` kernels spill at 256 registers), and for the 16-bit hd64 forward without dropout and
    bias; 1 elsewhere."""
    hd = functional["head_dim"]
    e = 2 if hd <= 32 and not functional["bias"] else 1
    if functional["dtype"] == "fp32":
        return [_amd(64, 32, e) if hd <= 128 else _amd(32, 16, e)]
    if _plain16(functional):
        e = 2 if hd <= 64 else 1
        bn = 32 if hd == 256 else 64
        return [_amd(128, bn, e), _amd(64, bn, e)]
    return [_amd(64, 64 if hd <= 64 else 32, e)]


def _attn_bwd_preprocess_configs(arch: str, functional: dict[str, Any]) -> list[dict[str, int]]:
    """One config: a row reduction, BLOCK_M rows per program (8192 elements per tile: no spills in `generic`).

    AMD: the same tile, waves_per_eu 2 (at 4, 128 registers, the hd128 ``generic`` kernels spill)."""
    bm = min(128, 8192 // functional["head_dim"])
    if TARGETS[arch][0] == "hip":
        return [_amd(bm, None, 2)]
    return [_cfg(bm, None, 4, 1)]


# The backward configs measured on an H200 (bench/tune.py: bf16, B·S = 16k, S = 4096, no mask;
# 8 candidates per kernel and head dim, median of do_bench). Used for fp16/bf16 on sm_90 without
# dropout or bias (those variants hold more registers and keep the untimed, spill-checked picks).
# Keyed by head-dim bucket (16 and 32 use the 64 row). ms per kernel, best vs the earlier pick:
#   dkdv hd64 3.04 | hd128 2.61 (was 6.70) | hd256 6.81 (was 10.66)
#   dq   hd64 1.52 | hd128 1.43 (was 1.86) | hd256 2.10 (was 10.59)
_SM90_BWD_TIMED = {
    "dkdv": {64: _cfg(32, 128, 4, 2), 128: _cfg(64, 64, 4, 2), 256: _cfg(32, 32, 4, 1)},
    "dq": {64: _cfg(128, 64, 4, 2), 128: _cfg(64, 64, 4, 2), 256: _cfg(64, 32, 4, 1)},
}


def _plain(functional: dict[str, Any]) -> bool:
    """fp16/bf16 without dropout, bias or softcap: the functionals the timed configs were measured on.
    Softcap keeps a tanh tile live through the step, as dropout keeps its keep mask, so it takes the
    dropout/bias picks (on sm_90 the timed hd128 dK/dV config spilled 441 registers with softcap,
    the dropout pick 40)."""
    return (functional["dtype"] in ("fp16", "bf16") and not functional.get("dropout") and not functional.get("bias")
            and not _optional_on(functional))


@_hd512_first("attn_bwd_dkdv")
def _attn_bwd_dkdv_configs(arch: str, functional: dict[str, Any]) -> list[dict[str, int]]:
    """One config.  BLOCK_N keys per program (dK, dV, K, V stay in registers), BLOCK_M queries per step.

    CUDA fp16/bf16 picks: no register spills in the sm_90 ``aligned`` kernels (ptxas -v), not timed yet.
    fp32 keeps the four ``[BLOCK_N, HEAD_DIM]`` register tiles at the 16-bit element count or below.
    """
    hd = functional["head_dim"]
    fp32 = functional["dtype"] == "fp32"
    if TARGETS[arch][0] == "cuda":
        if fp32:
            if hd <= 64:
                return [_cfg(32, 64, 8, 2)]
            if hd == 128:
                return [_cfg(32, 32, 8, 1)]
            return [_cfg(16, 16, 8, 1)]
        if arch == "sm_90" and _plain(functional):
            return [_SM90_BWD_TIMED["dkdv"][min(hd, 256) if hd > 64 else 64]]
        if hd <= 64:
            return [_cfg(32, 128, 8, 3)]
        if hd == 128:
            return [_cfg(32, 64, 8, 2)]
        return [_cfg(32, 32, 8, 1)]
    # AMD: the same tiles as above at one stage; waves_per_eu 2 at hd16, 1 above (the dK, dV
    # accumulators, K and V stay in registers: hd32 with dropout or bias spills at 256 registers).
    e = 2 if hd <= 16 else 1
    if fp32:
        return [_amd(32, 32, e) if hd <= 64 else _amd(16, 32 if hd == 128 else 16, e)]
    return [_amd(32, 64, e) if hd <= 128 else _amd(16, 32, e)]


@_hd512_first("attn_bwd_dq")
def _attn_bwd_dq_configs(arch: str, functional: dict[str, Any]) -> list[dict[str, int]]:
    """One config.  BLOCK_M queries per program (dQ, Q, dO stay in registers), BLOCK_N keys per step.

    CUDA fp16/bf16 picks: no register spills in the sm_90 ``aligned`` kernels (ptxas -v), not timed yet.
    """
    hd = functional["head_dim"]
    fp32 = functional["dtype"] == "fp32"
    if TARGETS[arch][0] == "cuda":
        if fp32:
            if hd <= 64:
                return [_cfg(32, 64, 4, 2)]
            if hd == 128:
                return [_cfg(32, 32, 4, 1)]
            return [_cfg(16, 32, 8, 1)]
        if arch == "sm_90" and _plain(functional):
            return [_SM90_BWD_TIMED["dq"][min(hd, 256) if hd > 64 else 64]]
        if hd <= 64:
            return [_cfg(64, 64, 4, 3)]
        if hd == 128:
            return [_cfg(64, 32, 4, 2)]
        return [_cfg(32, 32, 8, 1)]
    # AMD: one stage; waves_per_eu 2 for 16-bit up to hd64 and fp32 up to hd32, else 1.
    if fp32:
        return [_amd(32, 32, 2 if hd <= 32 else 1) if hd <= 128 else _amd(16, 16, 1)]
    return [_amd(64, 32, 2 if hd <= 64 else 1) if hd <= 128 else _amd(32, 32, 1)]


@_hd512_first("attn_bwd_dbias")
def _attn_bwd_dbias_configs(arch: str, functional: dict[str, Any]) -> list[dict[str, int]]:
    """One config.  A ``[BLOCK_M, BLOCK_N]`` dBias tile per program; Q, dO per step, K^T, V^T per head.

    Not timed: dBias is a secondary path.
    """
    hd = functional["head_dim"]
    fp32 = functional["dtype"] == "fp32"
    if TARGETS[arch][0] == "cuda":
        if hd <= 64:
            return [_cfg(32, 32, 4, 2) if fp32 else _cfg(64, 64, 4, 2)]
        if hd == 128:
            return [_cfg(32, 32, 4, 1) if fp32 else _cfg(32, 64, 4, 2)]
        return [_cfg(16, 32, 4, 1) if fp32 else _cfg(32, 32, 8, 1)]
    # AMD: waves_per_eu 2 up to hd32, else 1.
    e = 2 if hd <= 32 else 1
    if hd <= 64:
        return [_amd(32, 32, e) if fp32 else _amd(64, 32, e)]
    if hd == 128:
        # fp32 with dropout: 32 x 32 spills 3 VGPRs on gfx90a (its Philox quads since the 16 x 16 rule).
        return [_amd(16, 32, e) if fp32 and functional["dropout"] else _amd(32, 32, e)]
    return [_amd(16, 16, e) if fp32 else _amd(16, 32, e)]


# --------------------------------------------------------------------------
# Tuning candidates (the tuner's search space; python/tuning.py has the database)
# --------------------------------------------------------------------------
# CUDA only: the configs around the region the hand-timed picks came from, pruned by a shared
# memory estimate (the compile driver still checks the real figure; a tuning build drops what does
# not fit instead of failing). AMD archs have no GPU here to tune on: their candidates are their
# configs. Each list includes the heuristic's configs, so the fallback is always a candidate.

def _fits(arch: str, functional: dict[str, Any], tiles: int, rows: int) -> bool:
    """``tiles`` [rows, head_dim] tiles of the functional's dtype in shared memory fit the arch."""
    return tiles * rows * functional["head_dim"] * ELEMENT_SIZE[functional["dtype"]] <= SHARED_MEMORY_LIMIT[arch]


def _candidates(arch, functional, heuristic, shapes, streamed, resident):
    """The heuristic's configs, then those of ``shapes`` ((BLOCK_M, BLOCK_N, warps, stages)) whose
    shared memory fits: two ``streamed`` tiles ("m": BLOCK_M rows, "n": BLOCK_N rows) per stage and
    ``resident`` = (tiles, "m" or "n") held for the whole program. AMD archs, the optional axes'
    functionals (the tuner has no reference with them yet) and head dim 512 (``HD512``: the one
    config that fits the registers): the heuristic's."""
    out = list(heuristic(arch, functional))
    if TARGETS[arch][0] != "cuda" or _optional_on(functional) or _hd512(functional):
        return out
    for bm, bn, w, st in shapes:
        rows = {"m": bm, "n": bn}
        c = _cfg(bm, bn, w, st)
        if (c not in out and _fits(arch, functional, 2 * st, rows[streamed])
                and _fits(arch, functional, resident[0], rows[resident[1]])):
            out.append(c)
    return out


def _attn_fwd_candidates(arch: str, functional: dict[str, Any]) -> list[dict[str, int]]:
    """Forward: BLOCK_M 64/128 x BLOCK_N 32/64/128 with 4 or 8 warps and 2 or 3 stages (8 shapes);
    K and V tiles of every stage plus the Q tile must fit shared memory."""
    shapes = [(128, 64, 4, 2), (128, 128, 8, 3), (128, 64, 8, 2), (128, 32, 4, 3), (128, 128, 4, 2),
              (64, 64, 4, 2), (64, 64, 4, 3), (64, 128, 4, 2)]
    if functional["dtype"] == "fp32":
        shapes = [(64, 32, 4, 2), (64, 32, 4, 1), (32, 32, 4, 1), (64, 64, 4, 2), (32, 64, 4, 2), (64, 32, 8, 2)]
    return _candidates(arch, functional, _attn_fwd_configs, shapes, "n", (1, "m"))


def _attn_bwd_dkdv_candidates(arch: str, functional: dict[str, Any]) -> list[dict[str, int]]:
    """dK/dV: BLOCK_M queries per step x BLOCK_N keys per program (8 shapes); Q and dO tiles of
    every stage plus the K and V tiles must fit shared memory."""
    shapes = [(32, 128, 4, 2), (64, 64, 4, 2), (32, 64, 4, 2), (64, 128, 8, 2), (32, 32, 4, 1), (16, 64, 4, 2),
              (64, 32, 4, 2), (32, 128, 8, 3)]
    return _candidates(arch, functional, _attn_bwd_dkdv_configs, shapes, "m", (2, "n"))


def _attn_bwd_dq_candidates(arch: str, functional: dict[str, Any]) -> list[dict[str, int]]:
    """dQ: BLOCK_M queries per program x BLOCK_N keys per step (8 shapes); K and V tiles of every
    stage plus the Q and dO tiles must fit shared memory."""
    shapes = [(128, 64, 4, 2), (64, 64, 4, 2), (64, 32, 4, 1), (128, 32, 8, 2), (64, 128, 4, 2), (32, 64, 4, 2),
              (128, 128, 8, 2), (32, 32, 4, 1)]
    return _candidates(arch, functional, _attn_bwd_dq_configs, shapes, "n", (2, "m"))


def _gluon_cfg(bm, bn, stages, maxnreg=168, **knobs):
    """A Gluon config: 4 warps in the default partition (the workers add theirs), a register cap
    (it decides how many CTAs fit an SM: ``CTAS_PER_SM``, which sizes a persistent kernel's grid),
    and the kernel's performance knobs."""
    c = {"BLOCK_M": bm}
    if bn is not None:
        c["BLOCK_N"] = bn
    c.update(STAGES=stages, num_warps=4, maxnreg=maxnreg, **knobs)
    return c


#: The longest key sequence of a causal (or windowed) call that the Gluon forward's short causal
#: kernel serves (``_attn_fwd_gluon_configs``); dispatch reads it from the kernel's config.
SHORT_CAUSAL_MAX_SEQLEN_K = 1024


def _attn_fwd_gluon_configs(arch: str, functional: dict[str, Any]) -> list[dict[str, int]]:
    """One config per head dim, the best of the variant sweep on the H200 (test/gluon/sweep_fwd.py,
    bf16, B·S = 16k, H·D = 2048, S 1k..16k, causal and not; ratio to cuDNN, geomean non-causal / causal):

    * hd64:  two CTAs per SM (maxnreg 80: consumers 104 registers, loader 24), BLOCK_N 64, serial
      softmax/PV order, step 0 unmasked when full -- 0.958 / 0.968 (2 consumers, BLOCK_N 128,
      overlap: 0.82 / 0.80: the short CTAs' prologue and epilogue are not hidden at one CTA per SM);
    * hd128: two consumers, BLOCK_N 128, 2 stages, FA3's intra-warpgroup overlap, persistent (one
      CTA per SM walking the tiles, the next tile's Q loaded while the current one runs, causal
      tiles paired heavy with light), step 0 unmasked when full -- 0.930 / 0.983 (one CTA per
      tile: 0.885 / 0.937);
    * hd256: the same with BLOCK_N 64 (shared memory) -- 0.976 / 1.041.

    hd128 (fixed lengths, no dropout) also compiles the short causal kernel: one consumer warpgroup
    (BLOCK_M 64, BLOCK_N 64), two CTAs per SM (232 registers each), persistent.  Dispatch takes it
    for a causal or windowed call whose keys are at most ``SHORT_CAUSAL_MAX_SEQLEN_K`` (the config
    key says so; 0 or absent: a kernel for every call).  H100, bf16, B*S = 16k, H*D = 2048,
    sweep_fwd.py, ratio to cuDNN, short / shipped: causal S512 0.98 / 0.75, S1k 0.99 / 0.92, S2k
    0.98 / 1.06, S4k 1.00 / 1.12; non-causal 0.78-0.87 / 0.96-1.01 (so causal only, up to 1k keys).
    At hd64 the same shape lost everywhere (causal S512 0.71-0.85 / 0.86).
    """
    hd = functional["head_dim"]
    knobs = dict(NUM_CONSUMERS=2, LOADER_REGS=24, SCHED=0, Q_BUFS=2, CTAS_PER_SM=1)
    if hd == 64:
        knobs["CTAS_PER_SM"] = 2
        return [_gluon_cfg(128, 64, 2, maxnreg=80, CONSUMER_REGS=104, PEEL_FULL=1, OVERLAP=0, PERSISTENT=0, **knobs)]
    if hd == 128:
        # Packed batches and dropout: one CTA per tile (the persistent schedule walks fixed-length
        # heads and has no dropout: with it, 102 spill instructions and 0.89x the one-CTA-per-tile
        # kernel, non-causal and causal).  Dropout takes the LPT order over all heads (SCHED 1: its
        # heavy causal tiles run first; H200, bf16 B4 H16 S4096 p 0.1, kernel level, causal 119 ->
        # 137 TFLOP/s, non-causal 189 -> 187).
        persistent = 0 if functional.get("varlen") or functional.get("dropout") else 1
        if functional.get("dropout") and not functional.get("varlen"):
            knobs["SCHED"] = 1
        configs = [_gluon_cfg(128, 128, 2, CONSUMER_REGS=240, PEEL_FULL=1, OVERLAP=1, PERSISTENT=persistent, **knobs)]
        if not functional.get("varlen") and not functional.get("dropout"):
            short = dict(knobs, NUM_CONSUMERS=1, CTAS_PER_SM=2, SHORT_CAUSAL_MAX_SEQLEN_K=SHORT_CAUSAL_MAX_SEQLEN_K)
            configs.append(_gluon_cfg(64, 64, 2, maxnreg=128, CONSUMER_REGS=232, PEEL_FULL=1, OVERLAP=1, PERSISTENT=1,
                                      **short))
        return configs
    return [_gluon_cfg(128, 64, 2, CONSUMER_REGS=240, PEEL_FULL=0, OVERLAP=1, PERSISTENT=0, **knobs)]


def _attn_fwd_gluon_fp8_configs(arch: str, functional: dict[str, Any]) -> list[dict[str, int]]:
    """One config per head dim, measured on the H200 through Triton's JIT (test/gluon/check_fwd_fp8.py,
    bench/results/h200_fp8_fwd_issue19.md): two consumers in the serial order (S, softmax, PV per step:
    the overlapped order is 8-10 % slower in fp8) taking turns on the tensor cores (PINGPONG); BLOCK_N
    256 at hd128 (+8 % over 128; 80-92 bytes spilled), 128 at hd64 and hd256 (shared memory)."""
    bn = 256 if functional["head_dim"] == 128 else 128
    return [_gluon_cfg(128, bn, 2, CONSUMER_REGS=240, NUM_CONSUMERS=2, LOADER_REGS=24, PEEL_FULL=0, OVERLAP=0, SCHED=0,
                       PINGPONG=1)]


def _transpose_v_fp8_configs(arch: str, functional: dict[str, Any]) -> list[dict[str, int]]:
    """64 keys per program (two 32-key groups of the permutation)."""
    return [{"BLOCK_N": 64, "num_warps": 4, "num_stages": 1}]


def _attn_bwd_gluon_configs(arch: str, functional: dict[str, Any]) -> list[dict[str, int]]:
    """One config: 128 keys per CTA (two compute warpgroups), 64 queries per step, a 2-stage Q/dO ring.

    Picked by the variant sweep on the H200 (test/gluon/sweep_bwd.py, same grid as the forward), for
    both head dims: the mask applied by a uniform branch on boundary steps only (MASK_MODE 0), 240
    registers for the compute worker -- geomean 0.995 of cuDNN at hd128 and 0.973 at hd64 (the
    variants with the mask on every step or a split walk: 0.85-0.93 at hd128).

    hd256 (``bwd_wide.py``): 64 keys per CTA, the head dim split between the warpgroups, the same mask
    handling.  Only its dK/dV kernel is compiled (``GLUON_FUSED_DQ_MAX_HEAD_DIM``); the fused config
    below stays for test/gluon/check_bwd.py's hd256 dQ cases.  With dQ (DQ_IN_RING 1) each step's
    fp32 dQ tile is written over its own ring slot once the slot's Q and dO are read, which frees
    the shared memory for a 2-stage ring: check_bwd.py --bench on an H100, cuDNN beside it,
    0.60-0.75 -> 0.72-0.83 of cuDNN (bf16 S 1k-16k, full and causal; 233 -> 291 TFLOP/s at S16k
    full; geomean 0.653 -> 0.780, and 0.793 with WALK 1: the fused kernel's best, below the split).
    Without dQ (the dK/dV kernel every hd256 backward runs) the ring has 2 stages too (it fits at
    230,896 B with no dQ tile): check_bwd.py --bench --compute-dq 0 on an H100, geomean 1.45x over
    one stage (S16k full 441 -> 678 TFLOP/s counted as a whole backward).

    hd128 walks its query steps block-major with the GQA group's heads innermost, from the last query
    block down (WALK 1: the CTAs of one K/V head then read the same Q/dO tiles together, in L2):
    test/gluon/check_bwd.py --bench-gqa on the H200, cuDNN beside it, Hq/Hk 28/4 S2k 0.885 -> 1.011,
    64/8 S2k 0.895 -> 1.083, every GQA row 0.91-1.10 (0.89-1.09 head-major), the MHA hd128 grid
    unchanged within noise (bench/results/h200_gluon_bwd_issue17.md).  hd256 walks the same way (the
    H100 figures above), and so does hd64: check_bwd.py --bench --buckets 64 on an H100, cuDNN beside
    it, geomean 0.995 -> 1.019 (cells 0.924-1.040 -> 0.951-1.081).
    """
    if functional["head_dim"] > 128:
        dq_in_ring = 1 if functional["dq"] else 0
        return [_gluon_cfg(64, 64, 2, MASK_MODE=0, CONS_REGS=240, DK_SS=0, PERSISTENT=0,
                           DESC_PER_STEP=0, WALK=1, DQ_IN_RING=dq_in_ring)]
    return [_gluon_cfg(64, 128, 2, MASK_MODE=0, CONS_REGS=240, DK_SS=0, PERSISTENT=0, DESC_PER_STEP=0, WALK=1,
                       DQ_IN_RING=0)]


def _attn_bwd_gluon_dq_configs(arch: str, functional: dict[str, Any]) -> list[dict[str, int]]:
    """``GLUON_DQ_CONFIGS``' entry for the head dim: 128 query rows (two consumer warpgroups)."""
    block_n, k_stages, v_stages = GLUON_DQ_CONFIGS[functional["head_dim"]]
    return [{"BLOCK_M": 128, "BLOCK_N": block_n, "K_STAGES": k_stages, "V_STAGES": v_stages, "CONSUMER_REGS": 240,
             "LOADER_REGS": 24, "num_warps": 4, "maxnreg": 168}]


def _attn_bwd_gluon_rows_configs(arch: str, functional: dict[str, Any]) -> list[dict[str, int]]:
    """Preprocess / dQ convert: row kernels, 4096 elements per tile (8192 spills in the fp16 preprocess)."""
    return [_cfg(4096 // functional["head_dim"], None, 4, 1)]


def _attn_bwd_gluon_key_rows_configs(arch: str, functional: dict[str, Any]) -> list[dict[str, int]]:
    """The dK/dV partials' conversion: a row kernel over keys, 4096 elements per tile like the query-row ones."""
    return [{"BLOCK_N": 4096 // functional["head_dim"], "num_warps": 4, "num_stages": 1}]


def _attn_bwd_dsink_configs(arch: str, functional: dict[str, Any]) -> list[dict[str, int]]:
    """One config: a sum over every query row of one head, 1024 rows per step."""
    return [_amd(1024, None, 4) if TARGETS[arch][0] == "hip" else _cfg(1024, None, 4, 1)]


def _attn_decode_configs(arch: str, functional: dict[str, Any]) -> list[dict[str, int]]:
    """Row tiles 16 (a GQA group of up to 16 query rows, the common decode step), 32 on NVIDIA (4
    heads x 8 tokens: 1.15x over 64 at B8 Sk4k, check_decode.py --sweep-rows) and 64 (8 heads x 8
    tokens of speculative decoding), BLOCK_N 64 (32 at hd256: two [256, 32] 16-bit tiles per stage),
    3 stages on NVIDIA (the loop is a stream of K/V loads; the pipeline keeps them in flight), 1 on
    AMD. Paged: each tile once for pages of at least BLOCK_N keys and once per smaller page size
    (``SMALL_PAGE`` 16, 32: the block's page ids as a vector, kernels/decode/kvcache.py); the runtime
    takes the one for the call's page. Untimed picks, spill-free."""
    wide = functional["head_dim"] > 128
    bn = 32 if wide else 64
    if TARGETS[arch][0] == "hip":
        # BLOCK_N 32: at 64 the paged kernels need a 36-byte stack object on every AMD arch. The
        # 64-row tile: 8 waves at hd256 (4 need the stack object on gfx90a), and no SMALL_PAGE
        # kernel (at hd 64/128 it needs the stack object on gfx90a or gfx950, at 4 or 8 waves):
        # pages of 16 take the 16-row tile for every row count.
        tiles = [_cfg(64, 32, 8, 1, 1) if wide else _amd(64, 32, 2), _amd(16, 32, 2)]
        small_page_tiles = (16,)
    else:
        # 64 x 256 fp32 accumulator: 8 warps (4 spill at 255 registers).
        tiles = [_cfg(bm, bn, 8 if wide and bm == 64 else 4, 3) for bm in (64, 32, 16)]
        small_page_tiles = (64, 32, 16)
    if not functional["paged"]:
        return tiles
    return [dict(c, SMALL_PAGE=page) if page else c for c in tiles for page in (0, 16, 32)
            if page < c["BLOCK_N"] and (page == 0 or c["BLOCK_M"] in small_page_tiles)]


def _attn_decode_combine_configs(arch: str, functional: dict[str, Any]) -> list[dict[str, int]]:
    """One config: 32 splits' partials per step (one [32, HEAD_DIM] fp32 tile)."""
    return [_amd(32, None, 4) if TARGETS[arch][0] == "hip" else _cfg(32, None, 4, 1)]


def _kvcache_append_configs(arch: str, functional: dict[str, Any]) -> list[dict[str, int]]:
    """One config: 16 tokens of one KV head per program (a copy)."""
    return [_amd(16, None, 4) if TARGETS[arch][0] == "hip" else _cfg(16, None, 4, 1)]


def _debug_dropout_mask_configs(arch: str, functional: dict[str, Any]) -> list[dict[str, int]]:
    """One config (a debug path); AMD: waves_per_eu 4."""
    return [_amd(32, 64, 4) if TARGETS[arch][0] == "hip" else _cfg(32, 64, 4, 1)]


# --------------------------------------------------------------------------
# Kernel families
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    module: str                     #: source file, relative to python/
    function: str                   #: @triton.jit function in it
    axes: dict[str, list]           #: functional axes, in id order
    args: list[str]                 #: every argument, in declaration order
    constexprs: list[str]
    signature: Any                  #: (functional, config) -> {arg: type}
    configs: Any                    #: (arch, functional) -> [config], largest BLOCK_M first
    #: Archs the family is compiled for (None = every target).  The Gluon backend is sm_90 only.
    archs: tuple[str, ...] | None = None
    #: ``triton`` (``triton.language``, ASTSource) or ``gluon`` (GluonASTSource).
    language: str = "triton"
    #: Variants compiled per config: ``aligned`` + one ``generic`` (portable families), or just
    #: ``aligned`` (the Gluon backend: its inputs always meet TMA's 16-byte rules).
    variants: tuple[str, ...] = ("aligned", "generic")
    #: Packages under ``kernels/`` whose sources the family's kernels read: the compile cache
    #: key covers exactly these, so editing one backend does not recompile the other.
    sources: tuple[str, ...] = ("flash",)
    #: (arch, functional) -> [config]: the tuner's search space (``tune.py``; compiled only by a
    #: tuning build), or None: the family is not tuned and ships its ``configs`` alone.
    candidates: Any = None
    #: Axes whose off value is left out of the family's functionals and kernel ids.
    optional_axes: tuple[str, ...] = ()


def _family(name, module, args, axes, configs, candidates=None, sources=("flash",)) -> Family:
    constexprs = [a for a in args if a in _CONSTEXPRS]
    return Family(name=name, module=module, function=name, axes=axes, args=list(args), constexprs=constexprs,
                  signature=_signature_of(list(args), constexprs), configs=configs, candidates=candidates,
                  sources=sources, optional_axes=OPTIONAL_AXES)


_ATTN_AXES = {"dtype": DTYPES, "tf32": TF32, "head_dim": HEAD_DIMS, "dropout": DROPOUT, "bias": BIAS,
              "softcap": SOFTCAP, "alibi": ALIBI}
#: The families that take V's own head dim (attn_bwd_preprocess reads O and dO at V's head dim).
_ATTN_AXES_V = dict(_ATTN_AXES, head_dim_v=HEAD_DIM_V)

ATTN_FWD = _family("attn_fwd", "kernels/flash/fwd.py", ATTN_FWD_ARGS, dict(_ATTN_AXES, sinks=SINKS, head_dim_v=HEAD_DIM_V),
                   _attn_fwd_configs, _attn_fwd_candidates)
ATTN_BWD_PREPROCESS = _family("attn_bwd_preprocess", "kernels/flash/bwd_preprocess.py", ATTN_BWD_PREPROCESS_ARGS,
                              {"dtype": DTYPES, "head_dim": HEAD_DIMS}, _attn_bwd_preprocess_configs)
ATTN_BWD_DKDV = _family("attn_bwd_dkdv", "kernels/flash/bwd_dkdv.py", ATTN_BWD_DKDV_ARGS, dict(_ATTN_AXES_V),
                        _attn_bwd_dkdv_configs, _attn_bwd_dkdv_candidates)
ATTN_BWD_DQ = _family("attn_bwd_dq", "kernels/flash/bwd_dq.py", ATTN_BWD_DQ_ARGS, dict(_ATTN_AXES_V),
                      _attn_bwd_dq_configs, _attn_bwd_dq_candidates)
ATTN_BWD_DBIAS = _family("attn_bwd_dbias", "kernels/flash/bwd_dbias.py", ATTN_BWD_DBIAS_ARGS,
                         {"dtype": DTYPES, "tf32": TF32, "head_dim": HEAD_DIMS, "dropout": DROPOUT},
                         _attn_bwd_dbias_configs)
ATTN_BWD_DSINK = _family("attn_bwd_dsink", "kernels/flash/bwd_dsink.py", ATTN_BWD_DSINK_ARGS,
                         {"dtype": ["fp32"]}, _attn_bwd_dsink_configs)
DEBUG_DROPOUT_MASK = _family("debug_dropout_mask", "kernels/flash/debug_dropout.py", DEBUG_DROPOUT_MASK_ARGS,
                             {"dtype": ["fp32"]}, _debug_dropout_mask_configs)
#: KV-cache decoding: 16-bit, head dims 64/128/256 (smaller ones padded to 64), dense or paged caches.
DECODE_DTYPES = ["fp16", "bf16"]
DECODE_HEAD_DIMS = [64, 128, 256]
PAGED = [False, True]
#: Their own package (kernels/decode/): editing it recompiles only them.
_DECODE_SOURCES = ("flash", "decode")
ATTN_DECODE = _family("attn_decode", "kernels/decode/decode.py", ATTN_DECODE_ARGS,
                      {"dtype": DECODE_DTYPES, "head_dim": DECODE_HEAD_DIMS, "paged": PAGED}, _attn_decode_configs,
                      sources=_DECODE_SOURCES)
ATTN_DECODE_COMBINE = _family("attn_decode_combine", "kernels/decode/decode_combine.py", ATTN_DECODE_COMBINE_ARGS,
                              {"dtype": DECODE_DTYPES, "head_dim": DECODE_HEAD_DIMS}, _attn_decode_combine_configs,
                              sources=_DECODE_SOURCES)
KVCACHE_APPEND = _family("kvcache_append", "kernels/decode/kvcache_append.py", KVCACHE_APPEND_ARGS,
                         {"dtype": DECODE_DTYPES, "head_dim": DECODE_HEAD_DIMS, "paged": PAGED},
                         _kvcache_append_configs, sources=_DECODE_SOURCES)



def _gluon_family(name, module, args, axes, configs, language="gluon") -> Family:
    """A family of the Gluon backend: sm_90 only, one ``aligned`` variant per config."""
    constexprs = [a for a in args if a in _CONSTEXPRS]
    return Family(name=name, module=module, function=name, axes=axes, args=list(args), constexprs=constexprs,
                  signature=_gluon_signature_of(name, list(args), constexprs), configs=configs,
                  archs=("sm_90",), language=language, variants=("aligned",), sources=("flash", "flash_gluon"),
                  optional_axes=GLUON_OPTIONAL_AXES)


GLUON_DTYPES = ["fp16", "bf16"]
ATTN_FWD_GLUON = _gluon_family("attn_fwd_gluon", "kernels/flash_gluon/fwd.py", ATTN_FWD_GLUON_ARGS,
                               {"dtype": GLUON_DTYPES, "head_dim": [64, 128, 256], "varlen": VARLEN,
                                "dropout": DROPOUT},
                               _attn_fwd_gluon_configs)
ATTN_BWD_GLUON_PREPROCESS = _gluon_family(
    "attn_bwd_gluon_preprocess", "kernels/flash_gluon/bwd_preprocess.py", ATTN_BWD_GLUON_PREPROCESS_ARGS,
    {"dtype": GLUON_DTYPES, "head_dim": [64, 128, 256]}, _attn_bwd_gluon_rows_configs, language="triton")
ATTN_BWD_GLUON = _gluon_family("attn_bwd_gluon", "kernels/flash_gluon/bwd.py", ATTN_BWD_GLUON_ARGS,
                               {"dtype": GLUON_DTYPES, "head_dim": [64, 128, 256], "dq": [True, False],
                                "varlen": VARLEN, "dropout": DROPOUT},
                               _attn_bwd_gluon_configs)
#: Shipped at hd256 only (``GLUON_DQ_SHIPPED_HEAD_DIMS``): there the dK/dV-only kernel always pairs with a
#: separate dQ, and this one beat the portable ``attn_bwd_dq`` (H100, check_bwd --bench --gluon-dq, 2026-12-06:
#: the hd256 backward 1.123x cuDNN geomean vs 0.977 with the portable dQ). At hd64/128 (a separate dQ only
#: in deterministic mode) it measured slower (hd64 0.833x vs 0.909x), so the runtime keeps the portable
#: dQ there; python/tests/test_gluon_dq.py still compiles every bucket of ``GLUON_DQ_CONFIGS``.
ATTN_BWD_GLUON_DQ = _gluon_family("attn_bwd_gluon_dq", "kernels/flash_gluon/bwd_dq.py", ATTN_BWD_GLUON_DQ_ARGS,
                                  {"dtype": GLUON_DTYPES, "head_dim": GLUON_DQ_SHIPPED_HEAD_DIMS, "varlen": VARLEN,
                                   "dropout": DROPOUT},
                                  _attn_bwd_gluon_dq_configs)
#: fp8 (e4m3) forward: Q, K, V in ``float8_e4m3fn``, O in bf16 (ABI.md).
FP8_DTYPES = ["fp8e4nv"]
ATTN_FWD_GLUON_FP8 = _gluon_family("attn_fwd_gluon_fp8", "kernels/flash_gluon/fwd_fp8.py", ATTN_FWD_GLUON_FP8_ARGS,
                                   {"dtype": FP8_DTYPES, "head_dim": [64, 128, 256]}, _attn_fwd_gluon_fp8_configs)
TRANSPOSE_V_FP8 = _gluon_family("transpose_v_fp8", "kernels/flash_gluon/fwd_fp8_vt.py", TRANSPOSE_V_FP8_ARGS,
                                {"dtype": FP8_DTYPES, "head_dim": [64, 128, 256]}, _transpose_v_fp8_configs,
                                language="triton")
ATTN_BWD_GLUON_DQ_CONVERT = _gluon_family(
    "attn_bwd_gluon_dq_convert", "kernels/flash_gluon/bwd_dq_convert.py", ATTN_BWD_GLUON_DQ_CONVERT_ARGS,
    {"dtype": GLUON_DTYPES, "head_dim": [64, 128, 256]}, _attn_bwd_gluon_rows_configs, language="triton")

ATTN_BWD_GLUON_DKDV_CONVERT = _gluon_family(
    "attn_bwd_gluon_dkdv_convert", "kernels/flash_gluon/bwd_dkdv_convert.py", ATTN_BWD_GLUON_DKDV_CONVERT_ARGS,
    {"dtype": GLUON_DTYPES, "head_dim": [64, 128, 256]}, _attn_bwd_gluon_key_rows_configs, language="triton")

PORTABLE_FAMILIES = [ATTN_FWD, ATTN_BWD_PREPROCESS, ATTN_BWD_DKDV, ATTN_BWD_DQ, ATTN_BWD_DBIAS, ATTN_BWD_DSINK,
                     DEBUG_DROPOUT_MASK, ATTN_DECODE, ATTN_DECODE_COMBINE, KVCACHE_APPEND]
GLUON_FAMILIES = [ATTN_FWD_GLUON, ATTN_BWD_GLUON_PREPROCESS, ATTN_BWD_GLUON, ATTN_BWD_GLUON_DQ,
                  ATTN_BWD_GLUON_DQ_CONVERT, ATTN_BWD_GLUON_DKDV_CONVERT, ATTN_FWD_GLUON_FP8, TRANSPOSE_V_FP8]
FAMILIES = PORTABLE_FAMILIES + GLUON_FAMILIES


def family(name: str) -> Family:
    for f in FAMILIES:
        if f.name == name:
            return f
    raise KeyError(name)


def functionals(family: Family) -> list[dict[str, Any]]:
    """Cartesian product of the family's axes, in axis order; ``tf32=True`` only with ``dtype="fp32"``;
    fp32 up to ``FP32_MAX_HEAD_DIM``; an ``OPTIONAL_AXES`` axis on only for fp16/bf16 without dropout
    and bias, one at a time, up to ``OPTIONAL_AXES_MAX_HEAD_DIM``, and left out when off; ``head_dim_v``
    only in the ``HEAD_DIM_V_PAIRS``; the Gluon backward's ``dq=True`` up to ``GLUON_FUSED_DQ_MAX_HEAD_DIM``."""
    out = [{}]
    for axis, values in family.axes.items():
        out = [{**f, axis: v} for f in out for v in values]
    out = [f for f in out if not (f.get("tf32") and f["dtype"] != "fp32")]
    # The optional axes (softcap, alibi, sinks): 16-bit, without dropout, bias or each other.
    out = [f for f in out if not (_optional_on(f) and (f["dtype"] == "fp32" or f["dropout"] or f["bias"]))]
    out = [f for f in out if sum(bool(f.get(a)) for a in OPTIONAL_AXES) <= 1]
    out = [f for f in out if not (_optional_on(f) and f.get("head_dim", 0) > OPTIONAL_AXES_MAX_HEAD_DIM)]
    out = [f for f in out if not (f.get("head_dim_v") and HEAD_DIM_V_PAIRS.get(f["head_dim"]) != f["head_dim_v"])]
    out = [f for f in out if not (f["dtype"] == "fp32" and f.get("head_dim", 0) > FP32_MAX_HEAD_DIM)]
    out = [f for f in out if not (f.get("dq") and f["head_dim"] > GLUON_FUSED_DQ_MAX_HEAD_DIM)]
    return [{k: v for k, v in f.items() if not (k in family.optional_axes and not v)} for f in out]


def module_name(family: Family) -> str:
    """Importable module name of the family's source (``kernels.flash.fwd``), with python/ on sys.path."""
    assert family.module.endswith(".py")
    return family.module[:-3].replace("/", ".")


# --------------------------------------------------------------------------
# Kernel specs
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """Everything needed to compile one kernel and to describe it to the runtime."""
    id: str
    family: str
    module: str
    function: str
    language: str                               #: "triton" | "gluon"
    sources: tuple[str, ...]                    #: packages under kernels/ the kernel reads
    functional: dict[str, Any]
    config: dict[str, int]
    variant: str                                #: "aligned" | "generic"
    arch: str
    target: dict[str, Any]                      #: {"backend", "arch", "warp_size"}
    signature: dict[str, str]                   #: every argument -> type ("constexpr" for constexprs)
    constexprs: dict[str, Any]
    divisibility: dict[str, int]                #: runtime argument -> tt.divisibility (1 = no hint)
    #: The tuning-database cells this kernel won (``tuning.Database.winners``): dispatch takes it
    #: for calls in them. Not part of the image (not in ``to_json``, the cache key).
    tuned_for: tuple = ()
    #: Compiled only because the database (or a tuning build) names it: dispatch's heuristic
    #: never picks it, so the heuristic decides among exactly its own configs.
    tuned_only: bool = False
    #: Gluon families: the cells where the database measured the portable backend faster for the
    #: operator (``Auto`` takes the portable kernels there).
    portable_for: tuple = ()

    @property
    def args(self) -> list[dict[str, Any]]:
        """Non-constexpr arguments in launch (ABI) order, as in the per-kernel JSON."""
        return [{"name": n, "type": t, "divisibility": self.divisibility[n]}
                for n, t in self.signature.items() if t != "constexpr"]

    @property
    def attrs(self) -> dict[tuple[int, ...], list[list]]:
        """``ASTSource`` attrs: ``{(arg index,): [["tt.divisibility", d]]}`` for hinted arguments."""
        names = list(self.signature)
        return {(names.index(n),): [["tt.divisibility", d]]
                for n, d in self.divisibility.items() if d != 1}

    @property
    def options(self) -> dict[str, int]:
        """Options for ``backend.parse_options`` (Gluon: the register cap instead of pipelining stages;
        HIP: ``waves_per_eu`` too, the ``amdgpu-waves-per-eu`` occupancy target of the AMD backend)."""
        if "maxnreg" in self.config:
            return {"num_warps": self.config["num_warps"], "maxnreg": self.config["maxnreg"]}
        options = {"num_warps": self.config["num_warps"], "num_stages": self.config["num_stages"]}
        if self.target["backend"] == "hip" and "waves_per_eu" in self.config:
            options["waves_per_eu"] = self.config["waves_per_eu"]
        return options

    @property
    def image_ext(self) -> str:
        return IMAGE_EXT[self.target["backend"]]

    def to_json(self) -> dict[str, Any]:
        """Canonical dict of everything that determines the compiled image (used for the cache key)."""
        return {
            "id": self.id, "family": self.family, "module": self.module, "function": self.function,
            "language": self.language,
            "signature": self.signature, "constexprs": self.constexprs,
            "attrs": [[list(k), v] for k, v in sorted(self.attrs.items())],
            "target": self.target, "options": self.options,
        }

    def canonical(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))


_AXIS_ABBREV = {"tf32": "tf", "dropout": "drop", "head_dim_v": "hdv"}


def kernel_id(family: Family, functional: dict[str, Any], config: dict[str, int], variant: str) -> str:
    """Stable, unique, file-name safe id: ``attn_bwd_dkdv-fp32-tf1-hd128-drop0-bias1-m32n32w8s1-aligned``.

    A config with ``waves_per_eu`` (the AMD ones) adds ``e<waves_per_eu>``: ``...-m128n64w4s1e2-aligned``.
    """
    parts = [family.name]
    for axis in family.axes:
        if axis in family.optional_axes and axis not in functional:
            continue
        v = functional[axis]
        if axis == "dtype":
            parts.append(str(v))
        elif axis == "head_dim":
            parts.append(f"hd{v}")
        elif isinstance(v, bool):
            parts.append(f"{_AXIS_ABBREV.get(axis, axis)}{int(v)}")
        else:
            parts.append(f"{_AXIS_ABBREV.get(axis, axis)}{v}")
    parts.append(config_tag(config))
    parts.append(variant)
    return "-".join(parts)


#: Config keys that decide which calls a kernel serves, not how fast it runs (the decode kernels'
#: ``SMALL_PAGE``: the page size they read): the ``generic`` variant has a kernel per value.
SERVING_KEYS = ("SMALL_PAGE",)


def _serves(config: dict[str, int]) -> tuple[int, ...]:
    """The calls a config's kernel serves, as its ``SERVING_KEYS`` values (0 where absent)."""
    return tuple(config.get(k, 0) for k in SERVING_KEYS)


def config_tag(config: dict[str, int]) -> str:
    """The config part of a kernel id, also the name the tuning database uses: ``m128n64w4s2``
    (``e<waves_per_eu>`` appended on AMD; Gluon: ``m<BLOCK_M>n<BLOCK_N>st<STAGES>r<maxnreg>``; the
    decode kernels of small pages: ``m16n64p16w4s3``)."""
    bm = f"m{config['BLOCK_M']}" if "BLOCK_M" in config else ""  # transpose_v_fp8: keys only
    bn = f"n{config['BLOCK_N']}" if "BLOCK_N" in config else ""
    bn += f"p{config['SMALL_PAGE']}" if "SMALL_PAGE" in config else ""
    if "STAGES" in config:  # Gluon: the ring depth and register cap are the config
        return f"{bm}{bn}st{config['STAGES']}r{config['maxnreg']}"
    if "K_STAGES" in config:  # Gluon with a K and a V ring of their own (attn_bwd_gluon_dq)
        return f"{bm}{bn}k{config['K_STAGES']}v{config['V_STAGES']}r{config['maxnreg']}"
    waves = f"e{config['waves_per_eu']}" if "waves_per_eu" in config else ""
    return f"{bm}{bn}w{config['num_warps']}s{config['num_stages']}{waves}"


def _spec(family: Family, arch: str, functional: dict[str, Any], config: dict[str, int], variant: str) -> KernelSpec:
    backend, target_arch, warp_size = target_of(arch)
    signature = family.signature(functional, config)
    values = {"HEAD_DIM": functional.get("head_dim"), "HEAD_DIM_V": functional.get("head_dim_v", 0),
              "BLOCK_M": config.get("BLOCK_M"),
              "BLOCK_N": config.get("BLOCK_N"), "DROPOUT": bool(functional.get("dropout")),
              "HAS_BIAS": bool(functional.get("bias")), "SOFTCAP": bool(functional.get("softcap")),
              "HAS_ALIBI": bool(functional.get("alibi")), "HAS_SINKS": bool(functional.get("sinks")),
              "ALLOW_TF32": bool(functional.get("tf32")) and arch not in NO_TF32_ARCHS,
              "STAGES": config.get("STAGES"), "K_STAGES": config.get("K_STAGES"), "V_STAGES": config.get("V_STAGES"),
              "COMPUTE_DQ": bool(functional.get("dq")),
              "PAGED": bool(functional.get("paged")), "SMALL_PAGE": config.get("SMALL_PAGE", 0),
              **{k: v for k, v in config.items() if k in GLUON_FWD_KNOBS + GLUON_BWD_KNOBS + GLUON_FP8_FWD_KNOBS}}
    constexprs = {n: values[n] for n in family.constexprs}
    if variant == "aligned":
        divisibility = aligned_hints(signature)
    else:
        divisibility = {n: 1 for n, t in signature.items() if t != "constexpr"}
    return KernelSpec(
        id=kernel_id(family, functional, config, variant),
        family=family.name, module=family.module, function=family.function, language=family.language,
        sources=family.sources,
        functional=dict(functional), config=dict(config), variant=variant, arch=arch,
        target={"backend": backend, "arch": target_arch, "warp_size": warp_size},
        signature=signature, constexprs=constexprs, divisibility=divisibility,
    )


def enumerate_kernels(arch: str, families: list[Family] | None = None, tuning=None,
                      for_tuning: bool = False) -> list[KernelSpec]:
    """Every kernel to compile for ``arch``, sorted by id (ids are unique).

    Per functional: the family's ``configs`` (the heuristic: dispatch's fallback), plus the configs
    the tuning database ``tuning`` (a ``tuning.Database`` of this arch, or None) names as winners
    (ties with the heuristic's or another winner folded: ``tuning.fold_ties``), each ``aligned``
    kernel carrying the cells it serves; ``for_tuning``: plus every candidate of the
    family (a tuning build, for tune.py). One ``generic`` kernel per functional (the smallest
    config of the heuristic, so that tuning never moves it), one per value of the ``SERVING_KEYS``
    where its configs differ there."""
    target_of(arch)
    if tuning is not None and tuning.arch != arch:
        raise ValueError(f"tuning database {tuning.source} is for {tuning.arch}, not {arch}")
    specs = []
    for family in families or FAMILIES:
        if family.archs is not None and arch not in family.archs:
            continue
        for functional in functionals(family):
            heuristic = family.configs(arch, functional)
            configs = list(heuristic)
            offered = family.candidates(arch, functional) if family.candidates else list(configs)
            by_tag = {config_tag(c): c for c in offered + configs}
            won = (tuning.winners(family.name, functional, compiled=[config_tag(c) for c in heuristic])
                   if tuning is not None else {})
            for tag in won:
                if tag not in by_tag:
                    raise ValueError(f"tuning database {tuning.source}: {family.name} {functional} names config "
                                     f"{tag}, which rules.py does not offer (candidates: {sorted(by_tag)})")
                if by_tag[tag] not in configs:
                    configs.append(by_tag[tag])
            if for_tuning:
                configs += [c for c in offered if c not in configs]
            # A Gluon family: the cells its operator leaves to the portable backend.
            yielded = tuple(tuning.portable_cells(family.name, functional)) if tuning is not None else ()
            for config in configs:
                spec = _spec(family, arch, functional, config, "aligned")
                specs.append(dataclasses.replace(spec, tuned_for=tuple(won.get(config_tag(config), ())),
                                                 tuned_only=config not in heuristic, portable_for=yielded))
            if "generic" in family.variants:
                for serves in sorted({_serves(c) for c in heuristic}):
                    smallest = min((c for c in heuristic if _serves(c) == serves),
                                   key=lambda c: (c["BLOCK_M"], c.get("BLOCK_N", 0)))
                    specs.append(_spec(family, arch, functional, smallest, "generic"))
    specs.sort(key=lambda s: s.id)
    ids = [s.id for s in specs]
    if len(set(ids)) != len(ids):
        raise AssertionError(f"duplicate kernel ids for {arch}")
    return specs
