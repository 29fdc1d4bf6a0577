#!/usr/bin/env python3
"""The decode kernels (python/kernels/decode/) through Triton's JIT on a GPU: correctness against
float64 and bandwidth beside torch SDPA's flash and cuDNN backends (kernel level, before the
runtime's operator exists; the operator's own tests are the Rust GPU suite's).

    python3 test/decode/check_decode.py [--bench]

Bandwidth = K/V bytes read / median time, each call replayed from a CUDA graph
(``triton.testing.do_bench_cudagraph``: the JIT's Python launch of ~40 arguments takes longer
than a small decode step, which the library's launch does not), beside a device-to-device copy of
2 GiB (read + write bytes / time) measured in the same process.
"""
import argparse
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import torch  # noqa: E402
import triton  # noqa: E402

from kernels.decode.decode import attn_decode  # noqa: E402
from kernels.decode.decode_combine import attn_decode_combine  # noqa: E402
from decode_timing import bench_ms, copy_bandwidth, paged, peer_call  # noqa: E402

UNBOUNDED = 2 ** 30


def splits_for(b, hk, rows, capacity, sms, block_m):
    """The split rule (as the runtime's, rust/aotriton/src/flash/kvcache.rs): as many splits as fit two
    programs per multiprocessor in one wave, at most one per 256 keys."""
    programs = b * hk * triton.cdiv(rows, block_m)
    return max(1, min(2 * sms // programs, 128, triton.cdiv(capacity, 256)))


def prepare(q, k, v, seqlens, causal=True, splits=None, block_n=None, stages=3, warps=4, paged=None, block_m=None):
    """Launch closure for dense caches k, v [B, S, Hk, D] (or, with ``paged = (table, page)``, pools k, v
    [N_PAGES, page, Hk, D]; the kernel for the page as the runtime picks it: SMALL_PAGE the page
    where it is below BLOCK_N); q [B, Sq, Hq, D]. Returns (fn, o, lse, splits)."""
    b, sq, hq, d = q.shape
    hk = k.shape[2]
    cap = paged[0].shape[1] * paged[1] if paged else k.shape[1]
    group = hq // hk
    hd = max(64, triton.next_power_of_2(d))
    bm = block_m or min(b for b in (16, 32, 64) if b >= min(group * sq, 64))
    bn = block_n or (32 if hd > 128 else 64)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n_split = splits or splits_for(b, hk, group * sq, cap, sms, bm)
    o = torch.full_like(q, float("nan"))
    lse = torch.full((b, hq, sq), float("nan"), device=q.device)
    o_part = torch.empty(n_split, b, hq, sq, hd, device=q.device)
    lse_part = torch.empty(n_split, b, hq, sq, device=q.device)
    dummy = torch.zeros(4, dtype=torch.int32, device=q.device)
    table = paged[0] if paged else dummy
    log2_page = int(math.log2(paged[1])) if paged else 0
    small_page = paged[1] if paged and paged[1] < bn else 0
    n_pages = k.shape[0] if paged else 0
    grid = (n_split, b * hk, triton.cdiv(group * sq, bm))
    right = 0 if causal else UNBOUNDED

    def run(parts="both"):
        if parts == "combine":
            attn_decode_combine[(b * hq * sq,)](o_part, lse_part, o, lse, o.stride(0), o.stride(2), o.stride(1),
                                           lse.stride(0), lse.stride(1), b, hq, sq, d, n_split, 1,
                                           HEAD_DIM=hd, BLOCK_M=32, num_warps=4)
            return
        attn_decode[grid](q, k, v, o, lse, o_part, lse_part, table, seqlens, dummy, 1.0 / math.sqrt(d),
                          q.stride(0), q.stride(2), q.stride(1), k.stride(0), k.stride(2), k.stride(1),
                          v.stride(0), v.stride(2), v.stride(1), o.stride(0), o.stride(2), o.stride(1),
                          lse.stride(0), lse.stride(1), table.stride(0),
                          sq, 0, d, group, hq, UNBOUNDED, right, cap, log2_page, n_pages, n_split, 1, 0,
                          HEAD_DIM=hd, BLOCK_M=bm, BLOCK_N=bn, PAGED=bool(paged), SMALL_PAGE=small_page,
                          num_warps=warps, num_stages=stages)
        if n_split > 1 and parts == "both":
            attn_decode_combine[(b * hq * sq,)](o_part, lse_part, o, lse, o.stride(0), o.stride(2), o.stride(1),
                                           lse.stride(0), lse.stride(1), b, hq, sq, d, n_split, 1,
                                           HEAD_DIM=hd, BLOCK_M=32, num_warps=4)
    return run, o, lse, n_split


def full_cache_case(b, sq, sk, hq, hk, d):
    """Random bf16 q [B, Sq, Hq, D] and a dense cache k, v [B, Sk, Hk, D] that every sequence fills."""
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16)
    return q, k, v, torch.full((b,), sk, device="cuda", dtype=torch.int32)


def reference(q, k, v, seqlens, causal):
    b, sq, hq, d = q.shape
    group = hq // k.shape[2]
    out = torch.zeros(b, sq, hq, d, dtype=torch.float64, device=q.device)
    for z in range(b):
        n = int(seqlens[z])
        qz = q[z].double().transpose(0, 1)                                   # [Hq, Sq, D]
        kz = k[z, :n].double().transpose(0, 1).repeat_interleave(group, 0)   # [Hq, n, D]
        vz = v[z, :n].double().transpose(0, 1).repeat_interleave(group, 0)
        s = qz @ kz.transpose(1, 2) / math.sqrt(d)
        if causal:
            pos = n - sq + torch.arange(sq, device=q.device)
            s = s.masked_fill(torch.arange(n, device=q.device)[None, None, :] > pos[None, :, None], float("-inf"))
        out[z] = (torch.softmax(s, -1) @ vz).transpose(0, 1)
    return out


def check():
    torch.manual_seed(0)
    ok_all = True
    for b, sq, hq, hk, d, cap, causal, splits in ((4, 1, 32, 8, 128, 3000, True, None), (3, 4, 8, 2, 64, 500, True, 3),
                                                  (2, 16, 16, 2, 128, 700, True, None), (5, 1, 8, 1, 256, 900, False, None),
                                                  (2, 8, 8, 8, 96, 333, True, 1)):
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, cap, hk, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, cap, hk, d, device="cuda", dtype=torch.bfloat16)
        seqlens = torch.randint(sq, cap + 1, (b,), device="cuda", dtype=torch.int32)
        seqlens[0] = cap
        run, o, lse, n_split = prepare(q, k, v, seqlens, causal, splits)
        run()
        ref = reference(q, k, v, seqlens, causal)
        err = (o.double() - ref).abs().max().item()
        naive = (ref.to(torch.bfloat16).double() - ref).abs().max().item()
        ok = not o.isnan().any().item() and err <= 4 * naive + 1e-3
        ok_all &= ok
        print(f"{'PASS' if ok else 'FAIL'} B{b} Sq{sq} Hq{hq} Hk{hk} D{d} cap{cap} {'causal' if causal else 'full'} "
              f"splits {n_split}: O err {err:.2e} (bf16 rounding of the reference {naive:.2e})", flush=True)
    return ok_all


def bench():
    """The kernels (JIT) beside SDPA's FA2 and cuDNN (decode_timing.py's peers): bf16, Hq 32, Hk 8, hd128."""
    from torch.nn.attention import SDPBackend
    copy_bw = copy_bandwidth()
    print(f"device copy: {copy_bw:.0f} GB/s (read + write)")
    print(f"{'B':>4} {'Sq':>3} {'Sk':>6} {'splits':>6} {'aot GB/s':>9} {'of copy':>8} {'FA2 GB/s':>9} {'cuDNN GB/s':>10} {'aot/best':>8}")
    hq, hk, d = 32, 8, 128
    for sq in (1, 4, 8, 16):
        for b, sk in ((1, 8192), (8, 4096), (16, 4096), (16, 8192), (64, 1024), (64, 4096), (128, 2048), (8, 32768)):
            q, k, v, seqlens = full_cache_case(b, sq, sk, hq, hk, d)
            run, o, lse, n_split = prepare(q, k, v, seqlens, True)
            mb = 2 * b * sk * hk * d * 2 * 1e-6  # over a time in ms: GB/s
            aot = mb / bench_ms(run)
            peers = {}
            for name, backend in (("FA2", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION)):
                call = peer_call(backend, q, k, v)
                peers[name] = mb / bench_ms(call) if call else None
            best = max([p for p in peers.values() if p] or [float("nan")])
            f = lambda x: f"{x:.0f}" if x else "n/a"  # noqa: E731
            print(f"{b:>4} {sq:>3} {sk:>6} {n_split:>6} {aot:>9.0f} {aot / copy_bw:>8.2f} {f(peers['FA2']):>9} "
                  f"{f(peers['cuDNN']):>10} {aot / best:>8.2f}", flush=True)


def sweep():
    """Split count, BLOCK_N, stages and warps at the small-batch Sq 1 shapes (bf16, Hq 32, Hk 8, hd128)."""
    hq, hk, d = 32, 8, 128
    print(f"{'B':>4} {'Sk':>6} {'splits':>6} {'BLOCK_N':>7} {'stages':>6} {'warps':>5} {'GB/s':>6}")
    for b, sk in ((1, 8192), (8, 4096), (8, 8192), (16, 4096), (8, 32768)):
        q, k, v, seqlens = full_cache_case(b, 1, sk, hq, hk, d)
        bytes_kv = 2 * b * sk * hk * d * 2
        for splits in (None, 8, 16, 32, 64):
            for bn, stages, warps in ((64, 3, 4), (32, 4, 4), (64, 4, 4), (128, 3, 8)):
                if splits is not None and splits * 256 > sk * 2:
                    continue
                run, o, lse, n = prepare(q, k, v, seqlens, True, splits, bn, stages, warps)
                t = bench_ms(run)
                print(f"{b:>4} {sk:>6} {n:>6} {bn:>7} {stages:>6} {warps:>5} {bytes_kv / t * 1e-6:>6.0f}", flush=True)


def sweep_rows():
    """Row tile, split count and config at small batches, Sq 1-16 (bf16, Hq 32, Hk 8, hd128): where the
    programs do not fill whole waves."""
    hq, hk, d = 32, 8, 128
    print(f"{'B':>4} {'Sq':>3} {'Sk':>6} {'BLOCK_M':>7} {'splits':>6} {'BLOCK_N':>7} {'stages':>6} {'warps':>5} {'GB/s':>6}")
    for b, sq, sk in ((8, 1, 4096), (8, 8, 4096), (8, 16, 4096), (16, 16, 4096), (1, 8, 8192), (8, 16, 32768)):
        q, k, v, seqlens = full_cache_case(b, sq, sk, hq, hk, d)
        bytes_kv = 2 * b * sk * hk * d * 2
        rows = (hq // hk) * sq
        best = (0, None)
        for bm in sorted({16, max(16, triton.next_power_of_2(rows))}):
            for splits in (1, 2, 3, 4, 5, 6, 8, 12, 16, 32, 64):
                if splits * 256 > sk:
                    continue
                for bn, stages, warps in ((64, 3, 4), (64, 2, 4), (64, 3, 8)):
                    run, o, lse, n = prepare(q, k, v, seqlens, True, splits, bn, stages, warps, block_m=bm)
                    try:
                        t = bench_ms(run)
                    except Exception as e:  # out of shared memory / registers for this config
                        print(f"{b:>4} {sq:>3} {sk:>6} {bm:>7} {n:>6} {bn:>7} {stages:>6} {warps:>5} failed: {type(e).__name__}")
                        continue
                    gbs = bytes_kv / t * 1e-6
                    best = max(best, (gbs, (bm, n, bn, stages, warps)))
                    print(f"{b:>4} {sq:>3} {sk:>6} {bm:>7} {n:>6} {bn:>7} {stages:>6} {warps:>5} {gbs:>6.0f}", flush=True)
        print(f"best B{b} Sq{sq} Sk{sk}: {best[0]:.0f} GB/s at (BLOCK_M, splits, BLOCK_N, stages, warps) = {best[1]}", flush=True)


def split_times():
    """Decode and combine timed apart (Sq 1, bf16, Hq 32, Hk 8, hd128)."""
    hq, hk, d = 32, 8, 128
    for b, sk, splits in ((1, 8192, 32), (8, 4096, 5), (8, 4096, 16), (16, 4096, 3), (64, 4096, 1)):
        q, k, v, seqlens = full_cache_case(b, 1, sk, hq, hk, d)
        run, o, lse, n = prepare(q, k, v, seqlens, True, splits)
        both = bench_ms(run) * 1e3
        dec = bench_ms(lambda: run("decode")) * 1e3
        comb = bench_ms(lambda: run("combine")) * 1e3 if n > 1 else 0.0
        gb = 2 * b * sk * hk * d * 2 / 1e3
        print(f"B{b} Sk{sk} splits {n}: both {both:.1f} us ({gb / both:.0f} GB/s), decode {dec:.1f} us "
              f"({gb / dec:.0f} GB/s), combine {comb:.1f} us", flush=True)


def dense_baseline(b, sq, sk, hq, hk, d):
    """A full dense cache case on the shipped config: its inputs, output, time (ms), K/V gigabytes
    over a time in ms (GB/s) and split count."""
    q, k, v, seqlens = full_cache_case(b, sq, sk, hq, hk, d)
    run, o_dense, _, n = prepare(q, k, v, seqlens, True)
    return q, k, v, seqlens, o_dense, bench_ms(run), 2 * b * sk * hk * d * 2 * 1e-6, n


def paged_vs_dense():
    """The same keys read from a dense cache and from pages (a random permutation of the pool), each
    on the shipped config, hd 128 (and hd 64 / 256 at one shape)."""
    hq, hk = 32, 8
    print(f"{'B':>4} {'Sq':>3} {'Sk':>6} {'D':>3} {'page':>5} {'dense GB/s':>10} {'paged GB/s':>10} {'paged/dense':>11} "
          f"{'max|diff|':>9}")
    for b, sq, sk, d in ((8, 1, 4096, 128), (16, 1, 8192, 128), (64, 1, 2048, 128), (8, 8, 4096, 128),
                         (16, 8, 4096, 128), (16, 16, 4096, 128), (16, 16, 8192, 128), (16, 1, 8192, 64),
                         (16, 1, 8192, 256)):
        q, k, v, seqlens, o_dense, t_dense, gb, _ = dense_baseline(b, sq, sk, hq, hk, d)
        for page in (16, 32, 64, 256):
            pool_k, pool_v, table = paged(k, v, page)
            runp, o_paged, _, _ = prepare(q, pool_k, pool_v, seqlens, True, paged=(table, page))
            t_paged = bench_ms(runp)
            diff = (o_paged.float() - o_dense.float()).abs().max().item()
            print(f"{b:>4} {sq:>3} {sk:>6} {d:>3} {page:>5} {gb / t_dense:>10.0f} {gb / t_paged:>10.0f} "
                  f"{t_dense / t_paged:>11.2f} {diff:>9.1e}", flush=True)


def sweep_paged():
    """Small pages (16, 32) under BLOCK_N 32-128 and 2-4 stages, beside the dense cache's shipped
    config."""
    hq, hk, d = 32, 8, 128
    print(f"{'B':>4} {'Sq':>3} {'Sk':>6} {'page':>5} {'BLOCK_N':>7} {'stages':>6} {'dense GB/s':>10} {'paged GB/s':>10} "
          f"{'paged/dense':>11}")
    for b, sq, sk in ((8, 1, 4096), (16, 1, 8192), (16, 8, 4096), (16, 16, 4096)):
        q, k, v, seqlens, o_dense, t_dense, gb, n = dense_baseline(b, sq, sk, hq, hk, d)
        for page in (16, 32):
            pool_k, pool_v, table = paged(k, v, page)
            for bn, stages in ((32, 3), (32, 4), (64, 3), (64, 4), (128, 2)):
                runp, o_paged, _, _ = prepare(q, pool_k, pool_v, seqlens, True, n, bn, stages, paged=(table, page))
                try:
                    t_paged = bench_ms(runp)
                except Exception as e:  # shared memory
                    print(f"{b:>4} {sq:>3} {sk:>6} {page:>5} {bn:>7} {stages:>6} failed: {type(e).__name__}")
                    continue
                print(f"{b:>4} {sq:>3} {sk:>6} {page:>5} {bn:>7} {stages:>6} {gb / t_dense:>10.0f} {gb / t_paged:>10.0f} "
                      f"{t_dense / t_paged:>11.2f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="split count and config sweep at small batches")
    ap.add_argument("--sweep-rows", action="store_true", help="row tile / split / config sweep at Sq 4-16")
    ap.add_argument("--sweep-paged", action="store_true", help="small pages under BLOCK_N 32-128 and 2-4 stages")
    ap.add_argument("--times", action="store_true", help="decode and combine timed apart")
    ap.add_argument("--paged", action="store_true", help="paged caches (pages 16-256) beside dense")
    args = ap.parse_args()
    ok = check()
    print(f"check_decode: {'ok' if ok else 'FAILED'}")
    if args.bench:
        bench()
    if args.sweep:
        sweep()
    if args.sweep_rows:
        sweep_rows()
    if args.sweep_paged:
        sweep_paged()
    if args.times:
        split_times()
    if args.paged:
        paged_vs_dense()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
