"""Does compute-sanitizer's racecheck report hazards on Gluon's ``warp_specialize`` itself?

Run under the tool, on sm_90:
    compute-sanitizer --tool racecheck python3 test/gluon/ws_racecheck_probe.py [--mbarrier | --plain]

The kernel below uses no shared memory of its own: each partition writes its own disjoint
slice of ``out`` from registers. Whatever racecheck reports on it is about the shared memory
that Triton's lowering of ``warp_specialize`` uses to start the worker warps (a state byte
per warp saying which partition to run, and the captured arguments), which the default
partition writes before a CTA-wide named barrier (``bar.sync 1``) and the workers read after
it. ``--mbarrier`` initialises an mbarrier before the split, as the attention kernels do (which
puts a barrier of the default partition's warps alone before it). ``--plain`` runs the same stores without ``warp_specialize`` (the control: no shared
memory at all). The script checks the outputs and prints ``ws_racecheck_probe: ok`` or
raises; the hazard count is the tool's summary line.

Why it exists: racecheck reports hazards on the Gluon attention kernels, all at offsets of
that start-up area (test/gpu/sanitize.sh, README "Stress and sanitizers"); this probe shows
whether the same report appears with none of our code in the kernel.
"""
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

DEFAULT_WARPS = 4
WORKER_WARPS: gl.constexpr = gl.constexpr(1)


@gluon.jit
def _default_part(out_ptr, base):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    offs = gl.arange(0, 128, layout)
    gl.store(out_ptr + offs, offs + base)


@gluon.jit
def _worker_part(out_ptr, base):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    offs = gl.arange(0, 32, layout)
    gl.store(out_ptr + 128 + offs, 2 * offs + base)


@gluon.jit
def _split(out_ptr, base_ptr):
    # `base` is loaded, not recomputable from the kernel's parameters: like the attention
    # kernels' values computed before the split, it reaches the workers as a captured argument
    # in shared memory.
    base = gl.load(base_ptr)
    pid = gl.program_id(0)
    gl.warp_specialize([
        (_default_part, (out_ptr + pid * 160, base)),
        (_worker_part, (out_ptr + pid * 160, base)),
    ], [WORKER_WARPS], [24])


@gluon.jit
def ws_probe(out_ptr, base_ptr):
    _split(out_ptr, base_ptr)


@gluon.jit
def ws_mbarrier_probe(out_ptr, base_ptr):
    # As ws_probe, after an mbarrier initialised in shared memory, as every attention kernel does
    # before its split: the init is followed by a barrier of the parent region's warps only
    # (bar.sync 0 with the default partition's thread count), the workers waiting at theirs.
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    gl.thread_barrier()
    _split(out_ptr, base_ptr)
    mbarrier.invalidate(bar)


@gluon.jit
def plain_probe(out_ptr, base_ptr):
    base = gl.load(base_ptr)
    pid = gl.program_id(0)
    _default_part(out_ptr + pid * 160, base)
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    offs = gl.arange(0, 32, layout)
    gl.store(out_ptr + pid * 160 + 128 + offs, 2 * offs + base)


def main():
    variant = "plain" if "--plain" in sys.argv else "mbarrier" if "--mbarrier" in sys.argv else "warp_specialize"
    programs, base = 8, 7
    out = torch.full((programs * 160,), -1, dtype=torch.int32, device="cuda")
    kernel = {"plain": plain_probe, "mbarrier": ws_mbarrier_probe, "warp_specialize": ws_probe}[variant]
    base_buf = torch.full((1,), base, dtype=torch.int32, device="cuda")
    kernel[(programs, )](out, base_buf, num_warps=DEFAULT_WARPS)
    torch.cuda.synchronize()
    row = torch.cat([torch.arange(128) + base, 2 * torch.arange(32) + base]).to(torch.int32)
    expected = row.repeat(programs)
    if not torch.equal(out.cpu(), expected):
        raise SystemExit(f"ws_racecheck_probe: wrong output ({variant})")
    print(f"ws_racecheck_probe: ok ({variant}, {programs} programs)")


if __name__ == "__main__":
    main()
