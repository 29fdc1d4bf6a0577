"""python/tune.py's logic on the CPU: a float64 stand-in for the bench shim and a fake timer.

What it checks: every candidate of a functional is forced and run at every cell of the grid, a
candidate whose result is wrong never wins (the 3x-best-error rule), the fastest correct one does,
with its runner-up and margin; the database written is valid and canonical; a rerun with the
progress file measures nothing again; the budget stops between functionals. The stand-in proves
no kernel: the tuner's GPU run does. Needs torch (skipped without it).
"""
import contextlib
import importlib.util
import json
import math
import os
import tempfile
import unittest
from unittest import mock

import _paths  # noqa: F401
import rules
import tuning

HAVE_TORCH = importlib.util.find_spec("torch") is not None


def fake_time(kernel_id):
    """A deterministic 'time' per candidate: smaller BLOCK_M x BLOCK_N tiles are 'faster' here."""
    tag = kernel_id.split("-")[-2]
    m, rest = tag[1:].split("n", 1)
    n = rest.split("w", 1)[0]
    return 1.0 + int(m) * int(n) / 10000.0


def broken(kernel_id):
    """Candidates the stand-in computes wrongly: the fastest tile shape, so the rule must skip it."""
    return "-m16n64w4s2-" in kernel_id or "-m32n32w4s1-" in kernel_id


@contextlib.contextmanager
def dry_grid(tune, ids, edges, tokens, hidden):
    """The tuner on the CPU over a small grid, its archive holding ``ids``; yields a scratch folder."""
    with mock.patch.object(tune, "DEVICE", "cpu"), \
            mock.patch.object(tune, "archive_kernel_ids", lambda pack, archive: ids), \
            mock.patch.object(tuning, "DEFAULT_EDGES", edges), mock.patch.object(tuning, "DEFAULT_TOKENS", tokens), \
            mock.patch.object(tuning, "DEFAULT_HIDDEN", hidden), tempfile.TemporaryDirectory() as tmp:
        yield tmp


def make_shim(torch, calls):
    class Dropout:
        def __init__(self, p, seed):
            self.p, self.seed = p, seed

        @staticmethod
        def make(p, seed, offset, base=0, device="cpu"):
            return Dropout(p, seed)

    def keep_mask(shape, seed):
        b, h, s, k = shape
        i = torch.arange(s)[:, None]
        j = torch.arange(k)[None, :]
        return ((i * 31 + j * 17 + seed) % 7 != 0).double().expand(b, h, s, k)

    class Aotriton:
        version = "0.1.0 (stand-in)"

        def __init__(self, path, backend="auto"):
            assert backend in ("portable", "gluon"), "the tuner names the backend it times"
            self.forced = None
            self.backend = backend

        def force_kernel(self, kernel_id):
            self.forced = kernel_id

        def forced_count(self):
            return sum(1 for c in calls if c[1] is not None)

        def debug_dropout_mask(self, shape, dropout):
            return keep_mask(shape, dropout.seed).float()

        def _attn(self, q, k, v, scale, causal, bias, dropout):
            s = q.double() @ k.double().transpose(-1, -2) * scale
            if bias is not None:
                s = s + bias.double()
            if causal:
                n = s.shape[-1]
                s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
            w = torch.softmax(s, dim=-1)
            if dropout is not None:
                w = w * keep_mask(w.shape, dropout.seed) / (1 - dropout.p)
            return w @ v.double()

        def bind_fwd(self, q, k, v, o, lse, scale, causal=False, bias=None, dropout=None, allow_tf32=False):
            def run():
                calls.append(("fwd", self.forced, self.backend, q.shape[2]))
                out = self._attn(q, k, v, scale, causal, bias, dropout)
                if self.forced is not None and broken(self.forced):
                    out = out + 0.5
                o.copy_(out)
                lse.fill_(0.0)
            return run

        def bind_bwd(self, q, k, v, o, d_o, lse, delta, dq, dk, dv, scale, causal=False, bias=None, dropout=None,
                     allow_tf32=False):
            def run():
                calls.append(("bwd", self.forced, self.backend, q.shape[2]))
                leaves = [t.double().requires_grad_() for t in (q, k, v)]
                with torch.enable_grad():
                    out = self._attn(*leaves, scale, causal, bias, dropout)
                    grads = torch.autograd.grad(out, leaves, d_o.double())
                for dst, g in zip((dq, dk, dv), grads):
                    dst.copy_(g + (0.5 if self.forced is not None and broken(self.forced) else 0.0))
            return run

    return type("Shim", (), {"Aotriton": Aotriton, "Dropout": Dropout})


@unittest.skipUnless(HAVE_TORCH, "skipped: torch is not installed (the tuner's dry run needs it)")
class TuneDryRunTest(unittest.TestCase):
    def test_dry_run(self):
        import torch

        import tune

        calls = []
        shim = make_shim(torch, calls)
        forced_times = []

        def bench(fn, warmup, rep, return_mode):
            fn()
            forced_times.append(calls[-1][1])
            return fake_time(calls[-1][1])

        # The tuning build dropped one candidate (it did not fit): the tuner goes on without it.
        dropped = "attn_fwd-bf16-tf0-hd16-drop0-bias0-m64n128w4s2-aligned"
        ids = {s.id for s in rules.enumerate_kernels("sm_90", for_tuning=True)} - {dropped}
        patches = [mock.patch.object(tune, "DEVICE", "cpu"), mock.patch.object(tune, "archive_kernel_ids",
                                                                                 lambda pack, archive: ids),
                   mock.patch.object(tuning, "DEFAULT_EDGES", [0, 16, 48]),
                   mock.patch.object(tuning, "DEFAULT_TOKENS", 96), mock.patch.object(tuning, "DEFAULT_HIDDEN", 32)]
        for p in patches:
            p.start()
        self.addCleanup(lambda: [p.stop() for p in patches])
        with tempfile.TemporaryDirectory() as tmp:
            out, progress = os.path.join(tmp, "sm_90.json"), os.path.join(tmp, "progress.json")
            argv = ["--shim", "x", "--pack", "x", "--archive", "x", "--out", out, "--progress", progress,
                    "--dtypes", "bf16", "--only", '"head_dim":16', "--rep-ms", "1"]
            self.assertEqual(tune.main(argv, shim_module=shim, bench=bench), 0)
            db = tuning.load(out)
            functionals = [f for f in rules.functionals(rules.ATTN_FWD) if f["dtype"] == "bf16" and f["head_dim"] == 16
                           and not any(f.get(a) for a in rules.OPTIONAL_AXES)]  # not tuned (tune.py)
            # 3 families x 4 functionals (dropout x bias) x 2 masks x 3 bins.
            self.assertEqual(len(db.entries), 3 * len(functionals) * 2 * 3)
            for e in db.entries:
                fam = rules.family(e["family"])
                cands = [s.id for s in rules.enumerate_kernels("sm_90", [fam], for_tuning=True)
                         if s.functional == e["functional"] and s.variant == "aligned" and s.id != dropped]
                good = sorted((fake_time(i), i.split("-")[-2]) for i in cands if not broken(i))
                self.assertEqual(e["winner"], good[0][1], e)
                self.assertEqual(e["runner_up"], good[1][1], e)
                self.assertAlmostEqual(e["winner_ms"], good[0][0], places=4)
                self.assertEqual(e["candidates"], len(cands))
                self.assertLess(e["error"], 0.1, e)  # bf16 outputs vs the fp32 reference; broken ones are 0.5 off
            # Every candidate was forced at every cell; the backward reads a forward run unforced.
            self.assertTrue(any(c[:2] == ("fwd", None) for c in calls))
            candidates = {s.id for s in rules.enumerate_kernels("sm_90", for_tuning=True)
                          if s.family in tune.TUNED_FAMILIES and s.functional["dtype"] == "bf16"
                          and s.functional["head_dim"] == 16 and s.variant == "aligned"
                          and not any(s.functional.get(a) for a in rules.OPTIONAL_AXES)} - {dropped}
            self.assertEqual(set(forced_times), candidates)  # timed, then judged by their error
            # Rerun: nothing is measured again; the database is the same text.
            text = open(out).read()
            before = len(calls)
            self.assertEqual(tune.main(argv, shim_module=shim, bench=bench), 0)
            self.assertEqual(len(calls), before)
            self.assertEqual(open(out).read(), text)
            with open(progress) as f:
                kept = json.load(f)
            self.assertEqual(kept.pop(tune.PROGRESS_DEVICE_KEY), {"device": "cpu"})
            self.assertEqual(len(kept), len(db.entries))
            # The database drives the build: each winner becomes a kernel with its cells.
            specs = rules.enumerate_kernels("sm_90", [rules.ATTN_FWD], tuning=db)
            tuned = [s for s in specs if s.tuned_for]
            self.assertTrue(tuned)
            self.assertTrue(all(math.isfinite(c["seqlen_q"][0]) for s in tuned for c in s.tuned_for))

    def test_backend_table(self):
        import torch

        import tune

        calls = []
        shim = make_shim(torch, calls)

        def bench(fn, warmup, rep, return_mode):
            fn()
            _, forced, backend, length = calls[-1]
            # The stand-in's Gluon is faster from 32 tokens on, slower below.
            return (1.0 if length >= 32 else 3.0) if backend == "gluon" else 2.0

        ids = {s.id for s in rules.enumerate_kernels("sm_90", for_tuning=True)}
        with dry_grid(tune, ids, [0, 16, 48], 96, 128) as tmp:
            out, progress = os.path.join(tmp, "db.json"), os.path.join(tmp, "progress.json")
            argv = ["--shim", "x", "--pack", "x", "--archive", "x", "--out", out, "--progress", progress,
                    "--dtypes", "bf16", "--only", '"head_dim":64', "--rep-ms", "1", "--families", "attn_fwd",
                    "--backends"]
            self.assertEqual(tune.main(argv, shim_module=shim, bench=bench), 0)
            db = tuning.load(out)
            # attn_fwd and attn_bwd x (bf16, hd64) x 2 masks x 3 bins.
            self.assertEqual(len(db.backends), 2 * 2 * 3)
            for e in db.backends:
                length = tuning.representative([0, 16, 48])[e["seqlen_q_bin"]]
                self.assertEqual(e["winner"], "gluon" if length >= 32 else "portable", e)
            cells = db.portable_cells("attn_fwd_gluon", {"dtype": "bf16", "head_dim": 64})
            self.assertEqual({(c["mask"], tuple(c["seqlen_q"])) for c in cells}, {("none", (0, 16)), ("causal", (0, 16))})
            self.assertTrue(any(c[2] == "gluon" and c[0] == "bwd" for c in calls))

    def test_backend_table_alone_on_a_normal_build(self):
        """``--families ""``: the backends only, timed through a normal build's archive (no
        candidates); the finished cells of the progress file stay in the database."""
        import torch

        import tune

        calls = []
        shim = make_shim(torch, calls)
        normal = {s.id for s in rules.enumerate_kernels("sm_90")}
        earlier = {"cell": {"family": "attn_fwd", "functional": {"dtype": "bf16", "tf32": False, "head_dim": 64,
                                                                  "dropout": False, "bias": False},
                            "mask": "none", "seqlen_q_bin": 0, "seqlen_k_bin": 0, "winner": "m64n64w4s2",
                            "winner_ms": 1.0, "error": 0.001, "best_error": 0.001, "candidates": 2}}
        with dry_grid(tune, normal, [0, 16, 48], 96, 128) as tmp:
            out, progress = os.path.join(tmp, "db.json"), os.path.join(tmp, "progress.json")
            with open(progress, "w") as f:
                json.dump(earlier, f)
            argv = ["--shim", "x", "--pack", "x", "--archive", "x", "--out", out, "--progress", progress,
                    "--dtypes", "bf16", "--only", '"head_dim":64', "--rep-ms", "1", "--families", "", "--backends"]
            self.assertEqual(tune.main(argv, shim_module=shim, bench=lambda fn, **kw: (fn(), 1.0)[1]), 0)
            db = tuning.load(out)
            self.assertEqual(len(db.backends), 2 * 2 * 3)
            self.assertEqual(db.entries, [earlier["cell"]])
            self.assertFalse(any(c[1] is not None for c in calls), "no candidate is forced")

    def test_refuses_an_archive_that_is_not_a_tuning_build(self):
        import torch

        import tune

        normal = {s.id for s in rules.enumerate_kernels("sm_90")}
        with mock.patch.object(tune, "DEVICE", "cpu"), \
                mock.patch.object(tune, "archive_kernel_ids", lambda pack, archive: normal), \
                tempfile.TemporaryDirectory() as tmp:
            argv = ["--shim", "x", "--pack", "x", "--archive", "x", "--out", os.path.join(tmp, "db.json"),
                    "--progress", os.path.join(tmp, "p.json"), "--dtypes", "bf16", "--only", '"head_dim":16']
            with self.assertRaises(SystemExit) as cm:
                tune.main(argv, shim_module=make_shim(torch, []), bench=lambda fn, **kw: 1.0)
            self.assertIn("not a tuning build", str(cm.exception.code))

    def test_refuses_a_progress_file_of_another_device(self):
        """The cells of one database come from one device: a progress file that names another
        device is not extended (nothing is timed)."""
        import torch

        import tune

        calls = []
        ids = {s.id for s in rules.enumerate_kernels("sm_90", for_tuning=True)}
        with dry_grid(tune, ids, [0, 16], 32, 64) as tmp:
            progress = os.path.join(tmp, "p.json")
            with open(progress, "w") as f:
                json.dump({tune.PROGRESS_DEVICE_KEY: {"device": "NVIDIA H200"}}, f)
            argv = ["--shim", "x", "--pack", "x", "--archive", "x", "--out", os.path.join(tmp, "db.json"),
                    "--progress", progress, "--dtypes", "bf16", "--only", '"head_dim":16', "--families", "attn_fwd"]
            with self.assertRaises(SystemExit) as cm:
                tune.main(argv, shim_module=make_shim(torch, calls), bench=lambda fn, **kw: (fn(), 1.0)[1])
            self.assertIn("measured on NVIDIA H200, this is cpu", str(cm.exception.code))
            self.assertEqual(calls, [])

    def test_a_functional_with_one_candidate_is_skipped(self):
        """Head dim 512 offers only the heuristic's config: nothing to time, and the sweep goes on."""
        import torch

        import tune

        calls = []
        ids = {s.id for s in rules.enumerate_kernels("sm_90", for_tuning=True)}
        with dry_grid(tune, ids, [0, 16], 32, 64) as tmp:
            out = os.path.join(tmp, "db.json")
            argv = ["--shim", "x", "--pack", "x", "--archive", "x", "--out", out, "--progress",
                    os.path.join(tmp, "p.json"), "--dtypes", "bf16", "--only", '"head_dim":512', "--families",
                    "attn_fwd"]
            self.assertEqual(tune.main(argv, shim_module=make_shim(torch, calls), bench=lambda fn, **kw: 1.0), 0)
            self.assertEqual(calls, [])

    def test_hidden_is_recorded_where_it_differs(self):
        """``--hidden``: the timed problems have H x D = hidden, and each entry says so."""
        import torch

        import tune

        calls = []
        shim = make_shim(torch, calls)
        shapes = []
        real = tune.cell_problem

        def spy(torch_, functional, mask, length, tokens, hidden, gen):
            p = real(torch_, functional, mask, length, tokens, hidden, gen)
            shapes.append(p["h"] * functional["head_dim"])
            return p

        ids = {s.id for s in rules.enumerate_kernels("sm_90", for_tuning=True)}
        with dry_grid(tune, ids, [0, 16], 32, 64) as tmp, mock.patch.object(tune, "cell_problem", spy):
            out, progress = os.path.join(tmp, "db.json"), os.path.join(tmp, "progress.json")
            argv = ["--shim", "x", "--pack", "x", "--archive", "x", "--out", out, "--progress", progress,
                    "--dtypes", "bf16", "--only", '"bias":false,"dropout":false,"dtype":"bf16","head_dim":16',
                    "--rep-ms", "1", "--families", "attn_fwd", "--hidden", "32"]
            self.assertEqual(tune.main(argv, shim_module=shim, bench=lambda fn, **kw: (fn(), 1.0)[1]), 0)
            db = tuning.load(out)
            self.assertTrue(db.entries)
            self.assertEqual({e.get("hidden") for e in db.entries}, {32})
            self.assertEqual(set(shapes), {32})

    def test_budget_stops_between_functionals(self):
        import torch

        import tune

        calls = []
        shim = make_shim(torch, calls)
        ids = {s.id for s in rules.enumerate_kernels("sm_90", for_tuning=True)}
        with dry_grid(tune, ids, [0, 16], 32, 32) as tmp:
            out, progress = os.path.join(tmp, "db.json"), os.path.join(tmp, "progress.json")
            argv = ["--shim", "x", "--pack", "x", "--archive", "x", "--out", out, "--progress", progress,
                    "--dtypes", "bf16", "--only", '"head_dim":16', "--rep-ms", "1", "--budget", "0",
                    "--families", "attn_fwd"]
            self.assertEqual(tune.main(argv, shim_module=shim, bench=lambda fn, **kw: (fn(), 1.0)[1]), 0)
            self.assertEqual(calls, [], "a zero budget starts no functional")
            self.assertEqual(tuning.load(out).entries, [])


if __name__ == "__main__":
    unittest.main()
