"""Packed (varlen) batches for the Gluon checks: the runtime's ragged descriptors and packed
tensors with NaN guard rows (check_fwd_varlen.py, check_bwd_varlen.py).

A ragged descriptor is what ``rust/aotriton/src/tma.rs`` (``TensorArg::ragged``) builds for the
kernels (``python/kernels/flash_gluon/ragged.py``): rank 5 over a packed ``[tokens, H, D]`` tensor.
"""
import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field

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
    shape = [RAGGED_SPAN, RAGGED_SPAN, t.shape[1], RAGGED_ROWS.value, t.shape[2]]  # ints for the driver
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



@dataclass
class PackedCase:
    """A packed batch to check: per-sequence query and key lengths (keys: the queries' when None),
    a mask by the generic names of ``packed_cases``, heads; ``flags()`` names a script's options."""
    dtype: str
    d: int
    lens_q: list
    lens_k: list = field(default=None)
    mask: str = "none"
    hq: int = 2
    hk: int = 2

    def __post_init__(self):
        if self.lens_k is None:
            self.lens_k = list(self.lens_q)

    def flags(self):
        return ""

    def name(self):
        lk = "" if self.lens_k == self.lens_q else f" k{self.lens_k}"
        return f"{self.dtype} d{self.d} hq{self.hq} hk{self.hk} q{self.lens_q}{lk} {self.mask}{self.flags()}"


def packed_cases(case, long, longer):
    """The packed batches both varlen checks run (``case``: the script's ``PackedCase`` type;
    ``long``/``longer``: the lengths of its long sequences, kept down where its reference is costly):
    ragged lengths around the blocks (an empty sequence, a one-token one) at every head-dim bucket
    and padded dims, both dtypes, full and causal; Sq != Sk per sequence both ways (sequences without
    keys, without queries) under bottom-right and top-left causal and windows with rows that see no
    key; GQA and MQA. Masks by generic name: ``none``, ``causal_tl``, ``causal_br``,
    ``win_<left>_<right>_<tl|br>``."""
    out = []
    ragged = [300, 1, 129, 0, long, 17, 128]
    for dtype in ("bf16", "fp16"):
        for d in (64, 128, 256, 72, 192):
            out.append(case(dtype, d, ragged, mask="none"))
            out.append(case(dtype, d, ragged, mask="causal_tl"))
    lq, lk = [129, long, 5, 0, 64], [long, 129, 0, 7, 65]
    for mask in ("causal_br", "causal_tl", "win_64_32_tl", "win_16_0_br", "win_0_0_tl"):
        for d in (64, 128, 256):
            out.append(case("bf16", d, lq, lk, mask))
    out.append(case("bf16", 128, [777, 3, longer], mask="causal_br", hq=8, hk=2))
    out.append(case("fp16", 64, [777, 3, longer], mask="none", hq=8, hk=1))
    out.append(case("bf16", 256, [333, 1, 64], [64, 333, 1], mask="win_64_32_tl", hq=4, hk=1))
    return out


def add_check_options(ap):
    """The options of a varlen check script: ``--consan``, ``--filter`` (and the hidden ``--consan-child``)."""
    ap.add_argument("--consan", action="store_true", help="consan_cases() under Gluon's concurrency sanitizer")
    ap.add_argument("--consan-child", help=argparse.SUPPRESS)
    ap.add_argument("--filter", default="")


def check_main(script, doc, title, case_type, cases, consan_cases, run_case):
    """A check script's ``main``: its options (``add_check_options``), then ``run_check``; the exit code."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    add_check_options(ap)
    return 0 if run_check(script, title, ap.parse_args(), case_type, cases, consan_cases, run_case) else 1


def run_check(script, title, args, case_type, cases, consan_cases, run_case, switches=()):
    """A varlen check script's modes: one case in this process (``--consan-child``, under the
    sanitizer), ``consan_cases()`` each in a sanitized child (``--consan``; ``switches``: the
    command-line options the children get too), else every case of
    ``cases()`` whose name contains ``--filter``, one line each (``run_case(case)`` returns ``(ok,
    line)``; an exception is a failure), then ``<title>: N passed, M failed``. Returns success."""
    import consan
    if args.consan_child:
        consan.child_setup()
        ok, line = run_case(case_type(**json.loads(args.consan_child)))
        print(line, flush=True)
        return ok
    if args.consan:
        cs = consan_cases()
        return consan.run_children(script, [json.dumps(asdict(c)) for c in cs], [c.name() for c in cs],
                                   f"{title} --consan", switches=switches)
    passed = failed = 0
    t0 = time.time()
    for case in cases():
        if args.filter and args.filter not in case.name():
            continue
        try:
            ok, line = run_case(case)
        except Exception as e:  # noqa: BLE001 -- report and go on with the next case
            ok, line = False, f"FAIL {case.name()}: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[-1][:400]}"
        passed += ok
        failed += not ok
        print(line, flush=True)
    print(f"{title}: {passed} passed, {failed} failed ({time.time() - t0:.1f} s)")
    return failed == 0
