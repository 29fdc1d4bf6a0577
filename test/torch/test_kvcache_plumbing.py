"""The KV-cache decode API's plumbing, on the CPU (no GPU, no extension).

aotriton.flash_attn.flash_attn_with_kvcache (FlashAttention-2's call) -> aotriton.torch.
flash_attention_kvcache -> the op ``aotriton::fwd_kvcache``. Here the op is defined (in a namespace of
the test's own, so the real extension may be loaded beside it) from the C++
file's own schema string (bindings/torch/csrc/aotriton_torch.cpp) with a float64 stand-in as its
CPU kernel and aotriton.torch's fake, so that checked without a GPU are: the schema (opcheck: the
caches declared mutated and nothing else, the fake's shapes and strides, dynamic shapes), what each
argument of FlashAttention's signature becomes (block_table, int and tensor cache_seqlens, k/v,
scale, causal, window, num_splits, return_softmax_lse), the refusals (NotImplementedError naming
rotary_cos/sin, cache_batch_idx, cache_leftpad, softcap, alibi_slopes; ValueError for the rest)
reaching no kernel, that cache_seqlens is never read on the host (a tensor that raises on any host
read), and the float64 reference the GPU test uses (a paged cache scattered over shuffled pages gives
the dense cache's result; appending then attending equals attending over the appended cache). The
stand-in proves no kernel: test_flash_attn_compat.py's test_kvcache runs the real ones.

    PYTHONPATH=bindings/torch/python:test/torch python test/torch/test_kvcache_plumbing.py
"""
import math
import os
import re
import sys

import torch

from harness import Runner, kvcache_append_ref, kvcache_ref, max_err

import aotriton.flash_attn as fa
import aotriton.torch as aot

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(HERE, "..", "..", "bindings", "torch", "csrc", "aotriton_torch.cpp")


class NoHostRead(torch.Tensor):
    """A tensor whose value must stay on the device: any host read raises."""
    BANNED = {"item", "tolist", "__bool__", "__int__", "__index__", "__float__", "numpy", "cpu", "__len__", "__iter__"}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in cls.BANNED:
            raise AssertionError(f"cache_seqlens read on the host ({name})")
        return super().__torch_function__(func, types, args, kwargs or {})


def plain(t):
    return t.as_subclass(torch.Tensor) if isinstance(t, NoHostRead) else t


class StandIn:
    """aotriton::fwd_kvcache in float64 (append, then attend); records every call's arguments."""

    def __init__(self):
        self.calls = []

    def fwd_kvcache(self, q, k_cache, v_cache, cache_seqlens, k_new, v_new, page_table, sm_scale, causal,
                    window_left, window_right, num_splits, return_lse):
        self.calls.append(dict(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens, k_new=k_new,
                               v_new=v_new, page_table=page_table, sm_scale=sm_scale, causal=causal,
                               window=(window_left, window_right), num_splits=num_splits, return_lse=return_lse))
        lens = plain(cache_seqlens)
        assert lens.dtype == torch.int32 and lens.is_contiguous(), "cache_seqlens must reach the op int32, contiguous"
        assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
        out64, lse64 = kvcache_ref(q, k_cache, v_cache, lens, k_new, v_new, page_table, sm_scale, causal,
                                   (window_left, window_right))
        kvcache_append_ref(k_cache, v_cache, lens, k_new, v_new, page_table)
        lse = lse64.float() if return_lse else torch.empty(0, dtype=torch.float32)
        return out64.to(q.dtype), lse


def cpp_schema(name):
    """The schema string m.def gives `name` in the C++ op file (its adjacent literals joined)."""
    text = open(CSRC).read()
    start = text.index(f'"{name}(')
    return "".join(re.findall(r'"([^"]*)"', text[start:text.index('");', start) + 1]))


def case_inputs(b=2, sq=4, hq=8, hk=2, d=32, page=None, pages_per_seq=4, s_cache=64, n_new=0, dtype=torch.float32):
    """q, caches (dense, or shuffled pages with their table), new k/v."""
    q = torch.randn(b, sq, hq, d, dtype=dtype)
    if page is None:
        k_cache, v_cache = torch.randn(b, s_cache, hk, d, dtype=dtype), torch.randn(b, s_cache, hk, d, dtype=dtype)
        table = None
    else:
        n_pages = b * pages_per_seq + 3
        k_cache, v_cache = (torch.randn(n_pages, page, hk, d, dtype=dtype) for _ in range(2))
        table = torch.randperm(n_pages)[:b * pages_per_seq].reshape(b, pages_per_seq).to(torch.int32)
    k_new = torch.randn(b, n_new, hk, d, dtype=dtype) if n_new else None
    v_new = torch.randn(b, n_new, hk, d, dtype=dtype) if n_new else None
    return q, k_cache, v_cache, table, k_new, v_new


def check_reference(run):
    """The float64 reference the GPU test trusts: paged = dense, append + attend = attend over the appended cache."""
    torch.manual_seed(1)
    b, hq, hk, d, page, per = 3, 8, 2, 32, 16, 5
    q, k_pages, v_pages, table, k_new, v_new = case_inputs(b, 4, hq, hk, d, page=page, pages_per_seq=per, n_new=6,
                                                           dtype=torch.float64)
    # The dense cache the pages hold: sequence b's row j is page table[b, j // page], row j % page.
    gather = lambda pool: torch.stack([pool[table[i].long()].reshape(per * page, hk, d) for i in range(b)])  # noqa: E731
    k_dense, v_dense = gather(k_pages), gather(v_pages)
    lens = torch.tensor([0, 13, 70], dtype=torch.int32)  # 13 + 6 crosses the page boundary at 16
    for causal, window in ((False, (-1, -1)), (True, (-1, -1)), (False, (20, 3))):
        out_p, lse_p = kvcache_ref(q, k_pages, v_pages, lens, k_new, v_new, table, 0.3, causal, window)
        out_d, lse_d = kvcache_ref(q, k_dense, v_dense, lens, k_new, v_new, None, 0.3, causal, window)
        run.check(f"reference: paged = dense (causal={causal} window={window})",
                  max_err(out_p, out_d) == 0 and max_err(lse_p, lse_d) == 0)
    kp, vp = k_pages.clone(), v_pages.clone()
    kvcache_append_ref(kp, vp, lens, k_new, v_new, table)
    after, lse_after = kvcache_ref(q, kp, vp, lens + 6, None, None, table, 0.3, True)
    before, lse_before = kvcache_ref(q, k_pages, v_pages, lens, k_new, v_new, table, 0.3, True)
    run.check("reference: append then attend = attend over the appended cache",
              max_err(after, before) == 0 and max_err(lse_after, lse_before) == 0)
    touched = (kp != k_pages).any(-1).any(-1)
    want = torch.zeros_like(touched)
    for i, n in enumerate(lens.tolist()):
        for j in range(n, n + 6):
            want[table[i, j // page], j % page] = True
    run.check("reference: the append writes exactly rows cache_seqlens .. + N_NEW of each sequence's pages",
              torch.equal(touched, want))
    # Bottom-right: with Sq 4 over L keys, causal query t sees L - 4 + t + 1 keys.
    qq = torch.randn(1, 4, 2, 8, dtype=torch.float64)
    kc, vc = torch.randn(1, 32, 2, 8, dtype=torch.float64), torch.randn(1, 32, 2, 8, dtype=torch.float64)
    vc[0, :, :, :] = torch.arange(32, dtype=torch.float64)[:, None, None]
    out, _ = kvcache_ref(qq, kc * 0, vc, torch.tensor([10], dtype=torch.int32), None, None, None, 1.0, True)
    means = out[0, :, 0, 0].tolist()  # equal scores: the mean of the visible keys' positions
    run.check("reference: causal is bottom-right (query t sees keys 0 .. L - Sq + t)",
              all(abs(m - (10 - 4 + t) / 2) < 1e-12 for t, m in enumerate(means)), str(means))


def check_mapping(run, stand_in):
    """flash_attn_with_kvcache's arguments reach the op as FlashAttention-2 means them."""
    torch.manual_seed(2)
    q, kc, vc, table, k_new, v_new = case_inputs(page=16, n_new=3)
    lens = torch.tensor([5, 30], dtype=torch.int32)
    out, lse = fa.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens,
                                          block_table=table, causal=True, window_size=(7, -1), num_splits=3,
                                          return_softmax_lse=True)
    c = stand_in.calls[-1]
    run.check("with_kvcache: block_table -> page_table, k/v -> k_new/v_new, caches passed unchanged (in place)",
              c["page_table"] is table and c["k_new"] is k_new and c["v_new"] is v_new and c["k_cache"] is kc
              and c["v_cache"] is vc)
    run.check("with_kvcache: default scale 1/sqrt(D), causal, window, num_splits, lse on request",
              abs(c["sm_scale"] - 32 ** -0.5) < 1e-12 and c["causal"] is True and c["window"] == (7, -1)
              and c["num_splits"] == 3 and c["return_lse"] is True and lse.shape == (2, 8, 4) and out.shape == q.shape,
              str({k: c[k] for k in ("sm_scale", "causal", "window", "num_splits")}))
    fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=17, softmax_scale=0.25)
    c = stand_in.calls[-1]
    run.check("with_kvcache: an int cache_seqlens becomes an int32 (B,) tensor; softmax_scale; dense",
              c["cache_seqlens"].dtype == torch.int32 and c["cache_seqlens"].tolist() == [17, 17]
              and c["sm_scale"] == 0.25 and c["page_table"] is None and c["k_new"] is None)
    out = fa.flash_attn_with_kvcache(q, kc, vc, block_table=table)
    c = stand_in.calls[-1]
    run.check("with_kvcache: cache_seqlens None = full caches (MAX_PAGES * PAGE), out alone without LSE",
              c["cache_seqlens"].tolist() == [64, 64] and c["return_lse"] is False and isinstance(out, torch.Tensor))
    fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.tensor([1, 2], dtype=torch.int64), block_table=table)
    c = stand_in.calls[-1]
    run.check("with_kvcache: int64 cache_seqlens converted to int32",
              c["cache_seqlens"].dtype == torch.int32 and c["cache_seqlens"].tolist() == [1, 2])
    for read in (lambda t: t.tolist(), lambda t: int(t[0]), lambda t: t.cpu(), lambda t: bool((t > 0).all())):
        try:
            read(NoHostRead(lens))
            run.check("the host-read tripwire fires", False, "a host read went through")
            break
        except AssertionError:
            pass
    else:
        run.check("the host-read tripwire fires (tolist, int, cpu, bool)", True)
    try:
        fa.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=NoHostRead(lens), block_table=table)
        run.check("with_kvcache: cache_seqlens never read on the host", True)
    except AssertionError as e:
        run.check("with_kvcache: cache_seqlens never read on the host", False, str(e))
    # Positional order is FlashAttention-2's: q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, ...
    fa.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, None, None, lens, None, None, table, 0.5, True)
    c = stand_in.calls[-1]
    run.check("with_kvcache: FlashAttention-2's positional order",
              c["page_table"] is table and c["sm_scale"] == 0.5 and c["causal"] is True and c["k_new"] is k_new)

    n = len(stand_in.calls)
    refusals = (
        ("rotary_cos", NotImplementedError, dict(rotary_cos=torch.zeros(64, 16))),
        ("rotary_sin", NotImplementedError, dict(rotary_sin=torch.zeros(64, 16))),
        ("cache_batch_idx", NotImplementedError, dict(cache_batch_idx=torch.zeros(2, dtype=torch.int32))),
        ("cache_leftpad", NotImplementedError, dict(cache_leftpad=torch.zeros(2, dtype=torch.int32))),
        ("softcap", NotImplementedError, dict(softcap=30.0)),
        ("alibi_slopes", NotImplementedError, dict(alibi_slopes=torch.zeros(8))),
        ("k and v", ValueError, dict(k=k_new)),
        ("cache_seqlens", ValueError, dict(k=k_new, v=v_new, cache_seqlens=None)),
        ("num_splits", ValueError, dict(num_splits=129)),
        ("window", ValueError, dict(window_size=(-2, 0))),
        ("unit last stride", ValueError, dict(k_cache=kc.transpose(-1, -2).contiguous().transpose(-1, -2))),
        ("int32", TypeError, dict(block_table=table.float())),
        ("1..16", ValueError, dict(q=torch.randn(2, 17, 8, 32))),
    )
    for what, exc, kw in refusals:
        args = dict(q=q, k_cache=kc, v_cache=vc, cache_seqlens=lens, block_table=table)
        args.update(kw)
        try:
            fa.flash_attn_with_kvcache(**args)
            run.check(f"with_kvcache refuses {what}", False, "no error")
        except exc as e:
            run.check(f"with_kvcache refuses {what} ({exc.__name__})", what in str(e), str(e)[:160])
    run.check("with_kvcache refusals reach no kernel", len(stand_in.calls) == n)


#: The namespace the test defines the op in: not ``aotriton``, which the GPU machine's run loads the
#: real extension into (its CUDA kernel has no CPU tensors to take).
TEST_NS = "aotriton_kvcache_plumbing"


def check_op(run, stand_in):
    """The op from the C++ schema, with the stand-in as its CPU kernel and aotriton.torch's fake,
    defined in a namespace of the test's own (``TEST_NS``)."""
    schema = cpp_schema("fwd_kvcache")
    run.check("C++ schema found", schema.startswith("fwd_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache"),
              schema)
    lib = torch.library.Library(TEST_NS, "DEF")  # noqa: TOR901
    lib.define(schema)
    lib.impl("fwd_kvcache", lambda *a: stand_in.fwd_kvcache(*a), "CPU")
    torch.library.register_fake(f"{TEST_NS}::fwd_kvcache", lib=lib)(aot._fwd_kvcache_fake)
    op = getattr(torch.ops, TEST_NS).fwd_kvcache
    torch.manual_seed(3)
    for label, page, n_new, ret in (("dense, append, lse", None, 3, True), ("paged, no append, no lse", 16, 0, False)):
        q, kc, vc, table, k_new, v_new = case_inputs(page=page, n_new=n_new)
        lens = torch.tensor([5, 20], dtype=torch.int32)
        args = (q, kc, vc, lens, k_new, v_new, table, 0.3, True, -1, -1, 0, ret)
        try:
            torch.library.opcheck(op, args)
            run.check(f"opcheck fwd_kvcache ({label}): schema, mutations, fake, dynamic shapes", True)
        except Exception as e:  # noqa: BLE001
            run.check(f"opcheck fwd_kvcache ({label})", False, f"{type(e).__name__}: {str(e)[:400]}")
    # aotriton.torch through the real dispatcher (Optional None arguments, the bool/int/float casts).
    real_ops = aot._ops
    aot._ops = lambda: getattr(torch.ops, TEST_NS)
    try:
        q, kc, vc, table, k_new, v_new = case_inputs(page=16, n_new=3)
        lens = torch.tensor([12, 40], dtype=torch.int32)
        k0, v0 = kc.clone(), vc.clone()
        out, lse = fa.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, block_table=table,
                                              causal=True, return_softmax_lse=True)
        ref, lse_ref64 = kvcache_ref(q, k0, v0, lens, k_new, v_new, table, 1 / math.sqrt(32), True)
        kvcache_append_ref(k0, v0, lens, k_new, v_new, table)
        run.check("dispatcher: out, lse and the caches appended in place",
                  max_err(out, ref) < 1e-5 and max_err(lse, lse_ref64) < 1e-5 and torch.equal(kc, k0)
                  and torch.equal(vc, v0))
        if "--no-compile" not in sys.argv:
            def step(q, kc, vc, k_new, v_new, lens, table):
                return fa.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, block_table=table,
                                                  causal=True) * 2
            q, kc, vc, table, k_new, v_new = case_inputs(page=16, n_new=2)
            k0, v0 = kc.clone(), vc.clone()
            try:
                got = torch.compile(step, fullgraph=True)(q, kc, vc, k_new, v_new, lens, table)
                ref, _ = kvcache_ref(q, k0, v0, lens, k_new, v_new, table, 1 / math.sqrt(32), True)
                kvcache_append_ref(k0, v0, lens, k_new, v_new, table)
                run.check("torch.compile(fullgraph): result and the in-place append kept",
                          max_err(got, ref * 2) < 1e-5 and torch.equal(kc, k0) and torch.equal(vc, v0))
            except Exception as e:  # noqa: BLE001
                run.check("torch.compile(fullgraph)", False, f"{type(e).__name__}: {str(e)[:300]}")
    finally:
        aot._ops = real_ops


def check_registry_kvcache(run, stand_in):
    """torch's varlen_attn KV-cache mode (aten::_flash_attention_forward with a block_table) as the
    registered implementation serves it: packed queries of max_q tokens per sequence, a paged cache,
    seqused_k (or cum_seq_k's differences) on the device; out (total_q, Hq, D) and lse (Hq, total_q)
    against the float64 reference; the refusals."""
    from aotriton import flash_impl
    torch.manual_seed(5)
    b, sq, hq, hk, d = 3, 2, 8, 2, 32
    q, kc, vc, table, _, _ = case_inputs(b, sq, hq, hk, d, page=16, pages_per_seq=4)
    lens = torch.tensor([7, 0, 40], dtype=torch.int32)
    packed = q.reshape(b * sq, hq, d)
    cu_q = torch.arange(0, b * sq + 1, sq, dtype=torch.int32)
    cu_k = torch.cat([torch.zeros(1, dtype=torch.int32), lens.cumsum(0).to(torch.int32)])
    for how, extra in (("seqused_k", dict(seqused_k=NoHostRead(lens))), ("cum_seq_k", {})):
        for causal, window in ((True, (None, None)), (False, (5, 1))):
            before = len(stand_in.calls)
            out, lse, *_ = flash_impl.flash_attention_forward(
                packed, kc, vc, cu_q, cu_k if how == "cum_seq_k" else None, sq, 64, 0.0, causal, False, scale=0.25,
                window_size_left=window[0], window_size_right=window[1], block_table=table, num_splits=3, **extra)
            ref, ref_lse = kvcache_ref(q, kc, vc, lens, None, None, table, 0.25, causal,
                                       (-1 if window[0] is None else window[0], -1 if window[1] is None else window[1]))
            call = stand_in.calls[before] if len(stand_in.calls) > before else {}
            ok = (out.shape == packed.shape and lse.shape == (hq, b * sq)
                  and max_err(out, ref.reshape(b * sq, hq, d)) < 1e-5  # fp32 inputs, a float64 stand-in
                  and max_err(lse, ref_lse.permute(1, 0, 2).reshape(hq, b * sq)) < 1e-5
                  and call.get("num_splits") == 3 and call.get("page_table") is table)
            run.check(f"registry: varlen_attn KV-cache mode ({how}, causal={causal}, window={window})", ok,
                      f"out {tuple(out.shape)} lse {tuple(lse.shape)}")
    for what, kwargs, want in (
            ("dropout", dict(dropout_p=0.1), "dropout"),
            ("uneven query counts", dict(query=packed[:-1]), "query tokens"),
            ("more than 16 tokens", dict(max_q=17, query=torch.randn(b * 17, hq, d)), "query tokens"),
            ("seqused_k without a block_table", dict(block_table=None, seqused_k=lens), "seqused_k")):
        args = dict(query=packed, key=kc, value=vc, cum_seq_q=cu_q, cum_seq_k=None, max_q=sq, max_k=64,
                    dropout_p=0.0, is_causal=True, return_debug_mask=False)
        kw = dict(block_table=table, seqused_k=lens)
        for k, v in kwargs.items():
            (args if k in args else kw)[k] = v
        before = len(stand_in.calls)
        try:
            flash_impl.flash_attention_forward(*args.values(), **kw)
            run.check(f"registry: KV-cache mode refuses {what}", False, "no error")
        except NotImplementedError as e:
            run.check(f"registry: KV-cache mode refuses {what}", want in str(e) and len(stand_in.calls) == before,
                      str(e)[:160])


def main():
    run = Runner("kvcache_plumbing")
    stand_in = StandIn()
    aot._ops = lambda: stand_in  # the extension ops -> the float64 stand-in (this process only)
    check_reference(run)
    check_mapping(run, stand_in)
    check_op(run, stand_in)
    check_registry_kvcache(run, stand_in)
    run.finish()


if __name__ == "__main__":
    main()
