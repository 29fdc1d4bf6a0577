"""Ahead-of-time compile every kernel of rules.py into GPU images.

    python -B python/compile.py --arch "sm_90;gfx942" --out build/kernels --cache build/kernel-cache \
        [--jobs N] [--timeout SECONDS] [--only SUB[+SUB...][,SUB...]] [--tuning-dir DIR] [--for-tuning]

For each arch, ``<out>/<arch>/`` receives per kernel ``<id>.cubin`` (CUDA) or
``<id>.hsaco`` (AMD) plus ``<id>.json`` (the launch contract read by the Rust
packer), and ``manifest.json`` listing exactly the current kernels.  Files of
kernels no longer enumerated are removed.  The manifest (with a digest over every
kernel's image and JSON, so it changes whenever a kernel does) is written last and
only when its bytes change, so build tools can depend on its timestamp.  With
``--only`` (kernels whose id contains any of the comma-separated substrings; ``a+b``: both) the output reflects
just the selected kernels.

Compiles run in parallel worker processes through ``triton.compile`` (not
``triton/tools/compile.py``, which needs a live GPU driver).  Each result is
stored in a content-addressed cache keyed by sha256 over the text of every .py
under python/kernels/, the Triton version and the kernel spec (signature,
constexprs, attrs, target, options): an unchanged rebuild compiles nothing,
spawns no worker, does not import Triton and rewrites no file.

Every kernel (compiled or cached) is checked before anything is written: its
``shared`` memory must fit its arch's limit (``rules.SHARED_MEMORY_LIMIT``, the LDS
per workgroup on AMD), and an AMD kernel must need no scratch memory (no spilled
VGPRs, no dynamic stack; read from the code object's ``amdhsa`` metadata).

The tuning database of each arch (``tuning/<arch>.json``, ``--tuning-dir``; python/tuning.py)
adds the configs it names to their functionals, each kernel's JSON listing the cells it won
(``tuned_for``). ``--for-tuning`` builds every candidate config for the tuner (python/tune.py):
there a candidate that does not fit its arch is dropped (listed) instead of failing the build.

Exit status: 0 on success; 1 when a kernel fails, exceeds the per-kernel
timeout or does not fit its arch (the message names the kernel and arch); 2 on
bad arguments.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.metadata
import json
import multiprocessing
import multiprocessing.connection
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

PYTHON_DIR = os.path.dirname(os.path.abspath(__file__))
KERNELS_DIR = os.path.join(PYTHON_DIR, "kernels")
if PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)

import rules  # noqa: E402  (cheap: no Triton import)
import tuning  # noqa: E402

#: Bump when the cache entry format or the way options are derived changes.
CACHE_FORMAT = 1
#: Metadata fields copied from ``ccinfo.metadata`` into the per-kernel JSON, with defaults for
#: backends that do not report them (HIP metadata in Triton 3.6 may lack the scratch keys).
METADATA_FIELDS = {
    "name": None, "shared": 0, "num_warps": None, "num_ctas": 1,
    "global_scratch_size": 0, "global_scratch_align": 1,
    "profile_scratch_size": 0, "profile_scratch_align": 1,
}
DEFAULT_TIMEOUT_S = 600.0
#: Resource usage read from an AMD kernel's code object text (``ccinfo.asm["amdgcn"]``, the
#: ``amdhsa.kernels`` metadata and the ``.amdhsa_kernel`` descriptor): key -> regular expression.
AMDGPU_RESOURCES = {
    "scratch": r"^[\s-]*\.private_segment_fixed_size:\s+(\d+)",    # bytes of scratch per work-item
    "dynamic_stack": r"^[\s-]*\.amdhsa_uses_dynamic_stack\s+(\d+)",
    "vgpr": r"^[\s-]*\.vgpr_count:\s+(\d+)",
    "agpr": r"^[\s-]*\.agpr_count:\s+(\d+)",
    "sgpr": r"^[\s-]*\.sgpr_count:\s+(\d+)",
    "vgpr_spill": r"^[\s-]*\.vgpr_spill_count:\s+(\d+)",
    "sgpr_spill": r"^[\s-]*\.sgpr_spill_count:\s+(\d+)",     # into VGPR lanes, not scratch
}


class BuildError(RuntimeError):
    """A kernel failed to compile or timed out; the message names it."""


# --------------------------------------------------------------------------
# Cache keys and file helpers
# --------------------------------------------------------------------------

def triton_version() -> str:
    """Installed Triton version, read without importing Triton."""
    return importlib.metadata.version("triton")


def kernel_sources_digest(kernels_dir: str = KERNELS_DIR, packages: tuple[str, ...] | None = None) -> str:
    """sha256 over the relative path and text of every .py under kernels/, in sorted order.

    With ``packages``, only the files directly in ``kernels/`` and under those packages count
    (a family's ``sources``): editing one backend's kernels leaves the other's cache valid.
    """
    h = hashlib.sha256()
    paths = []
    for root, dirs, files in os.walk(kernels_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        if packages is not None and root == kernels_dir:
            dirs[:] = [d for d in dirs if d in packages]
        paths += [os.path.join(root, f) for f in files if f.endswith(".py")]
    for path in sorted(paths):
        rel = os.path.relpath(path, kernels_dir).replace(os.sep, "/")
        with open(path, "rb") as f:
            data = f.read()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def cache_key(spec: rules.KernelSpec, sources_digest: str, version: str) -> str:
    h = hashlib.sha256()
    h.update(f"aotriton-cache-v{CACHE_FORMAT}\0triton={version}\0sources={sources_digest}\0".encode())
    h.update(spec.canonical().encode())
    return h.hexdigest()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_atomic(path: str, data: bytes) -> None:
    """Write via a temp file in the same directory and rename, so readers never see a partial file."""
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix="-" + os.path.basename(path))
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp creates 0600; give the usual file mode
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _write_if_changed(path: str, data: bytes) -> bool:
    """Write ``data`` atomically unless the file already holds exactly these bytes."""
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return False
    except FileNotFoundError:
        pass
    _write_atomic(path, data)
    return True


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


class Cache:
    """Content-addressed store: ``<root>/<key[:2]>/<key>.img`` (the image) and ``<key>.json`` (metadata)."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)

    def _paths(self, key: str) -> tuple[str, str]:
        d = os.path.join(self.root, key[:2])
        return os.path.join(d, key + ".img"), os.path.join(d, key + ".json")

    def get(self, key: str) -> tuple[bytes, dict] | None:
        img_path, meta_path = self._paths(key)
        try:
            with open(meta_path, "rb") as f:
                meta = json.loads(f.read())
            with open(img_path, "rb") as f:
                image = f.read()
        except (FileNotFoundError, ValueError):
            return None
        if hashlib.sha256(image).hexdigest() != meta.get("image_sha256"):
            return None  # torn or corrupted entry: recompile
        return image, meta["metadata"]

    def put(self, key: str, image: bytes, metadata: dict) -> None:
        img_path, meta_path = self._paths(key)
        os.makedirs(os.path.dirname(img_path), exist_ok=True)
        _write_atomic(img_path, image)  # image first: the metadata file marks the entry complete
        _write_atomic(meta_path, _json_bytes({"image_sha256": hashlib.sha256(image).hexdigest(),
                                              "metadata": metadata}))


# --------------------------------------------------------------------------
# Worker side
# --------------------------------------------------------------------------

def _setup_triton_env(triton_home: str) -> None:
    """Environment for a reproducible compile; must run before Triton is imported."""
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"   # no build paths in the images
    os.environ["TRITON_DEFAULT_FP_FUSION"] = "1"
    os.environ["TRITON_HOME"] = triton_home         # keep the user's ~/.triton untouched
    os.environ["TRITON_CACHE_DIR"] = os.path.join(triton_home, "cache")
    os.environ.pop("TRITON_INTERPRET", None)


def amdgpu_resources(amdgcn: str) -> dict[str, int]:
    """Scratch, dynamic stack, register and spill counts of the one kernel in an AMD code object's text."""
    out = {}
    for key, pattern in AMDGPU_RESOURCES.items():
        found = re.findall(pattern, amdgcn, flags=re.MULTILINE)
        if len(found) != 1:
            raise BuildError(f"amdgcn text has {len(found)} matches for {key!r} (expected one kernel)")
        out[key] = int(found[0])
    return out


def compile_spec(spec: rules.KernelSpec) -> tuple[bytes, dict]:
    """Compile one kernel in this process; returns ``(image bytes, metadata subset)``."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    fn = getattr(importlib.import_module(rules.module_name(rules.family(spec.family))), spec.function)
    t = spec.target
    target = GPUTarget(t["backend"], t["arch"], t["warp_size"])
    backend = make_backend(target)
    options = backend.parse_options(dict(spec.options))
    if spec.language == "gluon":
        from triton.experimental.gluon._runtime import GluonASTSource
        src = GluonASTSource(fn=fn, signature=dict(spec.signature), constexprs=dict(spec.constexprs),
                             attrs=spec.attrs)
    else:
        src = ASTSource(fn=fn, signature=dict(spec.signature), constexprs=dict(spec.constexprs), attrs=spec.attrs)
    ccinfo = triton.compile(src, target=target, options=options.__dict__)
    image = ccinfo.asm[backend.binary_ext]
    md = ccinfo.metadata._asdict()
    metadata = {}
    for field, default in METADATA_FIELDS.items():
        value = md.get(field, default)
        if value is None:
            raise BuildError(f"compiled metadata lacks {field!r}")
        metadata[field] = value
    metadata["warp_size"] = md.get("warp_size", t["warp_size"])
    # Host-side TMA descriptors: Triton reports one entry per descriptor argument, in order.
    metadata["tensordesc_meta"] = [dict(m) for m in (md.get("tensordesc_meta") or [])]
    if t["backend"] == "hip":  # for check_kernel: register spills show as scratch
        metadata["amdgpu"] = amdgpu_resources(ccinfo.asm["amdgcn"])
    return bytes(image), metadata


def check_kernel(spec: rules.KernelSpec, metadata: dict) -> str | None:
    """Why a compiled kernel cannot ship (None if it can): shared memory above its arch's limit, or
    (AMD) scratch memory, i.e. registers spilled (or a dynamic stack)."""
    limit = rules.SHARED_MEMORY_LIMIT[spec.arch]
    problems = []
    if metadata["shared"] > limit:
        problems.append(f"uses {metadata['shared']} bytes of shared memory (LDS), above the {limit}-byte limit "
                        f"of {spec.arch}")
    amd = metadata.get("amdgpu")
    if amd is not None and (amd["scratch"] or amd["dynamic_stack"] or amd["vgpr_spill"]):
        problems.append(f"needs scratch memory ({amd['scratch']} bytes per work-item, {amd['vgpr_spill']} VGPRs "
                        f"spilled, dynamic stack {amd['dynamic_stack']}; {amd['vgpr']} VGPRs, {amd['agpr']} AGPRs, "
                        f"waves_per_eu {spec.config.get('waves_per_eu', 0)})")
    if not problems:
        return None
    return (f"{spec.id} ({spec.arch}): " + "; ".join(problems)
            + ": give it smaller blocks (or, for spills, a lower waves_per_eu) in rules.py")


def _worker_main(conn, triton_home: str) -> None:
    """Worker loop: receive a spec, compile it, send back ``(ok, payload, seconds)``."""
    _setup_triton_env(triton_home)
    try:
        while True:
            try:
                spec = conn.recv()
            except EOFError:
                return
            if spec is None:
                return
            t0 = time.monotonic()
            try:
                image, metadata = compile_spec(spec)
                conn.send((True, (image, metadata), time.monotonic() - t0))
            except BaseException as e:  # noqa: BLE001 -- report every failure to the parent
                msg = "".join(traceback.format_exception_only(type(e), e)).strip()
                conn.send((False, f"{msg}\n{traceback.format_exc()}", time.monotonic() - t0))
    except KeyboardInterrupt:
        return


class WorkerPool:
    """Long-lived compile workers (spawned lazily) with a per-task deadline."""

    def __init__(self, jobs: int, timeout: float, triton_home: str):
        self.jobs = max(1, jobs)
        self.timeout = timeout
        self.triton_home = triton_home
        self.ctx = multiprocessing.get_context("spawn")
        self.workers: list[tuple[Any, Any]] = []  # (process, parent connection)

    def _start_worker(self):
        parent, child = self.ctx.Pipe()
        p = self.ctx.Process(target=_worker_main, args=(child, self.triton_home), daemon=True)
        p.start()
        child.close()
        self.workers.append((p, parent))
        return p, parent

    def run(self, tasks: list[Any], on_done: Callable[[Any, bool, Any, float], None]) -> None:
        """Compile ``tasks`` (specs); ``on_done(spec, ok, payload, seconds)`` per finished task.

        Raises BuildError naming the kernel when a compile exceeds the timeout or
        a worker dies; compile errors are passed to ``on_done`` with ``ok=False``.
        """
        pending = list(reversed(tasks))
        while len(self.workers) < min(self.jobs, len(tasks)):
            self._start_worker()
        busy: dict[Any, tuple[Any, float, Any]] = {}  # conn -> (spec, deadline, process)
        idle = [w for w in self.workers]
        while pending or busy:
            while pending and idle:
                p, conn = idle.pop()
                spec = pending.pop()
                conn.send(spec)
                busy[conn] = (spec, time.monotonic() + self.timeout, p)
            next_deadline = min(d for _, d, _ in busy.values())
            ready = multiprocessing.connection.wait(list(busy), timeout=max(0.0, next_deadline - time.monotonic()))
            for conn in ready:
                spec, _, p = busy.pop(conn)
                try:
                    ok, payload, seconds = conn.recv()
                except (EOFError, OSError):
                    p.join(1)
                    raise BuildError(f"{spec.id} ({spec.arch}): compile worker died (exit code {p.exitcode})")
                idle.append((p, conn))
                on_done(spec, ok, payload, seconds)
            now = time.monotonic()
            for conn, (spec, deadline, p) in list(busy.items()):
                if now >= deadline:
                    p.kill()  # the hung compile: end this worker (started by us) by its own handle
                    p.join()
                    raise BuildError(f"{spec.id} ({spec.arch}): compile timed out after {self.timeout:g} s")

    def close(self) -> None:
        for p, conn in self.workers:
            if p.is_alive():
                try:
                    conn.send(None)
                except (BrokenPipeError, OSError):
                    pass
        deadline = time.monotonic() + 5
        for p, conn in self.workers:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()  # a hung compile: end this worker (we started it) by its own handle
                p.join()
            conn.close()
        self.workers = []


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------

@dataclasses.dataclass
class ArchStats:
    arch: str
    kernels: int
    compiled: int
    cached: int
    seconds: float

    def summary(self) -> str:
        return (f"{self.arch}: {self.kernels} kernels, {self.compiled} compiled, {self.cached} cached, "
                f"{self.seconds:.1f} s")


#: The fields of Triton's ``tensordesc_meta`` the runtime needs to encode a CUtensorMap.
TENSORDESC_FIELDS = ("block_size", "swizzle", "elem_type", "elem_size", "fp4_padded")


def _args_with_tensordesc(spec: rules.KernelSpec, metadata: dict) -> list[dict[str, Any]]:
    """``spec.args`` with each tensor-descriptor argument given its TMA box meta (``tensordesc``)."""
    metas = list(metadata.get("tensordesc_meta") or [])
    args = []
    for arg in spec.args:
        arg = dict(arg)
        if arg["type"].startswith("tensordesc"):
            if not metas:
                raise BuildError(f"{spec.id}: Triton reported no tensordesc_meta for {arg['name']}")
            meta = metas.pop(0)
            arg["tensordesc"] = {k: meta[k] for k in TENSORDESC_FIELDS}
        args.append(arg)
    if metas:
        raise BuildError(f"{spec.id}: {len(metas)} tensordesc_meta entries without a descriptor argument")
    return args


def kernel_json(spec: rules.KernelSpec, metadata: dict, version: str) -> dict:
    """The per-kernel JSON: the contract with the Rust packer."""
    return {
        "id": spec.id,
        "family": spec.family,
        "functional": spec.functional,
        "config": spec.config,
        "variant": spec.variant,
        "arch": spec.arch,
        "triton_version": version,
        "symbol": metadata["name"],
        "image": f"{spec.id}.{spec.image_ext}",
        "args": _args_with_tensordesc(spec, metadata),
        "constexprs": spec.constexprs,
        "shared": metadata["shared"],
        "num_warps": metadata["num_warps"],
        "warp_size": metadata["warp_size"],
        "num_ctas": metadata["num_ctas"],
        "global_scratch_size": metadata["global_scratch_size"],
        "global_scratch_align": metadata["global_scratch_align"],
        "profile_scratch_size": metadata["profile_scratch_size"],
        "profile_scratch_align": metadata["profile_scratch_align"],
        **({"tuned_for": list(spec.tuned_for)} if spec.tuned_for else {}),
        **({"tuned_only": True} if spec.tuned_only else {}),
        **({"portable_for": list(spec.portable_for)} if spec.portable_for else {}),
    }


def _candidate_only(spec: rules.KernelSpec) -> list[dict]:
    """The configs a tuning build adds for ``spec``'s functional beyond what a normal build ships
    (its heuristic configs and the database's winners are never dropped)."""
    fam = rules.family(spec.family)
    if fam.candidates is None:
        return []
    shipped = fam.configs(spec.arch, spec.functional)
    return [c for c in fam.candidates(spec.arch, spec.functional) if c not in shipped]


def _write_arch_output(arch: str, specs: list[rules.KernelSpec], results: dict[str, tuple[bytes, dict]],
                       out_dir: str, version: str) -> None:
    arch_dir = os.path.join(out_dir, arch)
    os.makedirs(arch_dir, exist_ok=True)
    expected = {"manifest.json"}
    json_names = []
    content = hashlib.sha256()
    for spec in specs:
        image, metadata = results[spec.id]
        info = kernel_json(spec, metadata, version)
        info_bytes = _json_bytes(info)
        _write_if_changed(os.path.join(arch_dir, info["image"]), image)
        _write_if_changed(os.path.join(arch_dir, f"{spec.id}.json"), info_bytes)
        for part in (spec.id.encode(), info_bytes, image):
            content.update(len(part).to_bytes(8, "little"))
            content.update(part)
        expected |= {info["image"], f"{spec.id}.json"}
        json_names.append(f"{spec.id}.json")
    for name in sorted(os.listdir(arch_dir)):  # stale kernels (and leftovers of interrupted writes)
        path = os.path.join(arch_dir, name)
        if name not in expected and (os.path.isfile(path) or os.path.islink(path)):
            os.unlink(path)
    backend, target_arch, warp_size = rules.target_of(arch)
    manifest = {"arch": arch, "triton_version": version,
                "target": {"backend": backend, "arch": target_arch, "warp_size": warp_size},
                "kernels": sorted(json_names),
                # Changes whenever any kernel's image or metadata does (a kernel can change under
                # the same id): build tools watching the manifest then repack.
                "digest": content.hexdigest()}
    _write_if_changed(os.path.join(arch_dir, "manifest.json"), _json_bytes(manifest))


def selected(kernel_id: str, only: str) -> bool:
    """``--only``: comma-separated alternatives, each one or more substrings joined by ``+`` that
    must all occur in the id (``-fp32-+-drop0-bias0-`` = the fp32 kernels without dropout or bias)."""
    alternatives = [[t for t in part.split("+") if t] for part in only.split(",")]
    return any(terms and all(t in kernel_id for t in terms) for terms in alternatives)


def build(archs: list[str], out_dir: str, cache_dir: str, jobs: int | None = None,
          timeout: float = DEFAULT_TIMEOUT_S, only: str | None = None,
          log: Callable[[str], None] = print, tuning_dir: str | None = None,
          for_tuning: bool = False) -> list[ArchStats]:
    """Compile (or take from the cache) every kernel for ``archs``; returns per-arch stats.

    Raises BuildError (naming kernel and arch) on a failed or timed-out compile,
    rules.UnknownArchError on an unknown arch, ValueError when ``only`` selects nothing.
    """
    for arch in archs:
        rules.target_of(arch)
    jobs = jobs or os.cpu_count() or 1
    version = triton_version()
    digests: dict[tuple[str, ...], str] = {}

    def digest_of(spec: rules.KernelSpec) -> str:
        if spec.sources not in digests:
            digests[spec.sources] = kernel_sources_digest(packages=spec.sources)
        return digests[spec.sources]

    cache = Cache(cache_dir)
    pool: WorkerPool | None = None
    tmp_home: str | None = None
    stats = []
    try:
        for arch in archs:
            t0 = time.monotonic()
            db = tuning.load_arch(arch, tuning_dir)
            if db is not None:
                log(f"{arch}: tuning database {db.source} ({len(db.entries)} cells)")
            specs = rules.enumerate_kernels(arch, tuning=db, for_tuning=for_tuning)
            if any((only or "").split(",")):  # "," (no alternative) selects everything
                specs = [s for s in specs if selected(s.id, only)]
                if not specs:
                    raise ValueError(f"--only {only!r} selects no kernel for {arch}")
            keys = {s.id: cache_key(s, digest_of(s), version) for s in specs}
            results: dict[str, tuple[bytes, dict]] = {}
            todo = []
            for spec in specs:
                hit = cache.get(keys[spec.id])
                if hit is None or (spec.target["backend"] == "hip" and "amdgpu" not in hit[1]):
                    todo.append(spec)  # (an AMD entry without its resource usage: recompile to check it)
                else:
                    results[spec.id] = hit
            failures: list[str] = []
            if todo:
                if pool is None:
                    os.makedirs(cache.root, exist_ok=True)
                    tmp_home = tempfile.mkdtemp(prefix="triton-home-", dir=cache.root)
                    pool = WorkerPool(jobs, timeout, tmp_home)
                done = [0]
                width = len(str(len(todo)))

                def on_done(spec, ok, payload, seconds):
                    done[0] += 1
                    if not ok:
                        failures.append(f"{spec.id} ({spec.arch}): compile failed:\n{payload}")
                        log(f"[{done[0]:>{width}}/{len(todo)}] FAILED   {spec.id} {spec.arch} {seconds:.1f}s")
                        return
                    image, metadata = payload
                    cache.put(keys[spec.id], image, metadata)
                    results[spec.id] = (image, metadata)
                    log(f"[{done[0]:>{width}}/{len(todo)}] compiled {spec.id} {spec.arch} {seconds:.1f}s")

                pool.run(todo, on_done)
            misfits = [(s, why) for s, why in ((s, check_kernel(s, results[s.id][1])) for s in specs
                                                if s.id in results) if why]
            if for_tuning:  # a candidate that does not fit is not a candidate
                dropped = {s.id for s, _ in misfits if s.config in _candidate_only(s)}
                for s, why in misfits:
                    if s.id in dropped:
                        log(f"dropped candidate: {why}")
                specs = [s for s in specs if s.id not in dropped]
                misfits = [(s, why) for s, why in misfits if s.id not in dropped]
            failures += [why for _, why in misfits]
            if failures:
                raise BuildError("\n".join(failures))
            _write_arch_output(arch, specs, results, out_dir, version)
            st = ArchStats(arch, len(specs), len(todo), len(specs) - len(todo), time.monotonic() - t0)
            log(st.summary())
            stats.append(st)
    finally:
        if pool is not None:
            pool.close()
        if tmp_home is not None:
            shutil.rmtree(tmp_home, ignore_errors=True)
    return stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", required=True,
                    help=f"';'-separated target archs (AOTRITON_TARGET_ARCH), known: {', '.join(sorted(rules.TARGETS))}")
    ap.add_argument("--out", required=True, help="output directory (one subdirectory per arch)")
    ap.add_argument("--cache", required=True, help="content-addressed compile cache directory")
    ap.add_argument("--jobs", type=int, default=None, help="parallel compile processes (default: CPU count)")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                    help=f"per-kernel compile timeout in seconds (default {DEFAULT_TIMEOUT_S:g})")
    ap.add_argument("--only", default=None,
                    help="compile only kernels whose id contains SUBSTRING (comma-separated: any of them; "
                         "SUB+SUB: all of them)")
    ap.add_argument("--tuning-dir", default=None,
                    help=f"where <arch>.json tuning databases are read (default {tuning.TUNING_DIR})")
    ap.add_argument("--for-tuning", action="store_true",
                    help="also compile every tuning candidate (for python/tune.py)")
    args = ap.parse_args(argv)
    try:
        archs = rules.parse_arch_list(args.arch)
    except rules.UnknownArchError as e:
        ap.error(str(e))
    if args.jobs is not None and args.jobs < 1:
        ap.error("--jobs must be >= 1")
    try:
        build(archs, args.out, args.cache, jobs=args.jobs, timeout=args.timeout, only=args.only,
              log=lambda line: print(line, flush=True), tuning_dir=args.tuning_dir, for_tuning=args.for_tuning)
    except (BuildError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr, flush=True)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
