"""Builds the aotriton PyTorch package (``aotriton.torch``, ``aotriton.flash_attn``, ``aotriton.hf``
and the extension ``aotriton._C``) against an installed aotriton, as a wheel that carries the
library:

    ./build.sh && pip install --no-build-isolation ./bindings/torch        # uses ./install
    AOTRITON_PREFIX=/path/to/install pip install --no-build-isolation ./bindings/torch
    pip wheel --no-build-isolation ./bindings/torch -w dist                 # the wheel alone

(``--no-build-isolation``: the extension compiles against the torch you have, as every torch
extension does.) The prefix holds ``include/aotriton/flash.h`` and ``lib/libaotriton.so``
(default: ``AOTRITON_PREFIX``, else ``.stage/install``, else ``install/`` of this checkout). The
library's real file is copied beside the extension under its SONAME (``libaotriton.so.<major>``)
and the extension finds it through an ``$ORIGIN`` rpath, so the installed package needs neither
PYTHONPATH nor LD_LIBRARY_PATH; the package is versioned like the library
(``AOTRITON_LIBRARY_VERSION_STRING`` of ``aotriton/config.h``). ``AOTRITON_STATIC=1`` links
``lib/libaotriton.a`` into the extension instead. CUDA headers come from ``CUDA_HOME``/``CUDA_PATH``,
``/usr/local/cuda``, ``nvcc`` on ``PATH``, or the NVIDIA wheels torch depends on; no CUDA compiler
is needed (the extension is plain C++). ``build.py`` builds it in place for development.
"""
import glob
import os
import re
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


def config_macros(prefix):
    """The #defines of the installed aotriton/config.h (version, archs, NOIMAGE mode)."""
    with open(os.path.join(prefix, "include", "aotriton", "config.h")) as f:
        return dict(re.findall(r"^#define (\w+) (.+)$", f.read(), re.M))


def library_version(prefix):
    return config_macros(prefix)["AOTRITON_LIBRARY_VERSION_STRING"].strip().strip('"')


def static_build():
    return os.environ.get("AOTRITON_STATIC", "0") not in ("", "0")


def shared_library(prefix):
    """(the real file behind lib/libaotriton.so, its SONAME libaotriton.so.<major>)."""
    real = os.path.realpath(os.path.join(prefix, "lib", "libaotriton.so"))
    if not os.path.isfile(real):
        sys.exit(f"aotriton setup: no {prefix}/lib/libaotriton.so (AOTRITON_STATIC=1 links libaotriton.a)")
    major = config_macros(prefix)["AOTRITON_LIBRARY_VERSION_MAJOR"].strip()
    return real, f"libaotriton.so.{major}"


def extension():
    from torch.utils.cpp_extension import CppExtension, library_paths

    prefix = aotriton_prefix()
    libdir = os.path.join(prefix, "lib")
    if static_build():
        link = [os.path.join(libdir, "libaotriton.a"), "-ldl", "-lpthread", "-lm"]
    else:  # the library travels beside the extension (BuildWithLibrary); plain exec, no shell: $ORIGIN stays
        link = [f"-L{libdir}", "-laotriton", "-Wl,-rpath,$ORIGIN"]
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


def build_ext_class():
    from torch.utils.cpp_extension import BuildExtension

    # No ninja: it would run the link through a shell, which expands $ORIGIN.
    base = BuildExtension.with_options(no_python_abi_suffix=False, use_ninja=False)

    class BuildWithLibrary(base):
        """Builds the extension, then copies libaotriton beside it under its SONAME."""

        def run(self):
            super().run()
            if static_build():
                return
            real, soname = shared_library(aotriton_prefix())
            for ext in self.extensions:
                dest = os.path.join(os.path.dirname(self.get_ext_fullpath(ext.name)), soname)
                shutil.copy2(real, dest)
                print(f"aotriton setup: {real} -> {dest}")

    return BuildWithLibrary


if __name__ == "__main__":
    os.chdir(HERE)  # setuptools wants paths relative to this directory
    setup(
        name="aotriton-torch",
        version=library_version(aotriton_prefix()),
        description="aotriton's ahead-of-time compiled FlashAttention for PyTorch (torch ops, torch's "
                    "flash-attention registry, FlashAttention-2-compatible functions)",
        package_dir={"": "python"},
        packages=["aotriton"],
        ext_modules=[extension()],
        cmdclass={"build_ext": build_ext_class()},
        python_requires=">=3.9",
        zip_safe=False,
    )
