#!/usr/bin/env python3
"""Builds the extension in place: bindings/torch/python/aotriton/_C*.so.

    python bindings/torch/build.py --prefix /path/to/aotriton/install [--static] [--jit]

Then ``PYTHONPATH=bindings/torch/python python -c "import aotriton.torch"``.

Default: setuptools ``build_ext --inplace`` (plain g++), which also copies libaotriton beside the
extension (``python/aotriton/libaotriton.so.<major>``, found through an ``$ORIGIN`` rpath).
``--jit``: ``torch.utils.cpp_extension.load`` instead (needs ninja), building into
``bindings/torch/build/jit`` and copying the library into the package.
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.join(HERE, "python", "aotriton")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", default=os.environ.get("AOTRITON_PREFIX"),
                    help="installed aotriton (default: $AOTRITON_PREFIX, else .stage/install, else install/)")
    ap.add_argument("--static", action="store_true", help="link libaotriton.a instead of libaotriton.so")
    ap.add_argument("--jit", action="store_true", help="build with torch.utils.cpp_extension.load (ninja)")
    args = ap.parse_args()
    env = dict(os.environ)
    if args.prefix:
        env["AOTRITON_PREFIX"] = os.path.abspath(args.prefix)
    if args.static:
        env["AOTRITON_STATIC"] = "1"
    for old in glob.glob(os.path.join(PKG, "_C*.so")):
        os.remove(old)
    if not args.jit:
        cmd = [sys.executable, os.path.join(HERE, "setup.py"), "build_ext", "--inplace",
               "--build-temp", os.path.join(HERE, "build", "temp")]
        print("+", " ".join(cmd), flush=True)
        subprocess.check_call(cmd, env=env, cwd=HERE)
    else:
        os.environ.update(env)
        sys.path.insert(0, HERE)
        import setup as setup_py  # noqa: E402  (reuses the include/link logic)
        from torch.utils.cpp_extension import load

        ext = setup_py.extension()
        build_dir = os.path.join(HERE, "build", "jit")
        os.makedirs(build_dir, exist_ok=True)
        # ninja runs the link through a shell: an rpath to the prefix instead of $ORIGIN.
        ldflags = [f for f in ext.extra_link_args if "$ORIGIN" not in f]
        if not setup_py.static_build():
            ldflags.append(f"-Wl,-rpath,{os.path.join(setup_py.aotriton_prefix(), 'lib')}")
        load(name="_C", sources=ext.sources, extra_include_paths=ext.include_dirs,
             extra_cflags=ext.extra_compile_args,
             extra_ldflags=ldflags + [f"-L{d}" for d in ext.library_dirs] + [f"-l{l}" for l in ext.libraries],
             build_directory=build_dir, verbose=True, is_python_module=True)
        shutil.copy(os.path.join(build_dir, "_C.so"), os.path.join(PKG, "_C.so"))
    built = glob.glob(os.path.join(PKG, "_C*.so"))
    if not built:
        sys.exit("build.py: no aotriton/_C*.so was produced")
    print("built", built[0])


if __name__ == "__main__":
    main()
