"""The tuning database: the measured fastest config per functional, mask kind and length bin.

One file per arch, ``tuning/<arch>.json``, written by the tuner (``python/tune.py``, run on a GPU
machine through the AOT images and the runtime's own launch path) and committed; small and
diff-able (one entry per line group, sorted). ``rules.enumerate_kernels`` compiles, per
functional, the configs the database names plus the heuristic fallback, and records in each
kernel's metadata the cells it won (``tuned_for``); the runtime bins a call's lengths and takes the
kernel that won its cell, else the heuristic (rules.py, "Runtime choice").

Format (``FORMAT`` 1)::

    {"format": 1, "arch": "sm_90",
     "measured_on": {"device": "NVIDIA H200", "triton": "3.6.0", "aotriton": "<git rev>"},
     "grid": {"seqlen_edges": [0, 512, 2048, 8192], "tokens": 16384, "hidden": 2048},
     "entries": [
       {"family": "attn_fwd",
        "functional": {"dtype": "bf16", "tf32": false, "head_dim": 128, "dropout": false, "bias": false},
        "mask": "causal", "seqlen_q_bin": 2, "seqlen_k_bin": 2,
        "winner": "m128n128w8s3", "winner_ms": 0.412, "runner_up": "m128n64w4s2", "runner_up_ms": 0.455,
        "error": 0.0011, "best_error": 0.0011, "candidates": 12}, ...]}

* **grid** -- ``seqlen_edges`` cut sequence lengths into bins ``[e_i, e_{i+1})`` (the last one
  unbounded): with the default edges 0-511, 512-2047, 2048-8191, 8192 and up. Each bin is timed at
  its representative length (``representative``: 256, 1024, 4096, 16384), with the batch and head
  count that keep ``tokens`` (B x S) and ``hidden`` (H x D) fixed, FlashAttention-3's grid.
* **mask** -- ``none`` (no mask, no window) or ``causal`` (any causal or windowed mask, which
  skips key blocks); the runtime derives it from the call.
* **winner** / **runner_up** -- config tags (``rules.config_tag``: ``m<BLOCK_M>n<BLOCK_N>w<warps>
  s<stages>``, ``e<waves_per_eu>`` on AMD); the margin is ``runner_up_ms / winner_ms``.
* **hidden** (optional) -- the H x D the cell was timed at when not the grid's (``tune.py --hidden``:
  the fp32 cells, whose kernels run 10-50x slower, are timed at H x D = 512, which still gives
  every cell over a thousand programs); dispatch reads only the bins.
* **error** -- the winner's max |error| against a float64 reference; a candidate whose error is
  above 3x the best candidate's (``best_error``) is never a winner (the seed's rule).
* **backends** (optional list) -- per operator where a second backend exists (the Gluon family on
  sm_90), which backend ``Auto`` should take per cell, measured through the whole operator::

    {"operator": "attn_fwd", "functional": {"dtype": "bf16", "head_dim": 64}, "mask": "causal",
     "seqlen_q_bin": 0, "seqlen_k_bin": 0, "winner": "portable", "winner_ms": 0.031,
     "runner_up": "gluon", "runner_up_ms": 0.036}

  The Gluon kernels of that operator and functional carry the cells the portable backend won
  (``portable_for``); elsewhere the documented rule decides.

    python python/tuning.py show tuning/sm_90.json
    python python/tuning.py diff old.json new.json      # what changed between two versions
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable
from typing import Any

FORMAT = 1
DEFAULT_EDGES = [0, 512, 2048, 8192]
DEFAULT_TOKENS = 16384
DEFAULT_HIDDEN = 2048
MASKS = ("none", "causal")
BACKENDS = ("gluon", "portable")
#: operator -> the Gluon families whose kernels carry its backend cells.
GLUON_FAMILIES = {"attn_fwd": ("attn_fwd_gluon",), "attn_bwd": ("attn_bwd_gluon",)}
#: The seed's rule: a candidate whose error exceeds this times the best candidate's is rejected.
ERROR_FACTOR = 3.0
#: A winner by less than this factor over a config compiled anyway gets no kernel of its own
#: (``fold_ties``): 4 %, inside the run-to-run spread of a cell on the H200 (3-6 %, README, Tuning):
#: about 64 fewer sm_90 kernels than no folding (24 fewer than at 2 %).
TIE = 1.04

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TUNING_DIR = os.path.join(REPO, "tuning")


class TuningError(ValueError):
    """A database that cannot be used, naming the file and the entry."""


def representative(edges: list[int]) -> list[int]:
    """The length each bin is timed at: half the upper edge of the first bin, twice the lower edge
    of the others (256, 1024, 4096, 16384 for the default edges)."""
    return [edges[1] // 2 if i == 0 and len(edges) > 1 else 2 * max(lo, 1) for i, lo in enumerate(edges)]


def bin_of(length: int, edges: list[int]) -> int:
    """The bin holding ``length``."""
    b = 0
    for i, e in enumerate(edges):
        if length >= e:
            b = i
    return b


def bin_range(index: int, edges: list[int]) -> list[int | None]:
    """``[lo, hi)`` of bin ``index``; hi None for the last bin."""
    return [edges[index], edges[index + 1] if index + 1 < len(edges) else None]


def functional_key(functional: dict[str, Any]) -> str:
    return json.dumps(functional, sort_keys=True, separators=(",", ":"))


def fold_ties(cells: list[dict[str, Any]], compiled: set[str]) -> list[str]:
    """The config serving each of a functional's cells (its entries): the winner, unless a config
    only wins cells whose runner-up is within ``TIE`` of it and is compiled anyway (the
    heuristic's configs ``compiled``, or the config serving other cells): then those cells take
    their runner-up and the config gets no kernel. Configs are folded one at a time, those serving
    the fewest cells first (ties by name), until none can be."""
    pick = [e["winner"] for e in cells]
    while True:
        kept = set(pick) | compiled
        def foldable(tag: str) -> bool:
            mine = [e for e, p in zip(cells, pick) if p == tag]
            return tag not in compiled and all(
                e["winner"] == tag and e.get("runner_up") in kept - {tag}
                and e["runner_up_ms"] <= e["winner_ms"] * TIE for e in mine)
        order = sorted(set(pick), key=lambda t: (pick.count(t), t))
        tag = next((t for t in order if foldable(t)), None)
        if tag is None:
            return pick
        pick = [e["runner_up"] if p == tag else p for e, p in zip(cells, pick)]


class Database:
    """A loaded, checked tuning database of one arch."""

    def __init__(self, data: dict[str, Any], source: str = "<memory>"):
        self.source = source
        self.data = data
        _check(data, source)
        self.arch: str = data["arch"]
        self.edges: list[int] = data["grid"]["seqlen_edges"]
        self.entries: list[dict[str, Any]] = data["entries"]
        self.backends: list[dict[str, Any]] = data.get("backends", [])

    def winners(self, family: str, functional: dict[str, Any],
                compiled: Iterable[str] = ()) -> dict[str, list[dict[str, Any]]]:
        """config tag -> the cells it serves for this functional: ``{"mask", "seqlen_q": [lo, hi],
        "seqlen_k": [lo, hi]}`` (hi None = unbounded), in entry order. ``compiled``: the configs the
        build compiles anyway (the heuristic's); with them, ties are folded (``fold_ties``)."""
        key = functional_key(functional)
        cells = [e for e in self.entries if e["family"] == family and functional_key(e["functional"]) == key]
        out: dict[str, list[dict[str, Any]]] = {}
        for e, tag in zip(cells, fold_ties(cells, set(compiled))):
            out.setdefault(tag, []).append({
                "mask": e["mask"],
                "seqlen_q": bin_range(e["seqlen_q_bin"], self.edges),
                "seqlen_k": bin_range(e["seqlen_k_bin"], self.edges),
            })
        return out

    def portable_cells(self, family: str, functional: dict[str, Any]) -> list[dict[str, Any]]:
        """The cells where the portable backend won over the Gluon family ``family``'s operator,
        for a Gluon functional (its ``dtype`` and ``head_dim``; other axes, such as the backward's
        ``dq``, share the operator's decision)."""
        out = []
        for e in self.backends:
            if family in GLUON_FAMILIES.get(e["operator"], ()) and e["winner"] == "portable" and all(
                    functional.get(k) == v for k, v in e["functional"].items()):
                out.append({"mask": e["mask"], "seqlen_q": bin_range(e["seqlen_q_bin"], self.edges),
                            "seqlen_k": bin_range(e["seqlen_k_bin"], self.edges)})
        return out

    def to_json(self) -> str:
        return dumps(self.data)


def _check(data: Any, source: str) -> None:
    def fail(msg):
        raise TuningError(f"{source}: {msg}")

    if not isinstance(data, dict):
        fail("not a JSON object")
    if data.get("format") != FORMAT:
        fail(f"format {data.get('format')!r}, this build reads format {FORMAT}")
    for key in ("arch", "grid", "entries"):
        if key not in data:
            fail(f"no '{key}'")
    edges = data["grid"].get("seqlen_edges")
    if not (isinstance(edges, list) and edges and edges[0] == 0 and all(isinstance(e, int) for e in edges)
            and all(a < b for a, b in zip(edges, edges[1:]))):
        fail(f"grid.seqlen_edges must be increasing integers starting at 0, got {edges!r}")
    # The two lists share the cell checks; each names its owner ("family" or "operator").
    lists = (("entry", data["entries"], "family", _entry_order), ("backends", data.get("backends", []), "operator",
                                                                  _backend_order))
    for label, rows, owner, order in lists:
        seen = set()
        for i, e in enumerate(rows):
            where = f"{label} {i}" if label == "entry" else f"{label}[{i}]"
            for key in (owner, "functional", "mask", "seqlen_q_bin", "seqlen_k_bin", "winner", "winner_ms"):
                if key not in e:
                    fail(f"{where}: no '{key}'")
            if owner == "operator":
                if e["operator"] not in GLUON_FAMILIES:
                    fail(f"{where}: operator {e['operator']!r} has one backend (known: {sorted(GLUON_FAMILIES)})")
                if e["winner"] not in BACKENDS:
                    fail(f"{where}: winner {e['winner']!r} is not one of {BACKENDS}")
            if e["mask"] not in MASKS:
                fail(f"{where}: mask {e['mask']!r} is not one of {MASKS}")
            for key in ("seqlen_q_bin", "seqlen_k_bin"):
                if not (isinstance(e[key], int) and 0 <= e[key] < len(edges)):
                    fail(f"{where}: {key} {e[key]!r} outside the {len(edges)} bins")
            if "hidden" in e and not (isinstance(e["hidden"], int) and e["hidden"] > 0):
                fail(f"{where}: hidden must be a positive integer, got {e['hidden']!r}")
            if not (isinstance(e["winner_ms"], (int, float)) and e["winner_ms"] > 0):
                fail(f"{where}: winner_ms must be a positive time, got {e['winner_ms']!r}")
            if order(e) in seen:
                fail(f"{where}: a second entry for {e[owner]} {e['functional']} {e['mask']} "
                     f"bins ({e['seqlen_q_bin']}, {e['seqlen_k_bin']})")
            seen.add(order(e))


def new(arch: str, measured_on: dict[str, str], edges: list[int] | None = None) -> dict[str, Any]:
    return {"format": FORMAT, "arch": arch, "measured_on": dict(measured_on),
            "grid": {"seqlen_edges": list(edges or DEFAULT_EDGES), "tokens": DEFAULT_TOKENS, "hidden": DEFAULT_HIDDEN},
            "entries": []}


def _entry_order(e: dict[str, Any]):
    return (e["family"], functional_key(e["functional"]), e["mask"], e["seqlen_q_bin"], e["seqlen_k_bin"])


def _backend_order(e: dict[str, Any]):
    return (e["operator"], functional_key(e["functional"]), e["mask"], e["seqlen_q_bin"], e["seqlen_k_bin"])


def dumps(data: dict[str, Any]) -> str:
    """Canonical text: entries sorted, one entry per line (so diffs are per cell)."""
    lists = {"entries": _entry_order, "backends": _backend_order}
    head = {k: v for k, v in data.items() if k not in lists}
    lines = ["{"]
    for k in sorted(head):
        lines.append(f"  {json.dumps(k)}: {json.dumps(head[k], sort_keys=True)},")
    blocks = [(name, order) for name, order in lists.items() if name == "entries" or data.get(name)]
    for b, (name, order) in enumerate(blocks):
        rows = sorted(data.get(name, []), key=order)
        lines.append(f'  "{name}": [')
        for i, e in enumerate(rows):
            lines.append("    " + json.dumps(e, sort_keys=True) + ("," if i + 1 < len(rows) else ""))
        lines.append("  ]" + ("," if b + 1 < len(blocks) else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


def load(path: str) -> Database:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise TuningError(f"{path}: {e}") from None
    return Database(data, path)


def load_arch(arch: str, tuning_dir: str | None = None) -> Database | None:
    """``tuning/<arch>.json`` if it exists (None: the arch is untuned and dispatch uses the
    heuristic); its ``arch`` must be ``arch``."""
    path = os.path.join(tuning_dir or TUNING_DIR, f"{arch}.json")
    if not os.path.exists(path):
        return None
    db = load(path)
    if db.arch != arch:
        raise TuningError(f"{path}: holds arch {db.arch!r}, expected {arch!r}")
    return db


def diff(old: Database, new_db: Database) -> list[str]:
    """One line per cell that appeared, disappeared or changed winner (with both times)."""
    def cells(db):
        return {_entry_order(e): e for e in db.entries}

    a, b = cells(old), cells(new_db)
    for db, into in ((old, a), (new_db, b)):
        for e in db.backends:
            key = _backend_order(e)
            into[("backend " + key[0],) + key[1:]] = e
    out = []
    for key in sorted(set(a) | set(b)):
        name = f"{key[0]} {key[1]} {key[2]} bins ({key[3]}, {key[4]})"
        if key not in a:
            out.append(f"+ {name}: {b[key]['winner']} {b[key]['winner_ms']:.4g} ms")
        elif key not in b:
            out.append(f"- {name}: was {a[key]['winner']} {a[key]['winner_ms']:.4g} ms")
        elif a[key]["winner"] != b[key]["winner"]:
            out.append(f"~ {name}: {a[key]['winner']} {a[key]['winner_ms']:.4g} ms -> "
                       f"{b[key]['winner']} {b[key]['winner_ms']:.4g} ms")
    if old.edges != new_db.edges:
        out.insert(0, f"! grid edges {old.edges} -> {new_db.edges}: bins are not comparable")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Show or compare tuning databases.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    show = sub.add_parser("show")
    show.add_argument("path")
    d = sub.add_parser("diff")
    d.add_argument("old")
    d.add_argument("new")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "show":
            db = load(args.path)
            print(f"{args.path}: arch {db.arch}, {len(db.entries)} cells, edges {db.edges}")
            for e in sorted(db.entries, key=_entry_order):
                margin = e.get("runner_up_ms", 0) / e["winner_ms"] if e.get("runner_up_ms") else float("nan")
                print(f"{e['family']} {functional_key(e['functional'])} {e['mask']} "
                      f"({e['seqlen_q_bin']},{e['seqlen_k_bin']}): {e['winner']} {e['winner_ms']:.4g} ms, "
                      f"margin {margin:.3f} over {e.get('runner_up', '-')}")
        else:
            lines = diff(load(args.old), load(args.new))
            print("\n".join(lines) if lines else "no cell changed")
    except TuningError as e:
        print(f"tuning: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
