"""Builds the aotriton PyTorch extension (``aotriton._C``) against an installed aotriton.

    AOTRITON_PREFIX=/path/to/install pip install --no-build-isolation ./bindings/torch
    AOTRITON_PREFIX=/path/to/install python bindings/torch/setup.py build_ext --inplace

The prefix holds ``include/aotriton/flash.h`` and ``lib/libaotriton.so`` (linked with an rpath to
``<prefix>/lib``; ``AOTRITON_STATIC=1`` links ``lib/libaotriton.a`` instead). CUDA headers come
from ``CUDA_HOME``/``CUDA_PATH``, ``/usr/local/cuda``, ``nvcc`` on ``PATH``, or the NVIDIA wheels
torch depends on; no CUDA compiler is needed (the extension is plain C++).
``build.py`` wraps this with a ``--prefix`` option.
"""
import glob
import os
import shutil
import site
import sys

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))


def aotriton_prefix():
    prefix = os.environ.get("AOTRITON_PREFIX")
    if not prefix:
        default = os.path.join(HERE, "..", "..", ".stage", "install")
        prefix = default if os.path.isdir(default) else os.path.join(HERE, "..", "..", "install")
    prefix = os.path.abspath(prefix)
    header = os.path.join(prefix, "include", "aotriton", "flash.h")
    if not os.path.isfile(header):
        sys.exit(f"aotriton setup: no {header}; set AOTRITON_PREFIX to an installed aotriton (ninja install)")
    return prefix


def _has_cuda_headers(inc):
    return all(os.path.isfile(os.path.join(inc, f)) for f in ("cuda_runtime_api.h", "cuda_runtime.h", "crt/host_config.h"))


def cuda_include_dirs():
    """Directories holding the CUDA runtime headers (the c10/cuda headers include them)."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    candidates = []
    for root in roots:
        if root:
            candidates += [os.path.join(root, "include"), os.path.join(root, "targets", "x86_64-linux", "include")]
    # The CUDA wheels torch depends on (nvidia/cu13/include, nvidia/cuda_runtime/include), then the
    # headers Triton ships.
    bases = list(site.getsitepackages()) + [site.getusersitepackages()] + sys.path
    for base in bases:
        candidates += sorted(glob.glob(os.path.join(base, "nvidia", "*", "include")))
    for base in bases:
        candidates.append(os.path.join(base, "triton", "backends", "nvidia", "include"))
    for inc in candidates:
        if _has_cuda_headers(inc):
            return [inc]
    sys.exit("aotriton setup: no CUDA runtime headers (cuda_runtime_api.h, crt/host_config.h) found; set CUDA_HOME")


def extension():
    from torch.utils.cpp_extension import CppExtension, library_paths

    prefix = aotriton_prefix()
    libdir = os.path.join(prefix, "lib")
    static = os.environ.get("AOTRITON_STATIC", "0") not in ("", "0")
    if static:
        link = [os.path.join(libdir, "libaotriton.a"), "-ldl", "-lpthread", "-lm"]
    else:
        link = [f"-L{libdir}", "-laotriton", f"-Wl,-rpath,{libdir}"]
    torch_libdir = library_paths()[0]
    return CppExtension(
        name="aotriton._C",
        sources=[os.path.join(HERE, "csrc", "aotriton_torch.cpp")],
        include_dirs=[os.path.join(prefix, "include")] + cuda_include_dirs(),
        library_dirs=[torch_libdir],
        libraries=["c10_cuda", "torch_cuda"],
        extra_compile_args=["-O2"],
        extra_link_args=link,
    )


if __name__ == "__main__":
    from torch.utils.cpp_extension import BuildExtension

    os.chdir(HERE)  # setuptools wants paths relative to this directory
    setup(
        name="aotriton-torch",
        version="0.1.0",
        description="PyTorch ops over aotriton's FlashAttention",
        package_dir={"": "python"},
        packages=["aotriton"],
        ext_modules=[extension()],
        cmdclass={"build_ext": BuildExtension.with_options(no_python_abi_suffix=False)},
    )
