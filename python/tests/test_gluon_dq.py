"""``attn_bwd_gluon_dq`` compiles for sm_90 within its budgets (CPU only: ``triton.compile``, no GPU).

The Gluon dQ kernel (``kernels/flash_gluon/bwd_dq.py``) is in the archive at hd256 only
(``rules.GLUON_DQ_SHIPPED_HEAD_DIMS``); this test keeps it compiling at every bucket the GPU checks
run, with the rules' own signature and configs (``rules.GLUON_DQ_CONFIGS``): every head-dim bucket, and
the dropout and packed (ragged descriptor) functionals at one head dim each.  Each kernel must fit
sm_90's shared memory and spill nothing (``cuobjdump -res-usage``: no stack, no local memory):
its consumers hold a ``[64, HEAD_DIM]`` fp32 accumulator, and a spill there costs more than the
kernel saves over the portable one.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import _paths

#: (head_dim, dropout, varlen) of the kernels compiled here.
FUNCTIONALS = [(64, False, False), (128, False, False), (256, False, False), (256, True, False),
               (128, False, True)]

#: Compiles FUNCTIONALS and prints one JSON line per kernel.  In a child process: the interpreter
#: tests (test_interpreter*.py) set TRITON_INTERPRET when unittest imports them, which turns the
#: kernels' helpers into interpreted functions for the rest of the process.
_CHILD = """
import json, os, re, subprocess, sys, tempfile
sys.path.insert(0, {python_dir!r})
import compile as driver, rules, triton
cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
family = rules.ATTN_BWD_GLUON_DQ
for hd, dropout, varlen in {functionals!r}:
    functional = {{"dtype": "bf16", "head_dim": hd}}
    if varlen:
        functional["varlen"] = True
    if dropout:
        functional["dropout"] = True
    (config, ) = family.configs("sm_90", functional)
    spec = rules._spec(family, "sm_90", functional, config, "aligned")
    cubin, metadata = driver.compile_spec(spec)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    m = re.search(r"STACK:(\\d+) SHARED:\\d+ LOCAL:(\\d+)", usage)
    print(json.dumps({{"id": spec.id, "problem": driver.check_kernel(spec, metadata),
                      "spills": [int(m[1]), int(m[2])] if m else None}}), flush=True)
"""


class GluonDqCompileTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cache = tempfile.mkdtemp(prefix="aotriton-test-gluon-dq-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.cache, ignore_errors=True)

    def test_compiles_without_spills(self):
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["TRITON_CACHE_DIR"] = self.cache
        code = _CHILD.format(python_dir=_paths.PYTHON_DIR, functionals=FUNCTIONALS)
        run = subprocess.run([sys.executable, "-B", "-c", code], capture_output=True, text=True, env=env)
        self.assertEqual(run.returncode, 0, run.stderr[-3000:])
        kernels = [json.loads(line) for line in run.stdout.splitlines()]
        self.assertEqual(len(kernels), len(FUNCTIONALS))
        for k in kernels:
            with self.subTest(kernel=k["id"]):
                self.assertIsNone(k["problem"])
                self.assertEqual(k["spills"], [0, 0],
                                 f"{k['id']} spills (stack, local bytes): see rules.GLUON_DQ_CONFIGS")


if __name__ == "__main__":
    unittest.main()
