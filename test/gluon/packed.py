"""Packed (varlen) batches for the Gluon checks: the runtime's ragged descriptors and packed
tensors with NaN guard rows (check_fwd_varlen.py, check_bwd_varlen.py).

A ragged descriptor is what ``rust/aotriton/src/tma.rs`` (``TensorArg::ragged``) builds for the
kernels (``python/kernels/flash_gluon/ragged.py``): rank 5 over a packed ``[tokens, H, D]`` tensor.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))

import torch  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

from kernels.flash_gluon.ragged import RAGGED_ROWS  # noqa: E402
import packed_batch  # noqa: E402,F401  (re-exported: the benchmark's batch)

#: The two address-only leading dimensions of a ragged descriptor (ragged.py).
RAGGED_SPAN = 0x7FFF0000
#: NaN rows before and after the packed tokens of every tensor ``guarded`` makes.
GUARD = 3
GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}


def ragged_descriptor(t, rows, cols):
    """The runtime's ragged descriptor over a packed ``[tokens, H, D]`` tensor, box ``[1, 1, 1, rows, cols]``."""
    rs, hs = t.stride(0), t.stride(1)
    shape = [RAGGED_SPAN, RAGGED_SPAN, t.shape[1], RAGGED_ROWS, t.shape[2]]
    strides = [2**34 - rs, rs, hs, rs, 1]
    block = [1, 1, 1, rows, cols]
    return TensorDescriptor(t, shape, strides, block, gl.NVMMASharedLayout.get_default_for(block, GL_DTYPES[t.dtype]))


def cu_seqlens(lengths, device):
    return torch.tensor(packed_batch.offsets(lengths), dtype=torch.int32, device=device)


def guarded(lengths, h, d, dt, gen, device, random=True):
    """``[GUARD + tokens + GUARD, H, D]`` storage (NaN guard rows; the tokens random, or NaN when not
    ``random``: an output) and its ``[tokens, H, D]`` view."""
    total = sum(lengths)
    store = torch.full((total + 2 * GUARD, h, d), float("nan"), device=device, dtype=dt)
    if random:
        store[GUARD:GUARD + total] = torch.randn((total, h, d), generator=gen, device=device).to(dt)
    return store, store[GUARD:GUARD + total]


def guards_intact(store):
    """Whether the guard rows of a ``guarded`` storage are still all NaN."""
    return bool(torch.isnan(store[:GUARD]).all() and torch.isnan(store[-GUARD:]).all())


def sequence(t, start, length):
    """Rows ``[start, start + length)`` of a packed ``[tokens, H, D]`` tensor as ``[1, H, length, D]``."""
    return t[start:start + length].permute(1, 0, 2).unsqueeze(0)


def consan_children(script, case_jsons, names, title, budget_s=500):
    """Gluon's concurrency sanitizer over ``script``'s cases: each JSON case in its own process
    (``script --consan-child JSON`` with ``TRITON_INSTRUMENTATION_MODE=consan``: a sanitizer trap
    kills the CUDA context), all at once (the instrumented compiles dominate).  Prints a line per
    case and ``<title>: N clean, M flagged``; returns whether every case was clean."""
    import subprocess
    import time
    env = dict(os.environ, TRITON_INSTRUMENTATION_MODE="consan")
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, os.path.abspath(script), "--consan-child", c], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in case_jsons]
    clean = flagged = 0
    for name, proc in zip(names, procs):
        try:
            out = proc.communicate(timeout=max(1.0, budget_s - (time.time() - t0)))[0].strip()
        except subprocess.TimeoutExpired:
            proc.kill()
            out = "timed out"
        result = [ln for ln in out.splitlines() if ln.startswith(("PASS", "FAIL"))]
        if proc.returncode == 0 and result and result[-1].startswith("PASS"):
            clean += 1
            print(f"CONSAN CLEAN {name} ({time.time() - t0:.0f} s): {result[-1]}", flush=True)
        else:
            flagged += 1
            tail = " | ".join(out.splitlines()[-15:])[-3000:]
            print(f"CONSAN FLAGGED {name} (rc {proc.returncode}, {time.time() - t0:.0f} s): {tail}", flush=True)
    print(f"{title}: {clean} clean, {flagged} flagged")
    return flagged == 0


def consan_child_setup():
    """What a ``--consan-child`` process needs before its launch: the sanitizer's global scratch."""
    import triton
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
