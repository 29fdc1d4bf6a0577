"""GPU check and benchmark of the fp8 Gluon forward (``attn_fwd_gluon_fp8``) on sm_90.

Launches the kernel through Triton's JIT (scalars not specialised, as the AOT images) with
host TMA descriptors over fp8 Q, K, Vᵀ and a bf16 O, and checks against float64:

* inputs: random bf16 tensors quantised to e4m3 with a descale per (batch, KV head)
  (``amax / 448``, FA3's ``[B, Hk]`` factors, different per head so a wrong index shows);
* reference: float64 attention of the *dequantised* fp8 inputs;
* naive: the same fp8 computation in torch -- the scores on the tensor cores (``_scaled_mm``,
  whose fp8 accumulation is as coarse as the kernel's), ``p = exp(s - rowmax)`` cast to e4m3,
  ``P V`` in fp32, divided by the fp32 row sum, times ``dv``;
* O: max |O - O_ref| <= 3 * max |O_naive - O_ref| + 2e-2 * max |O_ref| (bf16 output rounding);
  LSE: +inf exactly on rows that see no key, elsewhere <= 3 * the naive LSE's error + 1e-3;
* outputs poisoned with NaN first.

usage: python test/gluon/check_fwd_fp8.py [--bench] [--config HD:BLOCK_N:STAGES:OVERLAP ...]
"""
import argparse
import math
import os
import sys
import zlib

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_fwd as cf  # noqa: E402  (sets up sys.path for kernels/)

from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

from kernels.flash_gluon import fwd_fp8, fwd_fp8_vt  # noqa: E402

SCALARS = cf.SCALAR_ARGS + ["DESCALE_Q", "stride_dsqz", "stride_dsqh", "DESCALE_K", "stride_dskz", "stride_dskh",
                            "DESCALE_V", "stride_dsvz", "stride_dsvh"]
KERNEL = gluon.jit(do_not_specialize=SCALARS)(fwd_fp8.attn_fwd_gluon_fp8.fn)
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
# (BLOCK_N, STAGES, OVERLAP[, PINGPONG[, NUM_CONSUMERS]]) per head-dim bucket; --config overrides.
CONFIGS = {64: (128, 2, 0), 128: (128, 2, 0), 256: (64, 2, 0)}


def desc(t, block, dtype):
    return TensorDescriptor.from_tensor(t, block, gl.NVMMASharedLayout.get_default_for(block, dtype))


def transpose_v(v8):
    """Vᵀ ``[B, Hk, D, KEYS_PAD]`` in the forward's key order (``fwd_fp8_vt.py``), keys padded to 32."""
    b, h, s, d = v8.shape
    keys_pad = (s + 31) // 32 * 32
    vt = torch.empty(b, h, d, keys_pad, device=v8.device, dtype=FP8)
    block_s = 64
    fwd_fp8_vt.transpose_v_fp8[(triton.cdiv(keys_pad, block_s), h, b)](
        v8, v8.stride(0), v8.stride(1), v8.stride(2), vt, vt.stride(0), vt.stride(1), vt.stride(2), s, keys_pad, d,
        HEAD_DIM=cf.head_dim_bucket(d), BLOCK_N=block_s)
    return vt


def transpose_v_reference(v8):
    """What ``transpose_v`` must write, by indexing: column k of each 32-key group holds key
    ``(k & 17) | (k & 2) << 2 | (k & 12) >> 1``; pad keys are zero."""
    b, h, s, d = v8.shape
    keys_pad = (s + 31) // 32 * 32
    k = torch.arange(keys_pad, device=v8.device)
    key = (k & ~31) | (k & 17) | ((k & 2) << 2) | ((k & 12) >> 1)
    vpad = torch.cat([v8.float(), torch.zeros(b, h, keys_pad - s, d, device=v8.device)], dim=2)
    return vpad[:, :, key, :].transpose(-1, -2)


def prepare(q8, k8, vt8, o, lse, descales, sm_scale, wl, wr, align, config=None):
    B, Hq, Sq, D = q8.shape
    Hk, Sk = k8.shape[1], k8.shape[2]
    hd = cf.head_dim_bucket(D)
    block_n, stages, overlap, *rest = config or CONFIGS[hd]
    pingpong, consumers = (list(rest) + [0, 2][len(rest):])[:2]
    dq_, dk_, dv_ = descales
    args = (desc(q8, [1, 1, 64, hd], gl.float8e4nv), desc(k8, [1, 1, block_n, hd], gl.float8e4nv),
            desc(vt8, [1, 1, hd, block_n], gl.float8e4nv), desc(o, [1, 1, 64, hd], gl.bfloat16),
            lse, lse.stride(0), lse.stride(1), sm_scale, 1, Sq, Sk, Hq // Hk, wl, wr, align,
            dq_, dq_.stride(0), dq_.stride(1), dk_, dk_.stride(0), dk_.stride(1), dv_, dv_.stride(0), dv_.stride(1))
    grid = (triton.cdiv(Sq, 64 * consumers), Hq, B)

    def launch():
        KERNEL[grid](*args, HEAD_DIM=hd, BLOCK_M=64 * consumers, BLOCK_N=block_n, STAGES=stages, OVERLAP=overlap,
                     PINGPONG=pingpong, NUM_CONSUMERS=consumers, CONSUMER_REGS=240 if consumers == 2 else 160,
                     num_warps=4, maxnreg=168 if consumers == 2 else 128)

    return launch


def quantize(x, hk):
    """``(x8, descale)``: e4m3 values and fp32 ``[B, Hk]`` factors (Q: the query heads of a group share one)."""
    b, h = x.shape[:2]
    g = h // hk
    amax = x.float().abs().reshape(b, hk, -1).amax(dim=-1).clamp(min=1e-6)
    descale = (amax / FP8_MAX).contiguous()
    scale = descale.repeat_interleave(g, dim=1)[:, :, None, None]
    return (x.float() / scale).to(FP8), descale


def dequantize(x8, descale):
    g = x8.shape[1] // descale.shape[1]
    return x8.double() * descale.double().repeat_interleave(g, dim=1)[:, :, None, None]


def scores_tensor_cores(q8, k8):
    """``Q Kᵀ`` of the e4m3 inputs on the tensor cores, fp32 ``[B, Hq, Sq, Sk]``: ``torch._scaled_mm``
    with fast accumulation, which like the kernel's wgmma chain keeps the tensor cores' own
    (reduced-precision) fp32 accumulation over the head dim -- the error a plain fp32 product
    would not show."""
    b, hq, sq, d = q8.shape
    hk, sk = k8.shape[1], k8.shape[2]
    g = hq // hk
    pad = lambda n: (n + 15) // 16 * 16  # noqa: E731  (cuBLASLt fp8: dims multiple of 16)
    one = torch.ones((), device=q8.device, dtype=torch.float32)
    a = torch.zeros(pad(sq), d, device=q8.device, dtype=FP8)
    bt = torch.zeros(pad(sk), d, device=q8.device, dtype=FP8)
    out = torch.empty(b, hq, sq, sk, device=q8.device, dtype=torch.float32)
    for z in range(b):
        for h in range(hq):
            a[:sq] = q8[z, h]
            bt[:sk] = k8[z, h // g]
            s = torch._scaled_mm(a, bt.t(), scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=True)
            out[z, h] = s[:sq, :sk]
    return out


def reference_naive_fp8(q8, k8, v8, dq_, dk_, dv_, sm_scale, visible):
    """``(O, LSE)`` of the fp8 computation in torch: tensor-core scores, fp32 softmax with
    ``p = exp(s - rowmax)`` cast to e4m3 for ``P V`` (fp32), the fp32 row sum, ``dv``."""
    g = q8.shape[1] // k8.shape[1]
    v = cf.expand_kv(v8, g).float()
    scale = (dq_ * dk_).repeat_interleave(g, dim=1)[:, :, None, None] * sm_scale
    s = scores_tensor_cores(q8, k8) * scale
    s = s.masked_fill(~visible, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    has_key = torch.isfinite(m)
    m = torch.where(has_key, m, torch.zeros_like(m))
    p = torch.exp(s - m)
    l = p.sum(dim=-1, keepdim=True)
    o = (p.to(FP8).float() @ v) / torch.where(l > 0, l, torch.ones_like(l))
    lse = torch.where(has_key, torch.log(l) + m, torch.full_like(m, float("inf"))).squeeze(-1)
    return o * dv_.repeat_interleave(g, dim=1)[:, :, None, None], lse


def run_case(dtype_src, d, sq, sk, mask, hq=2, hk=2, b=2, config=None):
    name = f"fp8 d{d} b{b} hq{hq} hk{hk} sq{sq} sk{sk} {mask}" + (f" cfg{config}" if config else "")
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(name.encode()))
    # Heads of different magnitude, so each descale differs.
    mag = lambda h: torch.linspace(0.5, 3.0, h, device="cuda")[None, :, None, None]  # noqa: E731
    q = torch.randn(b, hq, sq, d, generator=gen, device="cuda") * mag(hq)
    k = torch.randn(b, hk, sk, d, generator=gen, device="cuda") * mag(hk)
    v = torch.randn(b, hk, sk, d, generator=gen, device="cuda") * mag(hk).flip(1)
    q8, dq_ = quantize(q, hk)
    k8, dk_ = quantize(k, hk)
    v8, dv_ = quantize(v, hk)
    vt8 = transpose_v(v8)
    o = torch.full((b, hq, sq, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((b, hq, sq), float("nan"), device="cuda", dtype=torch.float32)
    sm_scale = 1.0 / math.sqrt(d)
    wl, wr, align = cf.window(mask, sq, sk)
    prepare(q8, k8, vt8, o, lse, (dq_, dk_, dv_), sm_scale, wl, wr, align, config)()
    torch.cuda.synchronize()
    visible = cf.visible_mask(sq, sk, wl, wr, align, "cuda")
    o_ref, lse_ref = cf.reference_f64(dequantize(q8, dq_), dequantize(k8, dk_), dequantize(v8, dv_), sm_scale,
                                      visible)
    o_naive, lse_naive = reference_naive_fp8(q8, k8, v8, dq_, dk_, dv_, sm_scale, visible)
    err = cf.max_abs(o.double() - o_ref)
    err_naive = cf.max_abs(o_naive.double() - o_ref)
    bound = 3 * err_naive + 2e-2 * max(1.0, cf.max_abs(o_ref))
    no_key = torch.isinf(lse_ref)
    lse_err = cf.max_abs((lse.double() - lse_ref)[~no_key])
    lse_err_naive = cf.max_abs((lse_naive.double() - lse_ref)[~no_key])
    lse_bound = 3 * lse_err_naive + 1e-3
    lse_ok = bool(torch.equal(torch.isinf(lse) & (lse > 0), no_key)) and lse_err <= lse_bound
    vt_ok = torch.equal(vt8.float(), transpose_v_reference(v8))  # the transpose kernel, bit for bit
    ok = err <= bound and lse_ok and vt_ok and not torch.isnan(o).any().item()
    print(f"{'PASS' if ok else 'FAIL'} {name}: O {err:.3e} (naive {err_naive:.3e}, bound {bound:.3e}) "
          f"LSE {lse_err:.2e} (naive {lse_err_naive:.2e}, bound {lse_bound:.2e})", flush=True)
    return ok


def check(configs):
    cases = []
    for d in (64, 128, 256, 96, 192):
        cases.append((d, 1000, 1000, "none", 2, 2, 2))
        cases.append((d, 129, 1000, "causal_br", 2, 2, 2))
    for sq, sk in ((1, 1), (17, 129), (129, 17), (127, 1000), (1000, 127), (2048, 2048)):
        cases.append((128, sq, sk, "none", 2, 2, 1))
        cases.append((128, sq, sk, "causal", 2, 2, 1))
    for mask in ("win64_32", "win16_0_br", "win0_0"):
        cases.append((128, 1000, 777, mask, 2, 2, 2))
    cases.append((128, 1000, 777, "none", 8, 2, 2))
    cases.append((256, 1000, 777, "causal_br", 8, 1, 1))
    cases.append((64, 777, 1000, "win64_32_br", 4, 2, 2))
    passed = failed = 0
    for d, sq, sk, mask, hq, hk, b in cases:
        cfgs = [c for c in configs if c[0] == cf.head_dim_bucket(d)] or [None]
        for c in cfgs:
            ok = run_case("bf16", d, sq, sk, mask, hq, hk, b, None if c is None else c[1:])
            passed += ok
            failed += not ok
    print(f"check_fwd_fp8: {passed} passed, {failed} failed")
    return failed == 0


def bench(configs, head_dims=(128, 256)):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    print(f"{'case':<40} {'cfg':<12} {'fp8 TF/s':>9} {'Vt us':>7} {'cuDNN bf16':>10} {'cuDNN fp8':>10}")
    for d in head_dims:
        h = 2048 // d
        for s in (4096, 8192, 16384):
            b = 16384 // s
            for causal in (False, True):
                q = torch.randn(b, h, s, d, device="cuda")
                k = torch.randn(b, h, s, d, device="cuda")
                v = torch.randn(b, h, s, d, device="cuda")
                q8, dq_ = quantize(q, h)
                k8, dk_ = quantize(k, h)
                v8, dv_ = quantize(v, h)
                vt8 = transpose_v(v8)
                o = torch.empty(b, h, s, d, device="cuda", dtype=torch.bfloat16)
                lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
                wl, wr, align = cf.window("causal" if causal else "none", s, s)
                flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
                t_vt = triton.testing.do_bench(lambda: transpose_v(v8), warmup=10, rep=50)
                qb, kb, vb = (x.to(torch.bfloat16) for x in (q, k, v))
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    t_cudnn = triton.testing.do_bench(
                        lambda: scaled_dot_product_attention(qb, kb, vb, is_causal=causal), warmup=10, rep=50)
                    try:
                        t_c8 = triton.testing.do_bench(
                            lambda: scaled_dot_product_attention(q8, k8, v8, is_causal=causal), warmup=10, rep=50)
                        c8 = f"{flops / t_c8 * 1e-9:>10.1f}"
                    except Exception as e:  # noqa: BLE001
                        c8 = f"{'n/a':>10}"
                        if d == 128 and s == 4096 and not causal:
                            print(f"  cuDNN fp8 SDPA through torch: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                name = f"d{d} b{b} h{h} s{s}{' causal' if causal else ''}"
                cfgs = [c[1:] for c in configs if c[0] == d] or [CONFIGS[d]]
                for c in cfgs:
                    launch = prepare(q8, k8, vt8, o, lse, (dq_, dk_, dv_), d**-0.5, wl, wr, align, c)
                    t = triton.testing.do_bench(launch, warmup=25, rep=100)
                    print(f"{name:<40} {str(c):<12} {flops / t * 1e-9:>9.1f} {t_vt * 1e3:>7.1f} "
                          f"{flops / t_cudnn * 1e-9:>10.1f} {c8}", flush=True)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--bench-head-dims", default="128,256", help="head dims the benchmark runs (comma-separated)")
    ap.add_argument("--config", action="append", default=[], help="HD:BLOCK_N:STAGES:OVERLAP[:PINGPONG[:NUM_CONSUMERS]]")
    args = ap.parse_args()
    configs = [tuple(int(x) for x in c.split(":")) for c in args.config]
    ok = True
    if not args.no_check:
        ok = check(configs)
    if args.bench:
        ok = bench(configs, [int(d) for d in args.bench_head_dims.split(",")]) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
