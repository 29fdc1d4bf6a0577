"""Triton kernel sources compiled ahead of time by python/compile.py.

Every .py file under this directory is part of the compile cache key: editing
any of them recompiles every kernel.
"""
