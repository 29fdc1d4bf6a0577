"""GPU check of the Gluon forward (``attn_fwd_gluon``) on sm_90: correctness, ConSan, speed.

Launches the kernel through Triton's JIT with host TMA descriptors (rank 4, strides from
the tensor, blocks as ``ABI.md`` says) and compares against a float64 reference:

* O: max |O - O_ref| <= 3 * max |O_naive - O_ref| + 1e-3, where O_naive is the same
  math in the input dtype through torch (fp32 scores and softmax, P cast to the dtype,
  P V in the dtype with fp32 accumulation);
* LSE: +inf exactly on the rows that see no key, elsewhere |LSE - LSE_ref| <= 1e-3;
* outputs are poisoned with NaN first, so a row or a column the kernel fails to write fails.

usage: python test/gluon/check_fwd.py [--variant NAME] [--consan] [--bench] [--filter SUBSTR]
  (default)  the correctness cases, one line each, then ``check_fwd: N passed, M failed``
  --variant  run everything with a named configuration of ``fwd_variants.py`` (default: ``base``,
             the original configuration); cases whose head-dim bucket the variant does not cover
             are skipped and counted; a case's ``stages`` override applies when it fits
  --consan   re-runs a few shapes under Gluon's concurrency sanitizer (one subprocess per
             shape: a ConSan report is a device-side assert, which poisons the CUDA context)
  --bench    bf16 hd64/hd128, S 1k-16k (B*S = 16k, H*D = 2048), causal and not, vs cuDNN SDPA

The JIT entry point is the kernel's own function re-wrapped with ``do_not_specialize`` on
every scalar and pointer argument: the AOT images are compiled without integer or alignment
specialization (``ABI.md``), so the checked code is the shipped code, and varying sequence
lengths do not multiply the JIT variants.
"""
import argparse
import json
import math
import os
import sys
import time
import zlib
from dataclasses import asdict, dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

from kernels.flash_gluon import fwd as gluon_fwd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import consan as consan_runner  # noqa: E402
import fwd_variants  # noqa: E402

SCALAR_ARGS = ["LSE", "stride_lz", "stride_lh", "sm_scale", "STORE_LSE", "N_CTX_Q", "N_CTX_K", "GQA_GROUP",
               "WINDOW_LEFT", "WINDOW_RIGHT", "ALIGN_BOTTOM_RIGHT", "IS_VARLEN", "CU_SEQLENS_Q", "CU_SEQLENS_K",
               "N_TOKENS_Q", "N_TOKENS_K", "VARLEN_STATUS", "STORE_VARLEN_STATUS", "DROPOUT_THRESHOLD", "dropout_scale",
               "philox_offset_base", "STORE_PHILOX"]
#: The packing group of a fixed-length launch (check_fwd_varlen.py launches packed batches).
NOT_PACKED = (0, None, None, 0, 0, None, 0)
#: The dropout group of a launch without dropout (DROPOUT_THRESHOLD .. STORE_PHILOX).
NO_DROPOUT = (0, 1.0, None, None, 0, None, None, 0)
KERNEL = gluon.jit(do_not_specialize=SCALAR_ARGS)(gluon_fwd.attn_fwd_gluon.fn)

# The configuration the checks run with: a name in fwd_variants.VARIANTS (--variant).
VARIANT = "product"  # the configs python/rules.py ships
TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
GL_DTYPES = {"fp16": gl.float16, "bf16": gl.bfloat16}
UNBOUNDED = 2**30


# ----------------------------------------------------------------------------
# Masks: the runtime window of kernels/flash/mask.py
# ----------------------------------------------------------------------------
def window(mask, sq, sk):
    """``(WINDOW_LEFT, WINDOW_RIGHT, ALIGN_BOTTOM_RIGHT)`` of a mask name.

    ``none``, ``causal`` (top-left), ``causal_br``, ``winL_R`` / ``winL_R_br`` (sliding window).
    """
    if mask == "none":
        return sq + sk, sq + sk, 0
    if mask in ("causal", "causal_br"):
        return UNBOUNDED, 0, int(mask.endswith("_br"))
    assert mask.startswith("win"), mask
    parts = mask[3:].split("_")
    return int(parts[0]), int(parts[1]), int(len(parts) == 3 and parts[2] == "br")


def visible_mask(sq, sk, wl, wr, align, device):
    """Bool ``[sq, sk]``: query i sees key j iff ``i + off - wl <= j <= i + off + wr`` (j < sk implied)."""
    off = sk - sq if align else 0
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    return (j >= i + off - wl) & (j <= i + off + wr)


# ----------------------------------------------------------------------------
# Launch
# ----------------------------------------------------------------------------
def head_dim_bucket(d):
    assert d % 8 == 0 and d <= 256, d
    return 64 if d <= 64 else (128 if d <= 128 else 256)


def descriptor(t, rows, head_dim, dtype):
    block = [1, 1, rows, head_dim]
    return TensorDescriptor.from_tensor(t, block, gl.NVMMASharedLayout.get_default_for(block, GL_DTYPES[dtype]))


class NotApplicable(Exception):
    """The variant has no configuration for this head-dim bucket."""


def variant_config(head_dim, stages=None, variant=None):
    """The launch config of ``variant`` (default: the module's VARIANT) for a head-dim bucket;
    ``stages`` overrides STAGES when the ring still fits shared memory."""
    c = fwd_variants.config(variant or VARIANT, head_dim)
    if c is None:
        raise NotApplicable(f"variant {variant or VARIANT} has no hd{head_dim} config")
    if stages and stages != c["STAGES"]:
        c2 = dict(c, STAGES=stages)
        if fwd_variants.smem_bytes(head_dim, c2) + 1024 <= fwd_variants.SMEM_LIMIT:
            c = c2
    return c


_NUM_SMS = {}


def num_sms(device):
    """Streaming multiprocessors of ``device`` (the persistent grid: ``fwd_variants.grid``)."""
    idx = torch.device(device).index
    idx = torch.cuda.current_device() if idx is None else idx
    if idx not in _NUM_SMS:
        _NUM_SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _NUM_SMS[idx]


def prepare(q, k, v, o, lse, dtype, sm_scale, wl, wr, align, store_lse=True, stages=None, variant=None, config=None,
            pers_grid=0):
    """Descriptors and arguments of one launch; returns a zero-argument launcher.  ``pers_grid``
    (persistent configs only, > 0): cap the grid at that many CTAs, so each walks many tiles."""
    B, Hq, Sq, D = q.shape
    Hk, Sk = k.shape[1], k.shape[2]
    head_dim = head_dim_bucket(D)
    c = config or variant_config(head_dim, stages, variant)
    block_n = c["BLOCK_N"]
    dq, dk = descriptor(q, 64, head_dim, dtype), descriptor(k, block_n, head_dim, dtype)
    dv, do = descriptor(v, block_n, head_dim, dtype), descriptor(o, 64, head_dim, dtype)
    grid = fwd_variants.grid(c, Sq, Hq, B, num_sms(q.device))
    if c["PERSISTENT"] and pers_grid > 0:
        grid = (min(grid[0], pers_grid), 1, 1)
    cx = fwd_variants.constexprs(c)

    def launch():
        KERNEL[grid](dq, dk, dv, do, lse, lse.stride(0), lse.stride(1), sm_scale, int(store_lse), Sq, Sk, Hq // Hk,
                     wl, wr, align, *NOT_PACKED, *NO_DROPOUT, HEAD_DIM=head_dim, **cx, num_warps=c["num_warps"], maxnreg=c["maxnreg"])

    return launch


# ----------------------------------------------------------------------------
# References
# ----------------------------------------------------------------------------
def expand_kv(t, group):
    return t.repeat_interleave(group, dim=1) if group > 1 else t


def reference_f64(q, k, v, sm_scale, visible):
    """(O, LSE) in float64; rows that see no key: O = 0, LSE = +inf."""
    group = q.shape[1] // k.shape[1]
    q, k, v = q.double(), expand_kv(k, group).double(), expand_kv(v, group).double()
    s = (q @ k.transpose(-1, -2)) * sm_scale
    s = s.masked_fill(~visible, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    has_key = torch.isfinite(m)
    m = torch.where(has_key, m, torch.zeros_like(m))
    p = torch.exp(s - m)
    l = p.sum(dim=-1, keepdim=True)
    o = (p @ v) / torch.where(has_key, l, torch.ones_like(l))
    lse = torch.where(has_key, torch.log(l) + m, torch.full_like(m, float("inf")))
    return o, lse.squeeze(-1)


def reference_naive(q, k, v, sm_scale, visible):
    """The same math in the input dtype: fp32 scores and softmax, P cast to the dtype for P V."""
    group = q.shape[1] // k.shape[1]
    k, v = expand_kv(k, group), expand_kv(v, group)
    s = (q.float() @ k.float().transpose(-1, -2)) * sm_scale
    s = s.masked_fill(~visible, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows with no key: all -inf -> NaN -> 0
    return p.to(q.dtype) @ v


# ----------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------
@dataclass
class Case:
    dtype: str
    d: int
    sq: int
    sk: int
    mask: str = "none"
    hq: int = 2
    hk: int = 2
    b: int = 2
    layout: str = "bhsd"  # "bshd": [B, S, H, D] tensors viewed as [B, H, S, D]
    store_lse: bool = True
    stages: int = 0  # 0: the variant's STAGES
    variant: str = ""  # "": the module's VARIANT (--variant)
    pers_grid: int = 0  # persistent configs: > 0 caps the grid (every CTA walks many tiles)

    def name(self):
        extra = "" if self.layout == "bhsd" else f" {self.layout}"
        extra += "" if self.store_lse else " no-lse"
        extra += f" stages{self.stages}" if self.stages else ""
        extra += f" grid{self.pers_grid}" if self.pers_grid else ""
        return (f"{self.dtype} d{self.d} b{self.b} hq{self.hq} hk{self.hk} sq{self.sq} sk{self.sk} "
                f"{self.mask}{extra}")


def correctness_cases():
    cases = []
    # Every head dim (buckets and padded), both dtypes, unmasked and causal (ragged, Sq != Sk).
    for dtype in ("fp16", "bf16"):
        for d in (64, 128, 256, 40, 72, 96, 192):
            cases.append(Case(dtype, d, 1000, 1000, "none"))
            cases.append(Case(dtype, d, 129, 1000, "causal_br"))
    # Sequence lengths: the tails around the 128-row CTA and the 64/128-key blocks, Sq != Sk both ways.
    pairs = [(s, s) for s in (1, 17, 127, 128, 129, 1000, 2048)]
    pairs += [(191, 191), (192, 192), (193, 193), (385, 1000)]  # the 192-row CTA of NUM_CONSUMERS=3
    pairs += [(1, 2048), (2048, 1), (17, 129), (129, 17), (127, 1000), (1000, 127), (128, 2048), (2048, 128),
              (1000, 2048), (2048, 1000)]
    for sq, sk in pairs:
        b = 1 if max(sq, sk) > 1000 else 2
        cases.append(Case("bf16", 128, sq, sk, "none", b=b))
        cases.append(Case("fp16", 64, sq, sk, "causal_br", b=b))
        cases.append(Case("bf16", 256, sq, sk, "causal", b=b))
    # Masks in both alignments, incl. Sq > Sk bottom-right (leading rows see no key) and windows
    # whose rows see no key at all (win0_0 with Sq > Sk top-left: rows >= Sk).
    masks = ["causal", "causal_br", "win16_0", "win16_0_br", "win64_32", "win64_32_br", "win0_0", "win0_0_br",
             "win300_0", "win0_200_br"]
    for i, mask in enumerate(masks):
        for j, (sq, sk) in enumerate(((1000, 1000), (1000, 129), (129, 1000))):
            dtype, d = (("bf16", 128), ("fp16", 256), ("fp16", 72))[(i + j) % 3]
            cases.append(Case(dtype, d, sq, sk, mask))
    # GQA and MQA.
    for hq, hk, mask, dtype, d in ((8, 2, "none", "bf16", 128), (8, 2, "causal_br", "fp16", 64),
                                   (8, 2, "win64_32", "bf16", 256), (8, 1, "none", "fp16", 128),
                                   (8, 1, "causal", "bf16", 64), (8, 1, "win16_0_br", "bf16", 96),
                                   (4, 4, "causal", "fp16", 192)):
        cases.append(Case(dtype, d, 1000, 777, mask, hq=hq, hk=hk))
    # Non-contiguous [B, S, H, D] views, LSE off, 3-stage rings.
    cases.append(Case("fp16", 128, 1000, 1000, "none", layout="bshd", hq=4, hk=4))
    cases.append(Case("bf16", 64, 777, 1000, "causal_br", layout="bshd", hq=4, hk=2))
    cases.append(Case("bf16", 96, 129, 300, "win64_32", layout="bshd", hq=8, hk=1))
    cases.append(Case("bf16", 256, 300, 300, "causal", layout="bshd"))
    cases.append(Case("bf16", 128, 1000, 1000, "causal", store_lse=False))
    for d in (64, 128):
        cases.append(Case("bf16", d, 2048, 2048, "none", b=1, stages=3))
        cases.append(Case("fp16", d, 1000, 2048, "causal_br", b=1, stages=3))
        cases.append(Case("bf16", d, 129, 1000, "win64_32", stages=3))
    unique = {c.name(): c for c in cases}  # the groups overlap in a few shapes
    return list(unique.values())


def consan_cases():
    """Few shapes, few compile variants (ConSan compiles are slow): one per head dim,
    causal and not, ragged tails, GQA, CTAs with no key block."""
    return [
        Case("bf16", 64, 300, 300, "none", b=1),
        Case("bf16", 64, 300, 129, "causal_br", b=1, hq=4, hk=1),  # leading CTAs see no key
        Case("fp16", 128, 257, 384, "causal", b=1, hq=4, hk=2),
        Case("fp16", 128, 129, 1000, "win64_32_br", b=1),
        Case("bf16", 256, 200, 200, "causal", b=1),
        Case("bf16", 256, 17, 333, "none", b=1, hq=2, hk=1),
    ]


def make_inputs(case, device="cuda"):
    dt = TORCH_DTYPES[case.dtype]
    gen = torch.Generator(device=device).manual_seed(zlib.crc32(case.name().encode()))

    def tensor(h, s, fill=None):
        if case.layout == "bshd":
            shape, perm = (case.b, s, h, case.d), (0, 2, 1, 3)
        else:
            shape, perm = (case.b, h, s, case.d), (0, 1, 2, 3)
        if fill is None:
            t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dt)
        else:
            t = torch.full(shape, fill, device=device, dtype=dt)
        return t.permute(perm)

    q, k, v = tensor(case.hq, case.sq), tensor(case.hk, case.sk), tensor(case.hk, case.sk)
    o = tensor(case.hq, case.sq, fill=float("nan"))
    lse = torch.full((case.b, case.hq, case.sq), float("nan"), device=device, dtype=torch.float32)
    return q, k, v, o, lse


def max_abs(x):
    return x.abs().max().item() if x.numel() else 0.0


def run_case(case):
    """Returns ``(ok, line)``; raises ``NotApplicable`` when the variant lacks the head dim."""
    variant_config(head_dim_bucket(case.d), case.stages, case.variant or None)  # NotApplicable before any work
    q, k, v, o, lse = make_inputs(case)
    sm_scale = 1.0 / math.sqrt(case.d)
    wl, wr, align = window(case.mask, case.sq, case.sk)
    prepare(q, k, v, o, lse, case.dtype, sm_scale, wl, wr, align, case.store_lse, case.stages, case.variant or None,
            pers_grid=case.pers_grid)()
    torch.cuda.synchronize()

    visible = visible_mask(case.sq, case.sk, wl, wr, align, q.device)
    o_ref, lse_ref = reference_f64(q, k, v, sm_scale, visible)
    o_naive = reference_naive(q, k, v, sm_scale, visible)
    naive_err = max_abs(o_naive.double() - o_ref)
    bound = 3 * naive_err + 1e-3
    o_nan = torch.isnan(o).any().item()
    o_err = float("nan") if o_nan else max_abs(o.double() - o_ref)
    ok = (not o_nan) and o_err <= bound

    lse_note = ""
    if case.store_lse:
        inf_ref = torch.isinf(lse_ref)
        inf_ok = torch.equal(torch.isposinf(lse), inf_ref)
        finite = ~inf_ref
        lse_nan = torch.isnan(lse).any().item()
        lse_err = float("nan") if lse_nan else max_abs(lse.double()[finite] - lse_ref[finite])
        ok = ok and inf_ok and (not lse_nan) and lse_err <= 1e-3
        lse_note = (f"lse_err {lse_err:.2e} inf_rows {int(inf_ref.sum().item())}"
                    f"{'' if inf_ok else ' INF-MISMATCH'}")
    else:
        untouched = torch.isnan(lse).all().item()
        ok = ok and untouched
        lse_note = "lse untouched" if untouched else "LSE WRITTEN WITH STORE_LSE=0"
    line = (f"{'PASS' if ok else 'FAIL'} {case.name()}: o_err {o_err:.2e} (bound {bound:.2e}, naive {naive_err:.2e})"
            f"{' NaN-in-O' if o_nan else ''} {lse_note}")
    return ok, line


# ----------------------------------------------------------------------------
# Modes
# ----------------------------------------------------------------------------
def is_persistent(variant):
    return any(c is not None and c["PERSISTENT"] for c in fwd_variants.VARIANTS[variant].values())


def with_small_grids(cases, grids=(1, 3)):
    """Persistent variants: every case also with the grid capped at a few CTAs (a CTA then walks
    many tiles: Q buffer reuse, the K/V ring across tiles, causal pairs, empty tiles)."""
    import dataclasses
    return cases + [dataclasses.replace(c, pers_grid=g) for g in grids for c in cases]


def check(filter_):
    cases = correctness_cases()
    if is_persistent(VARIANT):
        cases = with_small_grids(cases)
    cases = [c for c in cases if not filter_ or filter_ in c.name()]
    passed = failed = skipped = 0
    t0 = time.time()
    print(f"variant {VARIANT}: " + "; ".join(f"hd{hd} {fwd_variants.describe(fwd_variants.config(VARIANT, hd))}"
                                            for hd in fwd_variants.HEAD_DIMS), flush=True)
    for case in cases:
        try:
            ok, line = run_case(case)
        except NotApplicable as e:
            skipped += 1
            print(f"SKIP {case.name()}: {e}", flush=True)
            continue
        except Exception as e:  # noqa: BLE001 -- report and go on with the next case
            ok, line = False, f"FAIL {case.name()}: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[-1][:500]}"
        passed += ok
        failed += not ok
        print(line, flush=True)
    print(f"check_fwd [{VARIANT}]: {passed} passed, {failed} failed, {skipped} skipped (head dim not covered) "
          f"({time.time() - t0:.1f} s)")
    return failed == 0


def consan_child(case_json):
    """Runs in a subprocess with TRITON_INSTRUMENTATION_MODE=consan set before Triton's import."""
    consan_runner.child_setup()
    ok, line = run_case(Case(**json.loads(case_json)))
    print(line, flush=True)
    return ok


def consan(filter_):
    cases = [c for c in consan_cases() if not filter_ or filter_ in c.name()]
    for c in cases:
        c.variant = VARIANT
    if is_persistent(VARIANT):
        cases = with_small_grids(cases, grids=(2,))
    cases = [c for c in cases if fwd_variants.config(VARIANT, head_dim_bucket(c.d)) is not None]
    return consan_runner.run_children(__file__, [json.dumps(asdict(c)) for c in cases], [c.name() for c in cases],
                                      "check_fwd --consan")


def bench():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    print(f"{'case':<34} {'gluon TF/s':>10} {'cuDNN TF/s':>10} {'ratio':>6}")
    for d in (64, 128):
        h = 2048 // d
        for s in (1024, 2048, 4096, 8192, 16384):
            b = 16384 // s
            for causal in (False, True):
                q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                o = torch.empty_like(q)
                lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
                wl, wr, align = window("causal" if causal else "none", s, s)
                try:
                    launch = prepare(q, k, v, o, lse, "bf16", d**-0.5, wl, wr, align)
                except NotApplicable:
                    continue
                t_gluon = triton.testing.do_bench(launch, warmup=25, rep=100)

                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    t_cudnn = triton.testing.do_bench(
                        lambda: scaled_dot_product_attention(q, k, v, is_causal=causal), warmup=25, rep=100)
                flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
                tf_gluon, tf_cudnn = flops / t_gluon * 1e-9, flops / t_cudnn * 1e-9
                name = f"bf16 d{d} b{b} h{h} s{s}{' causal' if causal else ''}"
                print(f"{name:<34} {tf_gluon:>10.1f} {tf_cudnn:>10.1f} {tf_gluon / tf_cudnn:>6.2f}", flush=True)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--consan", action="store_true", help="run a few shapes under the concurrency sanitizer")
    ap.add_argument("--bench", action="store_true", help="time against cuDNN SDPA")
    ap.add_argument("--filter", default="", help="only cases whose name contains this")
    ap.add_argument("--variant", default="product", choices=sorted(fwd_variants.VARIANTS),
                    help="configuration from fwd_variants.py (default: base)")
    ap.add_argument("--consan-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    global VARIANT
    VARIANT = args.variant
    if args.consan_child is not None:
        return 0 if consan_child(args.consan_child) else 1
    ok = True
    if args.consan:
        ok = consan(args.filter) and ok
    if args.bench:
        ok = bench() and ok
    if not (args.consan or args.bench):
        ok = check(args.filter)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
