"""The tuning database (python/tuning.py) and what rules.py builds from it (no Triton needed)."""
import io
import json
import os
import tempfile
import unittest
from contextlib import redirect_stdout

import _paths  # noqa: F401
import rules
import tuning

BF16_128 = {"dtype": "bf16", "tf32": False, "head_dim": 128, "dropout": False, "bias": False}


def entry(family="attn_fwd", functional=None, mask="none", q=2, k=2, winner="m128n64w4s2", ms=1.0, **extra):
    e = {"family": family, "functional": dict(functional or BF16_128), "mask": mask, "seqlen_q_bin": q,
         "seqlen_k_bin": k, "winner": winner, "winner_ms": ms}
    e.update(extra)
    return e


def db(*entries, arch="sm_90"):
    data = tuning.new(arch, {"device": "test"})
    data["entries"] = list(entries)
    return tuning.Database(data, "test.json")


class GridTest(unittest.TestCase):
    def test_bins_and_representatives(self):
        edges = tuning.DEFAULT_EDGES
        self.assertEqual(tuning.representative(edges), [256, 1024, 4096, 16384])
        for rep, b in zip(tuning.representative(edges), range(4)):
            self.assertEqual(tuning.bin_of(rep, edges), b)
        self.assertEqual([tuning.bin_of(n, edges) for n in (1, 511, 512, 8191, 8192, 1 << 30)], [0, 0, 1, 2, 3, 3])
        self.assertEqual(tuning.bin_range(3, edges), [8192, None])
        self.assertEqual(tuning.bin_range(0, edges), [0, 512])


class DatabaseTest(unittest.TestCase):
    def test_rejects_bad_databases_by_name(self):
        good = tuning.new("sm_90", {})
        cases = [
            (dict(good, format=2), "format 2"),
            ({k: v for k, v in good.items() if k != "arch"}, "no 'arch'"),
            (dict(good, grid={"seqlen_edges": [0, 512, 256]}), "increasing"),
            (dict(good, entries=[entry(mask="sliding")]), "mask 'sliding'"),
            (dict(good, entries=[entry(q=4)]), "seqlen_q_bin 4"),
            (dict(good, entries=[entry(ms=0)]), "positive time"),
            (dict(good, entries=[dict(entry(), hidden=0)]), "hidden must be a positive integer"),
            (dict(good, entries=[entry(), entry(winner="m64n64w4s2")]), "a second entry"),
            (dict(good, entries=[{k: v for k, v in entry().items() if k != "winner"}]), "no 'winner'"),
        ]
        for data, needle in cases:
            with self.subTest(needle=needle):
                with self.assertRaises(tuning.TuningError) as cm:
                    tuning.Database(data, "bad.json")
                self.assertIn(needle, str(cm.exception))
                self.assertIn("bad.json", str(cm.exception))

    def test_winners_gives_cells(self):
        d = db(entry(q=0, k=1, winner="m64n64w4s2"), entry(q=3, k=3, mask="causal"),
               entry(functional=dict(BF16_128, head_dim=64), winner="m64n64w4s3"))
        won = d.winners("attn_fwd", BF16_128)
        self.assertEqual(set(won), {"m64n64w4s2", "m128n64w4s2"})
        self.assertEqual(won["m64n64w4s2"], [{"mask": "none", "seqlen_q": [0, 512], "seqlen_k": [512, 2048]}])
        self.assertEqual(won["m128n64w4s2"], [{"mask": "causal", "seqlen_q": [8192, None], "seqlen_k": [8192, None]}])
        self.assertEqual(d.winners("attn_bwd_dq", BF16_128), {})

    def test_ties_fold_into_configs_compiled_anyway(self):
        tie = 1 + (tuning.TIE - 1) / 2
        # m64n64w4s2 wins two cells by under TIE over the heuristic's m128n64w4s2: folded into it.
        # m32n64w4s2 wins its cell by 10 %: kept. m16n64w4s2 has no runner-up: kept.
        d = db(entry(q=0, k=0, winner="m64n64w4s2", ms=1.0, runner_up="m128n64w4s2", runner_up_ms=tie),
               entry(q=1, k=1, winner="m64n64w4s2", ms=2.0, runner_up="m128n64w4s2", runner_up_ms=2.0 * tie),
               entry(q=2, k=2, winner="m32n64w4s2", ms=1.0, runner_up="m128n64w4s2", runner_up_ms=1.1),
               entry(q=3, k=3, mask="causal", winner="m16n64w4s2", ms=1.0))
        self.assertEqual(set(d.winners("attn_fwd", BF16_128)), {"m64n64w4s2", "m32n64w4s2", "m16n64w4s2"})
        won = d.winners("attn_fwd", BF16_128, compiled=["m128n64w4s2"])
        self.assertEqual(set(won), {"m128n64w4s2", "m32n64w4s2", "m16n64w4s2"})
        self.assertEqual([c["seqlen_q"][0] for c in won["m128n64w4s2"]], [0, 512])
        # A winner that ties with another cell's winner folds into it, the one serving fewer
        # cells first; a cell moved onto a config keeps that config from folding in turn.
        d = db(entry(q=0, k=0, winner="m64n32w4s2", ms=1.0, runner_up="m64n64w4s2", runner_up_ms=tie),
               entry(q=1, k=1, winner="m64n64w4s2", ms=1.0, runner_up="m128n64w4s2", runner_up_ms=tie),
               entry(q=2, k=2, winner="m64n64w4s2", ms=1.0, runner_up="m128n64w4s2", runner_up_ms=tie))
        won = d.winners("attn_fwd", BF16_128, compiled=["m128n64w4s2"])
        self.assertEqual({t: [c["seqlen_q"][0] for c in cells] for t, cells in won.items()}, {"m64n64w4s2": [0, 512, 2048]})

    def test_canonical_text_and_diff(self):
        a = db(entry(q=1, k=1), entry(q=2, k=2, winner="m64n64w4s2", ms=2.0))
        b = db(entry(q=2, k=2, winner="m128n128w8s3", ms=1.5), entry(q=3, k=3))
        text = a.to_json()
        self.assertEqual(tuning.Database(json.loads(text)).to_json(), text)
        self.assertEqual(len([ln for ln in text.splitlines() if ln.strip().startswith('{"family"')]), 2)
        lines = tuning.diff(a, b)
        self.assertEqual(len(lines), 3, lines)
        self.assertTrue(any(ln.startswith("- ") and "bins (1, 1)" in ln for ln in lines))
        self.assertTrue(any(ln.startswith("~ ") and "m64n64w4s2 2 ms -> m128n128w8s3 1.5 ms" in ln for ln in lines))
        self.assertTrue(any(ln.startswith("+ ") and "bins (3, 3)" in ln for ln in lines))

    def test_cli(self):
        with tempfile.TemporaryDirectory() as tmp:
            old, new = os.path.join(tmp, "old.json"), os.path.join(tmp, "new.json")
            with open(old, "w") as f:
                f.write(db(entry()).to_json())
            with open(new, "w") as f:
                f.write(db(entry(winner="m64n64w4s2")).to_json())
            out = io.StringIO()
            with redirect_stdout(out):
                self.assertEqual(tuning.main(["diff", old, new]), 0)
                self.assertEqual(tuning.main(["show", new]), 0)
            self.assertIn("m128n64w4s2 1 ms -> m64n64w4s2 1 ms", out.getvalue())
            with open(new, "w") as f:
                f.write("{")
            self.assertEqual(tuning.main(["show", new]), 1)

    def test_load_arch(self):
        with tempfile.TemporaryDirectory() as tmp:
            self.assertIsNone(tuning.load_arch("sm_90", tmp))
            with open(os.path.join(tmp, "sm_90.json"), "w") as f:
                f.write(db(entry(), arch="sm_80").to_json())
            with self.assertRaises(tuning.TuningError) as cm:
                tuning.load_arch("sm_90", tmp)
            self.assertIn("holds arch 'sm_80'", str(cm.exception))


class BackendTableTest(unittest.TestCase):
    def backend(self, winner="portable", operator="attn_fwd", head_dim=64, mask="causal", q=0, k=0):
        return {"operator": operator, "functional": {"dtype": "bf16", "head_dim": head_dim}, "mask": mask,
                "seqlen_q_bin": q, "seqlen_k_bin": k, "winner": winner, "winner_ms": 0.03}

    def with_backends(self, *rows):
        data = tuning.new("sm_90", {})
        data["backends"] = list(rows)
        return tuning.Database(data, "b.json")

    def test_checks_and_cells(self):
        cases = [(dict(operator="attn_dbias"), "has one backend"), (dict(winner="cudnn"), "winner 'cudnn'"),
                 (dict(q=9), "seqlen_q_bin 9")]
        for change, needle in cases:
            with self.subTest(needle=needle), self.assertRaises(tuning.TuningError) as cm:
                self.with_backends(self.backend(**change))
            self.assertIn(needle, str(cm.exception))
        with self.assertRaises(tuning.TuningError):
            self.with_backends(self.backend(), self.backend(winner="gluon"))
        d = self.with_backends(self.backend(), self.backend(winner="gluon", q=1, k=1),
                               self.backend(operator="attn_bwd", mask="none"))
        fwd64 = {"dtype": "bf16", "head_dim": 64}
        self.assertEqual(d.portable_cells("attn_fwd_gluon", fwd64),
                         [{"mask": "causal", "seqlen_q": [0, 512], "seqlen_k": [0, 512]}])
        self.assertEqual(d.portable_cells("attn_fwd_gluon", {"dtype": "bf16", "head_dim": 128}), [])
        self.assertEqual(len(d.portable_cells("attn_bwd_gluon", dict(fwd64, dq=True))), 1)
        self.assertEqual(d.portable_cells("attn_fwd", fwd64), [])
        text = d.to_json()
        self.assertIn('"backends": [', text)
        self.assertEqual(tuning.Database(json.loads(text)).to_json(), text)
        lines = tuning.diff(self.with_backends(), d)
        self.assertEqual(len(lines), 3, lines)

    def test_gluon_kernels_carry_the_portable_cells(self):
        d = self.with_backends(self.backend(), self.backend(operator="attn_bwd", mask="none"))
        specs = rules.enumerate_kernels("sm_90", rules.GLUON_FAMILIES, tuning=d)
        bf16_64 = lambda s: s.functional["dtype"] == "bf16" and s.functional["head_dim"] == 64  # noqa: E731
        fwd = [s for s in specs if s.family == "attn_fwd_gluon" and bf16_64(s)]
        self.assertTrue(fwd and all(s.portable_for for s in fwd))
        self.assertFalse(any(s.portable_for for s in specs if s.family == "attn_fwd_gluon" and not bf16_64(s)))
        bwd = [s for s in specs if s.family == "attn_bwd_gluon" and bf16_64(s)]
        # dq on and off, packed and not, dropout and not: every one of them shares the operator's decision
        self.assertTrue(len(bwd) == 8 and all(s.portable_for[0]["mask"] == "none" for s in bwd), [s.id for s in bwd])


class RulesWithDatabaseTest(unittest.TestCase):
    def fwd_specs(self, specs, functional):
        return [s for s in specs if s.family == "attn_fwd" and s.functional == functional]

    def test_winner_added_with_its_cells_and_fallback_kept(self):
        base = rules.enumerate_kernels("sm_90", [rules.ATTN_FWD])
        tuned = rules.enumerate_kernels("sm_90", [rules.ATTN_FWD],
                                        tuning=db(entry(winner="m64n128w4s2"), entry(q=3, k=3, mask="causal")))
        before, after = self.fwd_specs(base, BF16_128), self.fwd_specs(tuned, BF16_128)
        self.assertEqual(len(after), len(before) + 2)  # two winners, neither a heuristic config
        self.assertTrue({s.id for s in before} <= {s.id for s in after}, "the heuristic fallback stays")
        (won,) = [s for s in after if rules.config_tag(s.config) == "m64n128w4s2"]
        self.assertEqual(won.variant, "aligned")
        self.assertTrue(won.tuned_only, "the heuristic must not pick a database-only kernel")
        self.assertFalse(any(s.tuned_only for s in before))
        self.assertEqual(list(won.tuned_for), [{"mask": "none", "seqlen_q": [2048, 8192], "seqlen_k": [2048, 8192]}])
        (other,) = [s for s in after if rules.config_tag(s.config) == "m128n64w4s2" and s.variant == "aligned"]
        self.assertEqual(other.tuned_for[0]["mask"], "causal")
        heuristic = [s for s in after if s.variant == "aligned" and not s.tuned_only]
        self.assertEqual({s.id for s in heuristic}, {s.id for s in before if s.variant == "aligned"})
        self.assertEqual({s.id for s in before if s.variant == "generic"}, {s.id for s in after if s.variant == "generic"})
        untouched = dict(BF16_128, head_dim=64)
        self.assertEqual([s.id for s in self.fwd_specs(base, untouched)], [s.id for s in self.fwd_specs(tuned, untouched)])
        self.assertFalse(any(s.tuned_for for s in self.fwd_specs(tuned, untouched)))

    def test_unknown_config_and_other_arch_refused(self):
        with self.assertRaises(ValueError) as cm:
            rules.enumerate_kernels("sm_90", [rules.ATTN_FWD], tuning=db(entry(winner="m999n64w4s2")))
        self.assertIn("m999n64w4s2", str(cm.exception))
        with self.assertRaises(ValueError):
            rules.enumerate_kernels("sm_90", [rules.ATTN_FWD], tuning=db(entry(), arch="sm_80"))

    def test_tuning_build_has_every_candidate(self):
        specs = rules.enumerate_kernels("sm_90", for_tuning=True)
        for fam in (rules.ATTN_FWD, rules.ATTN_BWD_DKDV, rules.ATTN_BWD_DQ):
            for functional in rules.functionals(fam):
                tags = {rules.config_tag(s.config) for s in specs
                        if s.family == fam.name and s.functional == functional and s.variant == "aligned"}
                want = {rules.config_tag(c) for c in fam.candidates("sm_90", functional)}
                self.assertEqual(tags, want, f"{fam.name} {functional}")
                heuristic = {rules.config_tag(c) for c in fam.configs("sm_90", functional)}
                self.assertTrue(heuristic <= want)
                untuned = {rules.config_tag(s.config) for s in specs if s.family == fam.name and
                           s.functional == functional and s.variant == "aligned" and not s.tuned_only}
                self.assertEqual(untuned, heuristic)
        normal = rules.enumerate_kernels("sm_90")
        self.assertEqual({s.id for s in normal if s.variant == "generic"}, {s.id for s in specs if s.variant == "generic"})
        # AMD: no GPU to tune on, the candidates are the configs.
        self.assertEqual(len(rules.enumerate_kernels("gfx942", for_tuning=True)), len(rules.enumerate_kernels("gfx942")))

    def test_tags_match_kernel_ids(self):
        for s in rules.enumerate_kernels("gfx942", [rules.ATTN_FWD])[:5] + rules.enumerate_kernels("sm_90")[:50]:
            self.assertIn(f"-{rules.config_tag(s.config)}-{s.variant}", s.id)


if __name__ == "__main__":
    unittest.main()
