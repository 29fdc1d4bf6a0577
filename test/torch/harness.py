"""Shared helpers of the torch tests: a tiny case runner and float64 references."""
import math
import sys
import traceback

import torch


class Runner:
    """Collects pass/fail per case; prints `torch-<name>: N passed, M failed` at the end."""

    def __init__(self, name):
        self.name = name
        self.passed = 0
        self.failed = 0
        self.failures = []

    def check(self, case, ok, detail=""):
        ok = bool(ok)
        print(f"{'PASS' if ok else 'FAIL'} {case}" + (f"  {detail}" if detail else ""), flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            self.failures.append(case)
        return ok

    def run(self, case, fn, *args, **kwargs):
        """Runs fn(*args) and counts an exception as a failure of `case`."""
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            self.check(case, False, f"raised {type(e).__name__}: {str(e)[:400]}")
            return None

    def finish(self):
        if self.failures:
            print("failed cases:", ", ".join(self.failures[:40]))
        print(f"torch-{self.name}: {self.passed} passed, {self.failed} failed", flush=True)
        sys.exit(1 if self.failed or not self.passed else 0)


def max_err(a, r):
    """max |a - r| in float64; NaN anywhere (or inf mismatches) gives inf, so NaN never passes."""
    a = a.detach().double()
    r = r.detach().double()
    if a.shape != r.shape:
        return math.inf
    if torch.isnan(a).any() or torch.isnan(r).any():
        return math.inf
    fin = torch.isfinite(r)
    if not torch.equal(torch.isfinite(a), fin) or not torch.equal(a[~fin], r[~fin]):
        return math.inf
    if a.numel() == 0:
        return 0.0
    return (a[fin] - r[fin]).abs().max().item() if fin.any() else 0.0


def visible(sq, sk, left=-1, right=-1, align=0, causal=False, device="cuda"):
    """Bool [Sq, Sk]: query i sees key j iff i+off-left <= j <= i+off+right (-1 = unbounded)."""
    if causal:
        right = 0
    off = 0 if align == 0 else sk - sq
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    vis = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        vis &= j >= i + off - left
    if right >= 0:
        vis &= j <= i + off + right
    return vis


def attention_ref(q, k, v, scale, bias=None, vis=None, keep=None, p=0.0):
    """Plain attention in the inputs' dtype: q (B,Hq,Sq,D), k/v (B,Hk,Sk,D) (GQA by repeat).
    bias: additive, broadcastable; vis: bool, broadcastable (False = hidden); keep: dropout keep
    mask (1/0), kept values scaled by 1/(1-p). Rows that see no key give 0 (no NaN, no NaN grads)."""
    g = q.shape[1] // k.shape[1]
    if g > 1:
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if bias is not None:
        s = s + bias
    if vis is not None:
        vis = vis.expand(s.shape)
        has = vis.any(-1, keepdim=True)
        s = torch.where(vis, s, torch.full_like(s, -math.inf))
        s = torch.where(has, s, torch.zeros_like(s))
        pr = torch.softmax(s, dim=-1) * has
    else:
        pr = torch.softmax(s, dim=-1)
    if keep is not None:
        pr = pr * keep.to(pr.dtype) / (1.0 - p)
    return torch.matmul(pr, v)


def lse_ref(q, k, scale, bias=None, vis=None):
    g = q.shape[1] // k.shape[1]
    if g > 1:
        k = k.repeat_interleave(g, dim=1)
    s = torch.matmul(q.double(), k.double().transpose(-1, -2)) * scale
    if bias is not None:
        s = s + bias.double()
    if vis is not None:
        s = s.masked_fill(~vis.expand(s.shape), -math.inf)
    out = torch.logsumexp(s, dim=-1)
    return torch.where(torch.isneginf(out), torch.full_like(out, math.inf), out)
