#!/usr/bin/env python3
"""The tuner: times every candidate config of the portable attention kernels through the AOT
images and the runtime's own launch path, and writes the tuning database (python/tuning.py).

Runs on a GPU machine with torch, the bench shim (bench/shim.cpp, built against the install the
images belong to), ``aotriton-pack`` and an archive from a tuning build (``python/compile.py
--for-tuning``: every candidate of rules.py compiled), trusted by the runtime through
``AOTRITON_IMAGE_DIR`` and its digest manifest::

    AOTRITON_IMAGE_DIR=.stage/tuning python3 python/tune.py --shim .stage/lib/libaotriton_shim.so \\
        --pack .stage/bin/aotriton-pack --out tuning/sm_90.json --progress $OUT/tune-progress.json \\
        [--families attn_fwd,attn_bwd_dkdv,attn_bwd_dq] [--dtypes bf16,fp16] [--budget 500]

Per family, functional and cell of the grid (tuning.DEFAULT_EDGES: the diagonal Sq = Sk at each
bin's representative length, 256 .. 16384, with B·S = 16k tokens and H·D = 2048; masks none and
causal), each candidate kernel is forced (aotriton::tuning::force_kernel) on the portable backend,
its result compared with an fp32 reference on the first (batch, head) slice (dropout: that slice's
keep-mask from debug_dropout_mask; bias: a random (1, 1, 1, Sk) bias), and timed (median of
CUDA events, triton.testing.do_bench). The backward families are timed as the whole backward with
the candidate forced (the other kernels fixed), so differences are the candidate's. The winner is
the fastest candidate whose error is at most 3x the best candidate's (the seed's rule); its margin
is over the runner-up. ``--backends`` (sm_90) then times each operator whole on the Gluon and on the
portable backend (its dispatch default) per Gluon functional and cell, checked against the same
reference, into the database's ``backends`` (which one ``Auto`` takes there). Resumable: ``--progress`` keeps every finished cell, a rerun skips them and
``--budget`` stops cleanly before a device call's limit; ``--out`` is rewritten (canonical text)
after each functional. The progress file names the device its cells were measured on, and a run
on another device refuses to extend it (a database is measured on one device). Functionals whose
rules offer one config (head dim 512) are skipped.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "bench"))

import rules  # noqa: E402
import tuning  # noqa: E402

TUNED_FAMILIES = ("attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq")
#: Where the tensors live ("cuda"; python/tests/test_tune_dry.py runs the tuner's logic on the CPU
#: with a float64 stand-in for the shim).
DEVICE = "cuda"
#: The progress file's entry naming the device its cells were measured on (not a cell).
PROGRESS_DEVICE_KEY = "measured_on"
TORCH_DTYPE = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


def archive_kernel_ids(pack, archive):
    """Kernel ids in an archive, as `aotriton-pack list` prints them (the format's one owner)."""
    out = subprocess.run([pack, "list", archive], check=True, capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith("  ") and line.strip()}


def cell_problem(torch, functional, mask, length, tokens, hidden, gen):
    """Inputs of one cell: (B, H, S, D) tensors of the functional's dtype, never zeros."""
    d = functional["head_dim"]
    b, h = max(1, tokens // length), max(1, hidden // d)
    dtype = getattr(torch, TORCH_DTYPE[functional["dtype"]])
    t = lambda: torch.randn(b, h, length, d, device=DEVICE, dtype=torch.float32, generator=gen).add_(0.01).to(dtype)  # noqa: E731
    p = dict(b=b, h=h, s=length, d=d, q=t(), k=t(), v=t(), do=t(), causal=mask == "causal", scale=1 / math.sqrt(d))
    p["bias"] = (torch.randn(1, 1, 1, length, device=DEVICE, generator=gen).to(dtype)
                 if functional.get("bias") else None)
    return p


def reference(torch, p, keep=None, dropout_p=0.0, grads=False):
    """fp32 attention on the (0, 0) slice: out, and with grads dq, dk, dv for p["do"]."""
    q, k, v = (p[n][0, 0].float().requires_grad_(grads) for n in ("q", "k", "v"))
    s = (q @ k.T) * p["scale"]
    if p["bias"] is not None:
        s = s + p["bias"][0, 0].float()
    if p["causal"]:
        n = s.shape[0]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=DEVICE).triu(1), float("-inf"))
    w = torch.softmax(s, dim=-1)
    if keep is not None:
        w = w * keep / (1.0 - dropout_p)
    out = w @ v
    if not grads:
        return out.detach(), None
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), p["do"][0, 0].float())
    return out.detach(), (dq, dk, dv)


def time_candidates(torch, do_bench, candidates, watched, wanted, rep_ms, forced_count=None):
    """Runs each ``(label, prepare, run)`` candidate (``prepare`` readies it, e.g. forces its
    kernel) on NaN-poisoned outputs, measures its max error on the (0, 0) slice against the
    reference, and times it; one that fails or leaves a non-finite value is left out (a candidate
    that cannot run is not a candidate). ``forced_count`` (aotriton::tuning::forced_count): the
    forced kernel must really have launched, or the time would be another kernel's. Returns
    ``(ms, error, label)`` per candidate that ran."""
    results = []
    for label, prepare, run in candidates:
        prepare()
        for t in watched:
            t.fill_(float("nan"))
        try:
            before = forced_count() if forced_count else None
            run()
            if forced_count and forced_count() == before:
                raise RuntimeError("the forced kernel did not launch (its hints do not fit these tensors)")
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            err = max((got[0, 0].float() - want).abs().max().item() for got, want in zip(watched, wanted))
            if not math.isfinite(err):
                raise RuntimeError("non-finite output")
            ms = do_bench(run, warmup=5, rep=rep_ms, return_mode="median")
        except RuntimeError as e:
            print(f"  {label}: {str(e).splitlines()[0][:160]}", flush=True)
            continue
        results.append((ms, err, label))
    return results


def pick(results):
    """The seed's rule: among the candidates whose error is at most ERROR_FACTOR x the best error,
    the fastest (and the runner-up, or None). Returns (winner, runner_up, best_error)."""
    best_err = min(e for _, e, _ in results)
    ok = sorted(r for r in results if r[1] <= tuning.ERROR_FACTOR * best_err + 1e-6)
    return ok[0], (ok[1] if len(ok) > 1 else None), best_err


def measure_functional(torch, do_bench, aot, shim, family, functional, ids, args, done, record):
    """Times every candidate of one functional at every cell not yet in `done`; `record(cell
    key, result)` keeps each finished cell."""
    gen = torch.Generator(device=DEVICE).manual_seed(1234)
    for mask in args.masks:
        for index, length in enumerate(tuning.representative(tuning.DEFAULT_EDGES)):
            key = json.dumps([family, tuning.functional_key(functional), mask, index, index])
            if key in done:
                continue
            p = cell_problem(torch, functional, mask, length, tuning.DEFAULT_TOKENS, args.hidden, gen)
            b, h, s = p["b"], p["h"], p["s"]
            dropout = None
            keep = None
            if functional.get("dropout"):
                dropout = shim.Dropout.make(0.1, 0x5EED, 0x1000)
                keep = aot.debug_dropout_mask((1, 1, s, s), dropout)[0, 0]
            tf32 = bool(functional.get("tf32"))
            o = torch.empty_like(p["q"])
            lse = torch.empty(b, h, s, device=DEVICE, dtype=torch.float32)
            fwd = aot.bind_fwd(p["q"], p["k"], p["v"], o, lse, p["scale"], causal=p["causal"], bias=p["bias"],
                               dropout=dropout, allow_tf32=tf32)
            backward = family != "attn_fwd"
            ref_out, ref_grads = reference(torch, p, keep, 0.1 if dropout else 0.0, grads=backward)
            if backward:
                aot.force_kernel(None)
                fwd()  # the dispatch's own forward: out and LSE the candidates' backward reads
                dq, dk, dv = (torch.empty_like(p[n]) for n in ("q", "k", "v"))
                delta = torch.empty_like(lse)
                run = aot.bind_bwd(p["q"], p["k"], p["v"], o, p["do"], lse, delta, dq, dk, dv, p["scale"],
                                   causal=p["causal"], bias=p["bias"], dropout=dropout, allow_tf32=tf32)
                watched = (dq,) if family == "attn_bwd_dq" else (dk, dv)
                wanted = (ref_grads[0],) if family == "attn_bwd_dq" else ref_grads[1:]
            else:
                run, watched, wanted = fwd, (o,), (ref_out,)
            forcing = [(kid, lambda kid=kid: aot.force_kernel(kid), run) for kid in ids]
            results = time_candidates(torch, do_bench, forcing, watched, wanted, args.rep_ms, aot.forced_count)
            aot.force_kernel(None)
            if not results:
                print(f"{family} {functional} {mask} S{s}: no candidate ran", flush=True)
                continue
            win, runner, best_err = pick(results)
            tag = lambda kid: kid.split("-")[-2]  # noqa: E731  (rules.kernel_id: ...-<config tag>-<variant>)
            entry = {"family": family, "functional": functional, "mask": mask, "seqlen_q_bin": index,
                     "seqlen_k_bin": index, "winner": tag(win[2]), "winner_ms": round(win[0], 5),
                     "error": float(f"{win[1]:.3g}"), "best_error": float(f"{best_err:.3g}"),
                     "candidates": len(results)}
            if args.hidden != tuning.DEFAULT_HIDDEN:
                entry["hidden"] = args.hidden
            if runner is not None:
                entry.update(runner_up=tag(runner[2]), runner_up_ms=round(runner[0], 5))
            print(f"{family} {tuning.functional_key(functional)} {mask} S{s}: {entry['winner']} {win[0]:.4f} ms"
                  + (f" (x{runner[0] / win[0]:.3f} over {entry['runner_up']})" if runner else "")
                  + f", {len(results)} candidates", flush=True)
            record(key, entry)


def measure_backends(torch, do_bench, aots, shim, operator, functional, args, done, record):
    """Times the whole operator on each backend at every cell of one Gluon functional (dtype,
    head_dim); `aots`: backend name -> shim instance forced onto it."""
    gen = torch.Generator(device=DEVICE).manual_seed(4321)
    plain = dict(functional, tf32=False, dropout=False, bias=False)
    for mask in args.masks:
        for index, length in enumerate(tuning.representative(tuning.DEFAULT_EDGES)):
            key = json.dumps(["backend", operator, tuning.functional_key(functional), mask, index, index])
            if key in done:
                continue
            p = cell_problem(torch, plain, mask, length, tuning.DEFAULT_TOKENS, args.hidden, gen)
            b, h, s = p["b"], p["h"], p["s"]
            backward = operator == "attn_bwd"
            ref_out, ref_grads = reference(torch, p, grads=backward)
            o = torch.empty_like(p["q"])
            lse = torch.empty(b, h, s, device=DEVICE, dtype=torch.float32)
            dq, dk, dv = (torch.empty_like(p[n]) for n in ("q", "k", "v"))
            watched, wanted = ((dq, dk, dv), ref_grads) if backward else ((o,), (ref_out,))
            runs = []
            for name, aot in aots.items():
                fwd = aot.bind_fwd(p["q"], p["k"], p["v"], o, lse, p["scale"], causal=p["causal"])
                if backward:  # each backend's backward reads its own forward's out and LSE
                    bwd = aot.bind_bwd(p["q"], p["k"], p["v"], o, p["do"], lse, torch.empty_like(lse), dq, dk, dv,
                                       p["scale"], causal=p["causal"])
                    runs.append((f"{operator} on {name}", fwd, bwd))
                else:
                    runs.append((f"{operator} on {name}", lambda: None, fwd))
            results = time_candidates(torch, do_bench, runs, watched, wanted, args.rep_ms)
            if len(results) < 2:
                continue  # one backend alone decides nothing
            win, _, _ = pick(results)
            other = [r for r in results if r is not win][0]
            name_of = lambda label: label.rsplit(" ", 1)[-1]  # noqa: E731
            win, other = (win[0], win[1], name_of(win[2])), (other[0], other[1], name_of(other[2]))
            entry = {"operator": operator, "functional": functional, "mask": mask, "seqlen_q_bin": index,
                     "seqlen_k_bin": index, "winner": win[2], "winner_ms": round(win[0], 5),
                     "runner_up": other[2], "runner_up_ms": round(other[0], 5)}
            if args.hidden != tuning.DEFAULT_HIDDEN:
                entry["hidden"] = args.hidden
            print(f"{operator} {tuning.functional_key(functional)} {mask} S{s}: {win[2]} {win[0]:.4f} ms "
                  f"({other[2]} {other[0]:.4f} ms)", flush=True)
            record(key, entry)


def main(argv=None, shim_module=None, bench=None):
    """``shim_module`` / ``bench``: stand-ins for bench/aotriton_shim.py and triton's do_bench
    (the dry-run test); None on the GPU machine."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shim", required=True, help="libaotriton_shim.so (bench/shim.cpp)")
    ap.add_argument("--pack", required=True, help="aotriton-pack (lists the archive's kernels)")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--archive", help="the tuning archive (default $AOTRITON_IMAGE_DIR/aotriton-<arch>.images)")
    ap.add_argument("--out", required=True, help="the database to write (tuning/<arch>.json)")
    ap.add_argument("--progress", required=True, help="finished cells (JSON), read and extended: resumable")
    ap.add_argument("--families", default=",".join(TUNED_FAMILIES),
                    help="comma-separated; empty with --backends: time the backends only (any build's archive)")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--masks", default="none,causal")
    ap.add_argument("--only", help="tune only functionals whose key contains this text")
    ap.add_argument("--rep-ms", type=int, default=25, help="do_bench's timing window per candidate")
    ap.add_argument("--hidden", type=int, default=tuning.DEFAULT_HIDDEN,
                    help="H x D of the timed problems (default the grid's); another value is recorded per entry "
                         "(fp32: 512 keeps >= 1k CTAs per cell at a quarter of the device time)")
    ap.add_argument("--budget", type=float, default=480, help="seconds; stop before starting a functional past it")
    ap.add_argument("--backends", action="store_true",
                    help="also time each operator on the Gluon and the portable backend (sm_90)")
    args = ap.parse_args(argv)
    args.masks = args.masks.split(",")

    import torch

    if shim_module is None:
        import aotriton_shim as shim_module
    if bench is None:
        from triton.testing import do_bench as bench
    shim = shim_module

    start = time.monotonic()
    archive = args.archive or os.path.join(os.environ.get("AOTRITON_IMAGE_DIR", ""), f"aotriton-{args.arch}.images")
    in_archive = archive_kernel_ids(args.pack, archive)
    aot = shim.Aotriton(args.shim, backend="portable")
    device_name = torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE
    print(f"tune: {aot.version}, {device_name}, archive {archive} ({len(in_archive)} kernels)", flush=True)
    done = {}
    if os.path.exists(args.progress):
        with open(args.progress) as f:
            done = json.load(f)
    # A database is measured on one device (its "measured_on"): a progress file says which, and a
    # run on another device does not extend it.
    recorded = done.get(PROGRESS_DEVICE_KEY, {}).get("device")
    if recorded is not None and recorded != device_name:
        sys.exit(f"tune: {args.progress} holds cells measured on {recorded}, this is {device_name}: a database "
                 "is measured on one device (start another progress file)")
    done[PROGRESS_DEVICE_KEY] = {"device": device_name}
    data = tuning.new(args.arch, {"device": device_name, "aotriton": aot.version,
                                  "triton": getattr(bench, "triton_version", None) or __import__("triton").__version__})

    def record(key, entry):
        done[key] = entry
        with open(args.progress + ".tmp", "w") as f:
            json.dump(done, f)
        os.replace(args.progress + ".tmp", args.progress)

    def write_db():
        data["entries"] = [e for e in done.values() if "family" in e]
        data["backends"] = [e for e in done.values() if "operator" in e]
        tuning.Database(data, args.out)  # checks before writing
        with open(args.out, "w") as f:
            f.write(tuning.dumps(data))

    specs = rules.enumerate_kernels(args.arch, for_tuning=True)
    stopped = False
    for family in [f for f in args.families.split(",") if f]:
        fam = rules.family(family)
        for functional in rules.functionals(fam):
            if functional["dtype"] not in args.dtypes.split(","):
                continue
            if args.only and args.only not in tuning.functional_key(functional):
                continue
            # The optional axes (softcap, ALiBi, sinks, V's head dim) are not tuned: their functionals
            # take the heuristic config (rules.py), and the tuner's reference has none of them.
            if any(functional.get(a) for a in rules.OPTIONAL_AXES):
                continue
            offered = [s for s in specs if s.family == family and s.functional == functional
                       and s.variant == "aligned"]
            # Head dim 512 (and any functional whose rules offer only the heuristic's config): one
            # candidate, nothing to time.
            if not any(s.tuned_only for s in offered):
                print(f"{family} {tuning.functional_key(functional)}: one candidate (the heuristic's), not tuned",
                      flush=True)
                continue
            ids = sorted(s.id for s in offered if s.id in in_archive)
            if not any(s.tuned_only and s.id in in_archive for s in offered):
                sys.exit(f"tune: the archive holds no tuning candidate of {family} {functional}: it is not a "
                         "tuning build (python/compile.py --for-tuning; scripts/stage-tuning.sh)")
            if len(ids) < len(offered):  # dropped by the tuning build: they did not fit the arch
                print(f"{family} {tuning.functional_key(functional)}: {len(offered) - len(ids)} candidates "
                      "not in the archive (did not fit the arch)", flush=True)
            if time.monotonic() - start > args.budget:
                stopped = True
                break
            measure_functional(torch, bench, aot, shim, family, functional, ids, args, done, record)
            write_db()
        if stopped:
            break
    if args.backends and not stopped:
        aots = {name: shim.Aotriton(args.shim, backend=name) for name in ("gluon", "portable")}
        for operator, family in (("attn_fwd", "attn_fwd_gluon"), ("attn_bwd", "attn_bwd_gluon")):
            # The backend is per operator: the Gluon functionals' (dtype, head_dim), once each.
            keys = {tuning.functional_key({k: f[k] for k in ("dtype", "head_dim")})
                    for f in rules.functionals(rules.family(family))}
            for key in sorted(keys):
                functional = json.loads(key)
                if functional["dtype"] not in args.dtypes.split(",") or (args.only and args.only not in key):
                    continue
                if time.monotonic() - start > args.budget:
                    stopped = True
                    break
                measure_backends(torch, bench, aots, shim, operator, functional, args, done, record)
                write_db()
            if stopped:
                break
    write_db()
    print(f"tune: {len(done) - 1} cells in {args.progress}; database {args.out}"
          + (" (stopped at the budget: run again to continue)" if stopped else " (complete for the selection)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
