"""What to compile: kernel families, functional axes, tuning configs, targets.

Pure data plus small functions; importing this module does not import Triton,
so it is cheap for build tools and tests.

Vocabulary
----------
* **family**     -- one Triton kernel function (``attn_fwd`` in ``kernels/flash/fwd.py``).
* **functional** -- one point of the functional axes (dtype, head_dim, causal): what
  the kernel computes.  Every functional is compiled for every arch.
* **config**     -- performance parameters (BLOCK_M, BLOCK_N, num_warps, num_stages);
  they change speed, never results.
* **variant**    -- ``aligned``: every pointer and Q/K/V/O stride argument carries a
  ``tt.divisibility=16`` hint (pointers 16-byte aligned, strides multiples of 16
  elements); ``generic``: no hints, correct for any layout whose last dimension
  is contiguous.

Per (functional, arch) the build compiles every config of ``PERF_CONFIGS`` as an
``aligned`` kernel plus one ``generic`` kernel (the smallest-BLOCK_M config).

Runtime choice between kernels (implemented by the Rust runtime)
----------------------------------------------------------------
1. Variant: ``aligned`` when all five pointers are 16-byte aligned and every
   Q/K/V/O stride argument is a multiple of 16; otherwise ``generic``. The
   runtime checks each kernel's recorded hints against the real values.
2. Config among the ``aligned`` kernels: use the largest BLOCK_M whose grid
   ``cdiv(Sq, BLOCK_M) * H * B`` fills every SM (CU on AMD) at least once;
   otherwise (small problems) the smallest BLOCK_M.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

# --------------------------------------------------------------------------
# Targets
# --------------------------------------------------------------------------

#: AOTRITON_TARGET_ARCH name -> (backend, arch, warp_size), the GPUTarget fields.
TARGETS: dict[str, tuple[str, int | str, int]] = {
    "sm_90": ("cuda", 90, 32),
    "sm_80": ("cuda", 80, 32),
    "gfx942": ("hip", "gfx942", 64),
    "gfx90a": ("hip", "gfx90a", 64),
}

#: GPU image file extension per backend.
IMAGE_EXT = {"cuda": "cubin", "hip": "hsaco"}


class UnknownArchError(ValueError):
    pass


def target_of(arch: str) -> tuple[str, int | str, int]:
    """``(backend, arch, warp_size)`` for an arch name, or UnknownArchError listing the known ones."""
    try:
        return TARGETS[arch]
    except KeyError:
        raise UnknownArchError(
            f"unknown target arch {arch!r}; known: {', '.join(sorted(TARGETS))}") from None


def parse_arch_list(text: str) -> list[str]:
    """``"sm_90;sm_80"`` (``;`` or ``,`` separated, as in AOTRITON_TARGET_ARCH) -> validated names."""
    archs = [a.strip() for a in text.replace(",", ";").split(";") if a.strip()]
    if not archs:
        raise UnknownArchError(f"no target arch given; known: {', '.join(sorted(TARGETS))}")
    for a in archs:
        target_of(a)
    return list(dict.fromkeys(archs))  # de-duplicate, keep order


# --------------------------------------------------------------------------
# attn_fwd: functional axes
# --------------------------------------------------------------------------

DTYPES = ["fp16", "bf16"]
#: Head dimensions compiled.  Adding one here is all it takes to ship it
#: (it must be a power of two; give it configs in _attn_fwd_configs if the
#: defaults do not fit).
HEAD_DIMS = [64, 128]
CAUSAL = [False, True]

ATTN_FWD_ARGS = [
    "Q", "K", "V", "O", "LSE", "sm_scale",
    "stride_qz", "stride_qh", "stride_qm",
    "stride_kz", "stride_kh", "stride_kn",
    "stride_vz", "stride_vh", "stride_vn",
    "stride_oz", "stride_oh", "stride_om",
    "stride_lz", "stride_lh",
    "N_CTX_Q", "N_CTX_K",
    "HEAD_DIM", "BLOCK_M", "BLOCK_N", "CAUSAL",
]
ATTN_FWD_CONSTEXPRS = ["HEAD_DIM", "BLOCK_M", "BLOCK_N", "CAUSAL"]


def attn_fwd_signature(functional: dict[str, Any]) -> dict[str, str]:
    """Triton signature (argument name -> type) of ``attn_fwd`` for one functional, in ABI order."""
    ptr = f"*{functional['dtype']}"
    sig = {}
    for name in ATTN_FWD_ARGS:
        if name in ("Q", "K", "V", "O"):
            sig[name] = ptr
        elif name == "LSE":
            sig[name] = "*fp32"
        elif name == "sm_scale":
            sig[name] = "fp32"
        elif name in ("stride_qm", "stride_kn", "stride_vn", "stride_om"):
            sig[name] = "i32"  # row strides: the runtime guarantees row * stride fits in int32
        elif name.startswith("stride_"):
            sig[name] = "i64"  # batch / head strides may exceed 2**31
        elif name in ("N_CTX_Q", "N_CTX_K"):
            sig[name] = "i32"
        else:
            assert name in ATTN_FWD_CONSTEXPRS, name
            sig[name] = "constexpr"
    return sig


def _attn_fwd_configs(arch: str, functional: dict[str, Any]) -> list[dict[str, int]]:
    """Performance configs per (functional, arch), largest BLOCK_M first.

    Not measured per arch except sm_90 hd128 (probe on H200: BLOCK_M 128,
    BLOCK_N 64, 4 warps, 2 stages was the best of 24 configs for bf16).
    The tuning database will replace these picks.
    """
    hd = functional["head_dim"]
    backend = TARGETS[arch][0]

    def cfg(bm, bn, w, s):
        return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s}

    if backend == "cuda":
        stages = 3 if hd <= 64 else 2
        if arch == "sm_80" and hd > 64:
            main = cfg(128, 64, 8, stages)  # A100: 8 warps keep the 128x128 fp32 accumulator in registers
        else:
            main = cfg(128, 64, 4, stages)
        small = cfg(64, 64, 4, stages)
        return [main, small]
    # AMD (wave64): the LDS is 64 KiB, so one K/V stage (num_stages 1) for
    # hd128 and two for hd64; 4 waves of 64 lanes per block.
    stages = 2 if hd <= 64 else 1
    return [cfg(128, 64, 4, stages), cfg(64, 64, 4, stages)]


# --------------------------------------------------------------------------
# Kernel families
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    module: str                     #: source file, relative to python/
    function: str                   #: @triton.jit function in it
    axes: dict[str, list]           #: functional axes, in id order
    args: list[str]                 #: every argument, in declaration order
    constexprs: list[str]
    signature: Any                  #: functional -> {arg: type}
    configs: Any                    #: (arch, functional) -> [config], largest BLOCK_M first
    hinted_args: list[str]          #: args that get tt.divisibility=16 in the aligned variant


ATTN_FWD = Family(
    name="attn_fwd",
    module="kernels/flash/fwd.py",
    function="attn_fwd",
    axes={"dtype": DTYPES, "head_dim": HEAD_DIMS, "causal": CAUSAL},
    args=ATTN_FWD_ARGS,
    constexprs=ATTN_FWD_CONSTEXPRS,
    signature=attn_fwd_signature,
    configs=_attn_fwd_configs,
    # LSE strides are not hinted: its rows are written once per program (no vector width to
    # gain), and a hint would send every odd Sq (contiguous LSE has stride_lh = Sq) to `generic`.
    hinted_args=["Q", "K", "V", "O", "LSE"]
    + [a for a in ATTN_FWD_ARGS if a.startswith("stride_") and not a.startswith("stride_l")],
)

FAMILIES = [ATTN_FWD]

DIVISIBILITY = 16


def functionals(family: Family) -> list[dict[str, Any]]:
    """Cartesian product of the family's axes, in axis order."""
    out = [{}]
    for axis, values in family.axes.items():
        out = [{**f, axis: v} for f in out for v in values]
    return out


def module_name(family: Family) -> str:
    """Importable module name of the family's source (``kernels.flash.fwd``), with python/ on sys.path."""
    assert family.module.endswith(".py")
    return family.module[:-3].replace("/", ".")


# --------------------------------------------------------------------------
# Kernel specs
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """Everything needed to compile one kernel and to describe it to the runtime."""
    id: str
    family: str
    module: str
    function: str
    functional: dict[str, Any]
    config: dict[str, int]
    variant: str                                #: "aligned" | "generic"
    arch: str
    target: dict[str, Any]                      #: {"backend", "arch", "warp_size"}
    signature: dict[str, str]                   #: every argument -> type ("constexpr" for constexprs)
    constexprs: dict[str, Any]
    divisibility: dict[str, int]                #: runtime argument -> 16 or 1

    @property
    def args(self) -> list[dict[str, Any]]:
        """Non-constexpr arguments in launch (ABI) order, as in the per-kernel JSON."""
        return [{"name": n, "type": t, "divisibility": self.divisibility[n]}
                for n, t in self.signature.items() if t != "constexpr"]

    @property
    def attrs(self) -> dict[tuple[int, ...], list[list]]:
        """``ASTSource`` attrs: ``{(arg index,): [["tt.divisibility", 16]]}`` for hinted arguments."""
        names = list(self.signature)
        return {(names.index(n),): [["tt.divisibility", d]]
                for n, d in self.divisibility.items() if d != 1}

    @property
    def options(self) -> dict[str, int]:
        """Options for ``backend.parse_options``."""
        return {"num_warps": self.config["num_warps"], "num_stages": self.config["num_stages"]}

    @property
    def image_ext(self) -> str:
        return IMAGE_EXT[self.target["backend"]]

    def to_json(self) -> dict[str, Any]:
        """Canonical dict of everything that determines the compiled image (used for the cache key)."""
        return {
            "id": self.id, "family": self.family, "module": self.module, "function": self.function,
            "signature": self.signature, "constexprs": self.constexprs,
            "attrs": [[list(k), v] for k, v in sorted(self.attrs.items())],
            "target": self.target, "options": self.options,
        }

    def canonical(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))


def kernel_id(family: Family, functional: dict[str, Any], config: dict[str, int], variant: str) -> str:
    """Stable, unique, file-name safe id: ``attn_fwd-fp16-hd64-causal0-m128n64w4s2-aligned``."""
    parts = [family.name]
    for axis in family.axes:
        v = functional[axis]
        if axis == "dtype":
            parts.append(str(v))
        elif axis == "head_dim":
            parts.append(f"hd{v}")
        elif isinstance(v, bool):
            parts.append(f"{axis}{int(v)}")
        else:
            parts.append(f"{axis}{v}")
    parts.append(f"m{config['BLOCK_M']}n{config['BLOCK_N']}w{config['num_warps']}s{config['num_stages']}")
    parts.append(variant)
    return "-".join(parts)


def _spec(family: Family, arch: str, functional: dict[str, Any], config: dict[str, int], variant: str) -> KernelSpec:
    backend, target_arch, warp_size = target_of(arch)
    signature = family.signature(functional)
    constexprs = {"HEAD_DIM": functional["head_dim"], "BLOCK_M": config["BLOCK_M"],
                  "BLOCK_N": config["BLOCK_N"], "CAUSAL": bool(functional["causal"])}
    assert list(constexprs) == family.constexprs
    hinted = set(family.hinted_args) if variant == "aligned" else set()
    divisibility = {n: (DIVISIBILITY if n in hinted else 1) for n, t in signature.items() if t != "constexpr"}
    return KernelSpec(
        id=kernel_id(family, functional, config, variant),
        family=family.name, module=family.module, function=family.function,
        functional=dict(functional), config=dict(config), variant=variant, arch=arch,
        target={"backend": backend, "arch": target_arch, "warp_size": warp_size},
        signature=signature, constexprs=constexprs, divisibility=divisibility,
    )


def enumerate_kernels(arch: str, families: list[Family] | None = None) -> list[KernelSpec]:
    """Every kernel to compile for ``arch``, sorted by id (ids are unique)."""
    target_of(arch)
    specs = []
    for family in families or FAMILIES:
        for functional in functionals(family):
            configs = family.configs(arch, functional)
            for config in configs:
                specs.append(_spec(family, arch, functional, config, "aligned"))
            smallest = min(configs, key=lambda c: (c["BLOCK_M"], c["BLOCK_N"]))
            specs.append(_spec(family, arch, functional, smallest, "generic"))
    specs.sort(key=lambda s: s.id)
    ids = [s.id for s in specs]
    if len(set(ids)) != len(ids):
        raise AssertionError(f"duplicate kernel ids for {arch}")
    return specs
