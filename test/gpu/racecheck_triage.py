#!/usr/bin/env python3
"""Sorts compute-sanitizer racecheck reports on the Gluon kernels into the warp_specialize hand-off
and everything else.

Why: Triton lowers ``gl.warp_specialize`` by parking the worker warps at a CTA-wide named barrier
(``bar.sync 1``); the default partition writes, to shared memory, one state byte per worker warp
(which partition to run, or exit) and the captured arguments, then arrives at that barrier, and
the workers read them after it. That is ordered by the barrier. Racecheck (2025.3) still reports
it as a race when the default partition's warps synchronised among themselves before (a
``bar.sync 0`` with their thread count, as every attention kernel's mbarrier set-up has), which
``test/gluon/ws_racecheck_probe.py --mbarrier`` reproduces on a 15-line kernel with no shared
memory of its own. This script proves, from the SASS of the kernels that ran, that a report is
that hand-off and nothing else:

* hand-off writes: every ``STS`` between the previous barrier-like instruction (``BAR``,
  ``SYNCS``, ``MEMBAR``, a branch target) and a ``BAR.SYNC.DEFER_BLOCKING 0x1`` (no thread count:
  the whole CTA);
* a reported access is hand-off when it is an ``LDS``/``STS`` whose bytes overlap a hand-off
  write (a read indexed by a register, the per-warp state byte, may be up to 16 bytes past its
  immediate);
* a reported pair (``Race reported between A at kernel+x`` / ``and B at kernel+y``) is hand-off
  when one compiled variant of that kernel has both ``x`` and ``y`` as hand-off accesses.

    python3 test/gpu/racecheck_triage.py LOG --cubins DIR [--cuobjdump PATH]
prints one line per reported pair and ``racecheck-triage: N pairs, H in the warp_specialize
hand-off, O other`` last; exits 1 when O > 0 or nothing could be read.
"""
import argparse
import glob
import os
import re
import subprocess
import sys

INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
SMEM = re.compile(r"\b(LDS|STS)(\.[A-Z0-9.]+)?\s.*?\[([^\]]*)\]")
SIZES = {".U8": 1, ".S8": 1, ".U16": 2, ".S16": 2, ".64": 8, ".128": 16}
BARRIER_LIKE = re.compile(r"^(@!?U?P\w+\s+)?(BAR|SYNCS|MEMBAR|WARPSYNC|BRA|EXIT|RET|CALL)\b")
FULL_BAR1 = re.compile(r"^BAR\.SYNC(\.DEFER_BLOCKING)?\s+0x1$")
REPORT = re.compile(r"Race reported between (Read|Write) access at (\w+)\+0x([0-9a-f]+)")
AND = re.compile(r"^=+\s+and (Read|Write) access at (\w+)\+0x([0-9a-f]+)")
# A register-indexed read of the per-warp state bytes may land this far past its immediate.
INDEX_SLACK = 16


def parse_sass(text):
    """[(offset, instruction text)] of one kernel's SASS."""
    return [(int(off, 16), " ".join(body.split())) for off, body in INSTR.findall(text)]


def smem_access(instr):
    """(kind, first byte, end byte, indexed) of an LDS/STS, or None."""
    m = SMEM.search(instr)
    if not m:
        return None
    kind, suffix, addr = m.group(1), m.group(2) or "", m.group(3)
    imm = re.search(r"(?:^|\+)\s*(-?0x[0-9a-f]+)\s*$", addr)
    start = int(imm.group(1), 16) if imm else 0
    size = SIZES.get("." + suffix.rsplit(".", 1)[-1], 4) if suffix else 4
    terms = [t.strip() for t in addr.split("+")]
    indexed = any(re.fullmatch(r"R\d+", t) for t in terms)
    return kind, start, start + size, indexed


def handoff_writes(instrs):
    """Byte ranges written by STS right before a whole-CTA `bar.sync 1`."""
    ranges, pending = [], []
    for _, instr in instrs:
        if FULL_BAR1.match(instr):
            ranges.extend(pending)
            pending = []
        elif BARRIER_LIKE.match(instr):
            pending = []
        else:
            acc = smem_access(instr)
            if acc and acc[0] == "STS":
                pending.append((acc[1], acc[2]))
    return ranges


def is_handoff(instrs_by_offset, ranges, offset):
    instr = instrs_by_offset.get(offset)
    acc = smem_access(instr) if instr else None
    if not acc:
        return False
    _, start, end, indexed = acc
    if indexed and acc[0] == "LDS":
        end = start + INDEX_SLACK
    return any(start < r_end and r_start < end for r_start, r_end in ranges)


def load_variants(cubins, cuobjdump):
    """{kernel name: [(variant file, {offset: instr}, hand-off ranges)]} from DIR/<kernel>-*.cubin."""
    variants = {}
    for path in sorted(glob.glob(os.path.join(cubins, "*.cubin"))):
        kernel = os.path.basename(path).split("-", 1)[0]
        sass = subprocess.run([cuobjdump, "-sass", path], check=True, capture_output=True, text=True).stdout
        instrs = parse_sass(sass)
        variants.setdefault(kernel, []).append((os.path.basename(path), dict(instrs), handoff_writes(instrs)))
    return variants


def reported_pairs(log_text):
    """[(kernel, offset a, offset b)] of every reported hazard pair."""
    pairs, current = [], None
    for line in log_text.splitlines():
        m = REPORT.search(line)
        if m:
            current = (m.group(2), int(m.group(3), 16))
            continue
        m = AND.search(line)
        if m and current and m.group(2) == current[0]:
            pairs.append((current[0], current[1], int(m.group(3), 16)))
        elif not m:
            current = None
    return sorted(set(pairs))


def triage(pairs, variants):
    """[(kernel, a, b, variant or None, instr a, instr b)]: the variant proving a pair hand-off."""
    out = []
    for kernel, a, b in pairs:
        proof = None
        for name, instrs, ranges in variants.get(kernel, []):
            if is_handoff(instrs, ranges, a) and is_handoff(instrs, ranges, b):
                proof = (name, instrs[a], instrs[b])
                break
        out.append((kernel, a, b) + (proof if proof else (None, "", "")))
    return out


def find_cuobjdump():
    try:
        import triton
        path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        if os.access(path, os.X_OK):
            return path
    except ImportError:
        pass
    return "cuobjdump"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log")
    ap.add_argument("--cubins", required=True, help="the Gluon kernels' cubins (<kernel>-<variant>.cubin)")
    ap.add_argument("--cuobjdump", default=None)
    args = ap.parse_args()
    variants = load_variants(args.cubins, args.cuobjdump or find_cuobjdump())
    with open(args.log, errors="replace") as f:
        pairs = reported_pairs(f.read())
    if not variants:
        print(f"racecheck-triage: no cubins in {args.cubins}")
        return 1
    rows = triage(pairs, variants)
    other = 0
    for kernel, a, b, proof, ia, ib in rows:
        if proof:
            print(f"  {kernel}+{a:#x} / +{b:#x}: hand-off in {proof}: {ia} | {ib}")
        else:
            other += 1
            print(f"  {kernel}+{a:#x} / +{b:#x}: OTHER (not the warp_specialize hand-off in any variant)")
    print(f"racecheck-triage: {len(rows)} pairs, {len(rows) - other} in the warp_specialize hand-off, {other} other")
    return 1 if other else 0


if __name__ == "__main__":
    sys.exit(main())
