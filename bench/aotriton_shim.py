"""ctypes bindings of bench/shim.cpp (a C ABI over aotriton::v2::flash::attn_fwd / attn_bwd /
debug_dropout_mask), shared by bench_attn.py and grad_check.py. Tensors are torch CUDA tensors
(any strides with a unit last stride); every call goes to torch's current stream.

Backends (FwdParams v4 / BwdParams v3): ``Aotriton(path, backend="auto"|"portable"|"gluon")`` sets the
backend of every call; the backward's workspace is sized with attn_bwd_workspace_bytes and allocated
from torch's allocator when the chosen backend needs one (the Gluon backward).

Features:
  bias     a tensor in the input dtype, sizes [B or 1, Hq or 1, Sq or 1, Sk] (size 1 = broadcast);
           dbias (backward) the same sizes.
  dropout  Dropout(p, seed, offset, base): seed and offset are 1-element int64 CUDA tensors read
           by the kernels (their device addresses are passed), base is added to *offset;
           seed_out / offset_out (forward, optional) receive the seed and offset used.
  varlen   Varlen(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k): int32 CUDA tensors of
           B+1 offsets; q/k/v/o/... are then [1, H, tokens, D] views (see `packed_view`), lse and
           delta [1, Hq, total_q].
"""
import ctypes
from dataclasses import dataclass
from typing import Optional

import torch

AOTRITON_DTYPE = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3}  # aotriton::DType
BACKEND = {"auto": 0, "portable": 1, "gluon": 2}  # aotriton::v2::flash::Backend
ALIGN = {"tl": 0, "br": 1}  # aotriton::v2::flash::MaskAlign


def _arr(xs):
    return (ctypes.c_int64 * len(xs))(*xs)


def _check(tensors, dtype=None):
    for name, t in tensors:
        assert t.is_cuda and t.stride(-1) == 1, f"{name} must be a CUDA tensor with a unit last stride"
        if dtype is not None:
            assert t.dtype == dtype, f"{name} is {t.dtype}, expected {dtype}"


@dataclass
class Dropout:
    p: float
    seed: torch.Tensor  # int64, 1 element, CUDA
    offset: torch.Tensor  # int64, 1 element, CUDA
    base: int = 0
    seed_out: Optional[torch.Tensor] = None
    offset_out: Optional[torch.Tensor] = None

    @staticmethod
    def make(p, seed, offset, base=0, device="cuda"):
        """A dropout with the given seed and offset values placed in fresh device buffers."""
        t = lambda x: torch.tensor([x], dtype=torch.int64, device=device)  # noqa: E731
        return Dropout(p, t(seed), t(offset), base)

    def ptrs(self):
        for name, t in (("seed", self.seed), ("offset", self.offset)):
            assert t.is_cuda and t.dtype == torch.int64 and t.numel() >= 1, f"dropout {name}: 1-element int64 CUDA tensor"
        out = lambda t: t.data_ptr() if t is not None else 0  # noqa: E731
        return self.seed.data_ptr(), self.offset.data_ptr(), int(self.base), out(self.seed_out), out(self.offset_out)


@dataclass
class Varlen:
    cu_seqlens_q: torch.Tensor  # int32, B+1, CUDA
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int

    @staticmethod
    def from_lengths(lengths_q, lengths_k, device="cuda"):
        cu = lambda ls: torch.tensor([0] + list(torch.tensor(ls).cumsum(0).tolist()), dtype=torch.int32,  # noqa: E731
                                     device=device)
        return Varlen(cu(lengths_q), cu(lengths_k), max(lengths_q), max(lengths_k))

    def args(self):
        assert self.cu_seqlens_q.dtype == torch.int32 and self.cu_seqlens_k.dtype == torch.int32
        assert self.cu_seqlens_q.numel() == self.cu_seqlens_k.numel()
        return (self.cu_seqlens_q.data_ptr(), self.cu_seqlens_k.data_ptr(), self.cu_seqlens_q.numel(),
                int(self.max_seqlen_q), int(self.max_seqlen_k))


def packed_view(t):
    """A (tokens, H, D) tensor as the [1, H, tokens, D] view packed batches take."""
    assert t.dim() == 3
    return t.unsqueeze(0).transpose(1, 2)


class Aotriton:
    def __init__(self, path, backend="auto"):
        self.backend = BACKEND[backend]
        self.lib = ctypes.CDLL(path)
        u64, i64, i64p, i32, f32 = ctypes.c_uint64, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.c_int, \
            ctypes.c_float
        fwd = self.lib.aotriton_shim_attn_fwd_ex
        fwd.argtypes = ([u64] * 5 + [i64p] * 4 + [i32, f32, i32, i32, i32, i32]
                        + [u64, i64p, i64p, f32, u64, u64, u64, u64, u64, u64, u64, i64, u64, u64, i32, i32, u64])
        fwd.restype = ctypes.c_int
        bwd = self.lib.aotriton_shim_attn_bwd_ex
        bwd.argtypes = ([u64] * 10 + [i64p] * 4 + [i32, f32, i32, i32, i32, i32]
                        + [u64, i64p, i64p, u64, f32, u64, u64, u64, u64, u64, i64, u64, u64, i32, i32, i32, u64, u64,
                           ctypes.POINTER(ctypes.c_uint64), u64])
        bwd.restype = ctypes.c_int
        mask = self.lib.aotriton_shim_debug_dropout_mask
        mask.argtypes = [u64, i64p, i64p, f32, u64, u64, u64, u64]
        mask.restype = ctypes.c_int
        self.lib.aotriton_shim_dropout_offsets_consumed.argtypes = [u64] * 4
        self.lib.aotriton_shim_dropout_offsets_consumed.restype = u64
        self.lib.aotriton_shim_last_error.restype = ctypes.c_char_p
        self.lib.aotriton_shim_version.restype = ctypes.c_char_p
        self.lib.aotriton_shim_force_kernel.argtypes = [ctypes.c_char_p]
        self.lib.aotriton_shim_force_kernel.restype = ctypes.c_int
        self.lib.aotriton_shim_forced_count.restype = ctypes.c_uint64
        self.lib.aotriton_shim_use_database.argtypes = [ctypes.c_int]
        self.lib.aotriton_shim_use_database.restype = None
        self.version = self.lib.aotriton_shim_version().decode()

    def use_database(self, on):
        """aotriton::tuning::use_database: follow the tuning database (True) or only the heuristic."""
        self.lib.aotriton_shim_use_database(1 if on else 0)

    def forced_count(self):
        """aotriton::tuning::forced_count: kernels the override launched in place of dispatch's."""
        return int(self.lib.aotriton_shim_forced_count())

    def force_kernel(self, kernel_id):
        """aotriton::tuning::force_kernel: every call launches the kernel with this id where its
        functional holds it (None: dispatch's own choice again)."""
        rc = self.lib.aotriton_shim_force_kernel(None if kernel_id is None else kernel_id.encode())
        if rc != 0:
            raise RuntimeError(f"aotriton force_kernel failed (status {rc}): "
                               f"{self.lib.aotriton_shim_last_error().decode()}")

    def _runner(self, fn, args, what, keep):
        last_error = self.lib.aotriton_shim_last_error

        def run():
            rc = fn(*args)
            if rc != 0:
                raise RuntimeError(f"aotriton {what} failed (status {rc}): {last_error().decode()}")

        run._keepalive = keep  # the int64 arrays (and tensors) must outlive the callable
        return run

    @staticmethod
    def _bias(bias, dtype):
        if bias is None:
            return 0, _arr([0] * 4), _arr([0] * 4)
        _check((("bias", bias),), dtype)
        assert bias.dim() == 4
        return bias.data_ptr(), _arr(list(bias.shape)), _arr(list(bias.stride()))

    def bind_fwd(self, q, k, v, o, lse, sm_scale, causal=False, align="tl", window=(-1, -1), bias=None,
                 dropout: Optional[Dropout] = None, varlen: Optional[Varlen] = None, allow_tf32=False):
        """A no-argument callable launching attn_fwd. lse None: not wanted."""
        _check((("q", q), ("k", k), ("v", v), ("o", o)), q.dtype)
        if lse is not None:
            _check((("lse", lse),), torch.float32)
        sizes4 = _arr([n for t in (q, k, v, o) for n in t.shape])
        strides4 = _arr([s for t in (q, k, v, o) for s in t.stride()])
        lse_sizes = _arr(list(lse.shape) if lse is not None else [0, 0, 0])
        lse_strides = _arr(list(lse.stride()) if lse is not None else [0, 0, 0])
        bias_ptr, bias_sizes, bias_strides = self._bias(bias, q.dtype)
        seed, offset, base, seed_out, offset_out = dropout.ptrs() if dropout is not None else (0, 0, 0, 0, 0)
        cu_q, cu_k, n_cu, max_q, max_k = varlen.args() if varlen is not None else (0, 0, 0, 0, 0)
        args = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr() if lse is not None else 0,
                sizes4, strides4, lse_sizes, lse_strides, AOTRITON_DTYPE[q.dtype], float(sm_scale), int(causal),
                ALIGN[align], int(window[0]), int(window[1]), bias_ptr, bias_sizes, bias_strides,
                float(dropout.p) if dropout is not None else 0.0, seed, offset, base, seed_out, offset_out,
                cu_q, cu_k, n_cu, max_q, max_k, int(allow_tf32), self.backend, torch.cuda.current_stream().cuda_stream)
        return self._runner(self.lib.aotriton_shim_attn_fwd_ex, args, "attn_fwd",
                            (sizes4, strides4, lse_sizes, lse_strides, bias_sizes, bias_strides, dropout, varlen))

    def bind_bwd(self, q, k, v, o, d_o, lse, delta, dq, dk, dv, sm_scale, causal=False, align="tl",
                 window=(-1, -1), bias=None, dbias=None, dropout: Optional[Dropout] = None,
                 varlen: Optional[Varlen] = None, allow_tf32=False, deterministic=False):
        """A no-argument callable launching attn_bwd (delta, dK/dV and dQ kernels, and dBias)."""
        fours = (q, k, v, o, d_o, dq, dk, dv)
        _check(zip(("q", "k", "v", "o", "d_o", "dq", "dk", "dv"), fours), q.dtype)
        _check((("lse", lse), ("delta", delta)), torch.float32)
        sizes4 = _arr([n for t in fours for n in t.shape])
        strides4 = _arr([s for t in fours for s in t.stride()])
        rows_sizes = _arr(list(lse.shape) + list(delta.shape))
        rows_strides = _arr(list(lse.stride()) + list(delta.stride()))
        bias_ptr, bias_sizes, bias_strides = self._bias(bias, q.dtype)
        if dbias is not None:
            assert bias is not None and dbias.shape == bias.shape and dbias.stride() == bias.stride(), \
                "dbias must match the bias's sizes and strides"
        seed, offset, base, _, _ = dropout.ptrs() if dropout is not None else (0, 0, 0, 0, 0)
        cu_q, cu_k, n_cu, max_q, max_k = varlen.args() if varlen is not None else (0, 0, 0, 0, 0)
        head = tuple(t.data_ptr() for t in fours) + (
            lse.data_ptr(), delta.data_ptr(), sizes4, strides4, rows_sizes, rows_strides, AOTRITON_DTYPE[q.dtype],
            float(sm_scale), int(causal), ALIGN[align], int(window[0]), int(window[1]), bias_ptr, bias_sizes,
            bias_strides, dbias.data_ptr() if dbias is not None else 0,
            float(dropout.p) if dropout is not None else 0.0, seed, offset, base, cu_q, cu_k, n_cu, max_q, max_k,
            int(allow_tf32), int(deterministic), self.backend)
        stream = torch.cuda.current_stream().cuda_stream
        # The workspace the chosen backend needs (0: none), from torch's caching allocator.
        need = ctypes.c_uint64(0)
        rc = self.lib.aotriton_shim_attn_bwd_ex(*head, 0, 0, ctypes.byref(need), stream)
        if rc != 0:
            raise RuntimeError(f"aotriton attn_bwd_workspace_bytes failed (status {rc}): "
                               f"{self.lib.aotriton_shim_last_error().decode()}")
        workspace = torch.empty(need.value, dtype=torch.uint8, device=q.device) if need.value else None
        ws_ptr = workspace.data_ptr() if workspace is not None else 0
        args = head + (ws_ptr, need.value, None, stream)
        return self._runner(self.lib.aotriton_shim_attn_bwd_ex, args, "attn_bwd",
                            (sizes4, strides4, rows_sizes, rows_strides, bias_sizes, bias_strides, dropout, varlen,
                             workspace))

    def debug_dropout_mask(self, shape, dropout: Dropout, device="cuda"):
        """The keep-mask (float32 1.0 kept / 0.0 dropped) of a B x H x Sq x Sk score matrix."""
        out = torch.full(shape, float("nan"), dtype=torch.float32, device=device)
        sizes, strides = _arr(list(out.shape)), _arr(list(out.stride()))
        seed, offset, base, _, _ = dropout.ptrs()
        rc = self.lib.aotriton_shim_debug_dropout_mask(out.data_ptr(), sizes, strides, float(dropout.p), seed, offset,
                                                       base, torch.cuda.current_stream().cuda_stream)
        if rc != 0:
            raise RuntimeError(f"aotriton debug_dropout_mask failed (status {rc}): "
                               f"{self.lib.aotriton_shim_last_error().decode()}")
        return out

    def dropout_offsets_consumed(self, b, h, sq, sk):
        return int(self.lib.aotriton_shim_dropout_offsets_consumed(b, h, sq, sk))
