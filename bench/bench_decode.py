#!/usr/bin/env python3
"""KV-cache decoding through the PyTorch binding, where servers call it:
aotriton.flash_attn.flash_attn_with_kvcache (FlashAttention's signature), beside torch SDPA's
flash (FA2) and cuDNN backends on the same dense cache, same process, same timer.

Each call is replayed from a CUDA graph (triton.testing.do_bench_cudagraph, median): a serving
loop captures its decode steps, and a small step takes less time on the GPU than a Python call
takes to issue. Bandwidth = the K/V bytes one step must read (2·B·Sk·Hk·D·2, each element once)
/ time, and its fraction of a 2 GiB device-to-device copy (read + write bytes / time) measured in
the same process. Peers: SDPA with enable_gqa where the backend takes it, else K/V expanded to Hq
heads (the same attention; bandwidth still counted on the un-expanded bytes), no mask (the keys of
the bottom-right causal mask at Sq 1; a little more work above it). Column pgN: dense time / paged time, the
same cache as a pool of N-key pages in a random order with its block_table (aotriton only; the
peers have no paged path in torch; --pages picks N: 16, 32 and 64 by default). Before timing, aotriton's
dense and paged outputs are compared with cuDNN's (or FA2's);
a difference above 2e-2 × max|ref| marks the row WRONG and the exit status 1.

Grid (issue 20): bf16, Hq 32, Hk 8, hd 128, every sequence at length Sk, Sq 1/4/8/16,
B 1-128, Sk 1k-32k.

    PYTHONPATH=bindings/torch/python python3 bench/bench_decode.py [--json out.json] [--quick] [--pages 16,32,64]
"""
import argparse
import json
import sys

import torch
from torch.nn.attention import SDPBackend

import aotriton.flash_attn as fa
from decode_timing import bench_ms, copy_bandwidth, paged, peer_call

HQ, HK, D = 32, 8, 128
GRID = [(b, sk) for b in (1, 8, 16, 64, 128) for sk in (1024, 4096, 8192, 32768) if b * sk <= 64 * 32768 // 2]
QUICK = [(8, 4096), (64, 4096)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--quick", action="store_true", help="only B8 and B64 at Sk 4096")
    ap.add_argument("--pages", default="16,32,64",
                    help="page sizes of the paged columns, comma-separated (default 16,32,64)")
    args = ap.parse_args()
    pages = [int(p) for p in args.pages.split(",")]
    torch.manual_seed(0)
    copy = copy_bandwidth()
    print(f"device copy: {copy:.0f} GB/s (read + write); bf16 Hq {HQ} Hk {HK} hd {D}, dense cache, CUDA graphs")
    paged_heads = "".join(f"{'pg' + str(p):>6} " for p in pages)  # paged time / dense time, per page size
    print(f"{'Sq':>3} {'B':>4} {'Sk':>6} {'aot GB/s':>9} {'of copy':>8} {paged_heads}{'FA2 GB/s':>9} "
          f"{'cuDNN GB/s':>10} {'aot/best':>8} {'max|diff|':>9}")
    rows, wrong = [], False
    for sq in (1, 4, 8, 16):
        for b, sk in (QUICK if args.quick else GRID):
            q = torch.randn(b, sq, HQ, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(b, sk, HK, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(b, sk, HK, D, device="cuda", dtype=torch.bfloat16)
            lens = torch.full((b,), sk, device="cuda", dtype=torch.int32)
            gb = 2 * b * sk * HK * D * 2 * 1e-6  # bytes x 1e-6: over a time in ms, GB/s
            ours = lambda: fa.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, causal=True)  # noqa: E731
            t = bench_ms(ours)
            paged_calls = []
            for page in pages:
                pool_k, pool_v, table = paged(k, v, page)
                paged_calls.append(lambda pool_k=pool_k, pool_v=pool_v, table=table: fa.flash_attn_with_kvcache(
                    q, pool_k, pool_v, cache_seqlens=lens, block_table=table, causal=True))
            t_paged = [bench_ms(call) for call in paged_calls]
            peers, ref = {}, None
            for name, backend in (("FA2", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION)):
                call = peer_call(backend, q, k, v)
                peers[name] = gb / bench_ms(call) if call else None
                if call is not None and sq == 1:
                    ref = call().transpose(1, 2)
            diff = float("nan")
            if ref is not None:
                out = ours().float()
                diff = (out - ref.float()).abs().max().item()
                bound = 2e-2 * ref.float().abs().max().item()
                # A paged call may take a smaller key tile than the dense one (a page under 64
                # keys): the same bound against the reference, not bitwise equality with dense.
                bad = diff > bound or any((call().float() - ref.float()).abs().max().item() > bound
                                          for call in paged_calls)
                wrong |= bad
            aot = gb / t
            best = max([p for p in peers.values() if p] or [float("nan")])
            fmt = lambda x: f"{x:.0f}" if x else "n/a"  # noqa: E731
            paged_cols = "".join(f"{t / tp:>6.2f} " for tp in t_paged)
            print(f"{sq:>3} {b:>4} {sk:>6} {aot:>9.0f} {aot / copy:>8.2f} {paged_cols}{fmt(peers['FA2']):>9} "
                  f"{fmt(peers['cuDNN']):>10} {aot / best:>8.2f} {diff:>9.1e}"
                  + (" WRONG" if ref is not None and bad else ""), flush=True)
            rows.append({"sq": sq, "b": b, "sk": sk, "aot_gbs": aot, "of_copy": aot / copy,
                         "paged_over_dense": {p: t / tp for p, tp in zip(pages, t_paged)},
                         "fa2_gbs": peers["FA2"], "cudnn_gbs": peers["cuDNN"], "max_diff": diff})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_gbs": copy, "rows": rows}, f, indent=1)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
