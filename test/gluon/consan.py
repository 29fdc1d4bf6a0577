"""Gluon's concurrency sanitizer (ConSan) over a check script's cases: each case in its own process,
since a sanitizer trap kills the CUDA context (check_fwd.py, check_fwd_varlen.py, check_bwd_varlen.py)."""
import os
import subprocess
import sys
import time


def run_children(script, child_args, names, title, budget_s=500, switches=()):
    """Runs ``script --consan-child ARG [switches]`` for every ``ARG`` with ``TRITON_INSTRUMENTATION_MODE=consan``,
    all at once (the instrumented compiles dominate and run in parallel). A child passes when it
    exits 0 and its last ``PASS``/``FAIL`` line is a ``PASS``. Prints a line per case and
    ``<title>: N clean, M flagged``; returns whether every case was clean."""
    env = dict(os.environ, TRITON_INSTRUMENTATION_MODE="consan")
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, os.path.abspath(script), "--consan-child", arg, *switches], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for arg in child_args]
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


def child_setup():
    """What a ``--consan-child`` process needs before its launch: the sanitizer's global scratch."""
    import torch
    import triton
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
