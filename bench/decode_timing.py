"""Timing helpers shared by the decode benchmarks (bench/bench_decode.py through the binding,
test/decode/check_decode.py through Triton's JIT): CUDA-graph medians, the device copy's
bandwidth, SDPA peers on the same cache, a dense cache as pages."""
import torch
import triton.testing
from torch.nn.attention import sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa


def bench_ms(fn):
    """Median ms of fn replayed from a CUDA graph (after one eager call)."""
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=30)


def copy_bandwidth():
    """GB/s of a 2 GiB device-to-device copy, read + write bytes."""
    src = torch.empty(2 ** 30, dtype=torch.int16, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=5, rep=50)
    return 2 * src.numel() * 2 / ms * 1e-6


def peer_call(backend, q, k, v):
    """A closure calling SDPA on (B, H, S, D) views with this backend, or None where it refuses."""
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    group = q.shape[2] // k.shape[2]
    for args in ((qt, kt, vt, True), (qt, kt.repeat_interleave(group, 1), vt.repeat_interleave(group, 1), False)):
        def call(a=args):
            with sdpa_kernel(backend):
                return sdpa(a[0], a[1], a[2], is_causal=False, enable_gqa=a[3])
        try:
            call()
            return call
        except RuntimeError:
            continue
    return None


def paged(k, v, page):
    """(pool_k, pool_v, block_table): the dense caches as pages in a random order."""
    b, sk = k.shape[:2]
    per_seq = sk // page
    perm = torch.randperm(b * per_seq, device=k.device)
    pool_k = torch.empty(b * per_seq, page, *k.shape[2:], device=k.device, dtype=k.dtype)
    pool_v = torch.empty_like(pool_k)
    pool_k[perm] = k.reshape(b * per_seq, page, *k.shape[2:])
    pool_v[perm] = v.reshape(b * per_seq, page, *v.shape[2:])
    return pool_k, pool_v, perm.view(b, per_seq).to(torch.int32).contiguous()
