"""ctypes bindings of bench/shim.cpp (a C ABI over aotriton::v2::flash::attn_fwd / attn_bwd),
shared by bench_attn.py and grad_check.py. Tensors are torch CUDA tensors (any strides with a
unit last stride); every call goes to torch's current stream."""
import ctypes

import torch

AOTRITON_DTYPE = {torch.float16: 1, torch.bfloat16: 2}  # aotriton::DType
ALIGN = {"tl": 0, "br": 1}  # aotriton::v2::flash::MaskAlign


def _arr(xs):
    return (ctypes.c_int64 * len(xs))(*xs)


def _check(tensors, dtype=None):
    for name, t in tensors:
        assert t.is_cuda and t.stride(-1) == 1, f"{name} must be a CUDA tensor with a unit last stride"
        if dtype is not None:
            assert t.dtype == dtype, f"{name} is {t.dtype}, expected {dtype}"


class Aotriton:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        u64, i64p, i32, f32 = ctypes.c_uint64, ctypes.POINTER(ctypes.c_int64), ctypes.c_int, ctypes.c_float
        fwd = self.lib.aotriton_shim_attn_fwd
        fwd.argtypes = [u64] * 5 + [i64p] * 4 + [i32, f32, i32, i32, i32, i32, u64]
        fwd.restype = ctypes.c_int
        bwd = self.lib.aotriton_shim_attn_bwd
        bwd.argtypes = [u64] * 10 + [i64p] * 4 + [i32, f32, i32, i32, i32, i32, u64]
        bwd.restype = ctypes.c_int
        self.lib.aotriton_shim_last_error.restype = ctypes.c_char_p
        self.lib.aotriton_shim_version.restype = ctypes.c_char_p
        self.version = self.lib.aotriton_shim_version().decode()

    def _runner(self, fn, args, what, keep):
        last_error = self.lib.aotriton_shim_last_error

        def run():
            rc = fn(*args)
            if rc != 0:
                raise RuntimeError(f"aotriton {what} failed (status {rc}): {last_error().decode()}")

        run._keepalive = keep  # the int64 arrays must outlive the callable
        return run

    def bind_fwd(self, q, k, v, o, lse, sm_scale, causal=False, align="tl", window=(-1, -1)):
        """A no-argument callable launching attn_fwd. lse None: not wanted."""
        _check((("q", q), ("k", k), ("v", v), ("o", o)), q.dtype)
        if lse is not None:
            _check((("lse", lse),), torch.float32)
        sizes4 = _arr([n for t in (q, k, v, o) for n in t.shape])
        strides4 = _arr([s for t in (q, k, v, o) for s in t.stride()])
        lse_sizes = _arr(list(lse.shape) if lse is not None else [0, 0, 0])
        lse_strides = _arr(list(lse.stride()) if lse is not None else [0, 0, 0])
        args = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr() if lse is not None else 0,
                sizes4, strides4, lse_sizes, lse_strides, AOTRITON_DTYPE[q.dtype], float(sm_scale), int(causal),
                ALIGN[align], int(window[0]), int(window[1]), torch.cuda.current_stream().cuda_stream)
        return self._runner(self.lib.aotriton_shim_attn_fwd, args, "attn_fwd",
                            (sizes4, strides4, lse_sizes, lse_strides))

    def bind_bwd(self, q, k, v, o, d_o, lse, delta, dq, dk, dv, sm_scale, causal=False, align="tl",
                 window=(-1, -1)):
        """A no-argument callable launching attn_bwd (delta, dK/dV and dQ kernels)."""
        fours = (q, k, v, o, d_o, dq, dk, dv)
        _check(zip(("q", "k", "v", "o", "d_o", "dq", "dk", "dv"), fours), q.dtype)
        _check((("lse", lse), ("delta", delta)), torch.float32)
        sizes4 = _arr([n for t in fours for n in t.shape])
        strides4 = _arr([s for t in fours for s in t.stride()])
        rows_sizes = _arr(list(lse.shape) + list(delta.shape))
        rows_strides = _arr(list(lse.stride()) + list(delta.stride()))
        args = tuple(t.data_ptr() for t in fours) + (lse.data_ptr(), delta.data_ptr(), sizes4, strides4, rows_sizes,
                                                     rows_strides, AOTRITON_DTYPE[q.dtype], float(sm_scale),
                                                     int(causal), ALIGN[align], int(window[0]), int(window[1]),
                                                     torch.cuda.current_stream().cuda_stream)
        return self._runner(self.lib.aotriton_shim_attn_bwd, args, "attn_bwd",
                            (sizes4, strides4, rows_sizes, rows_strides))
