#!/usr/bin/env python3
"""test_llama.py with --arch mistral: a sliding-window model (window 128 over 512 tokens) trained
with aotriton attention vs torch SDPA. Last line: `torch-mistral: N passed, M failed`."""
import sys

import test_llama

if __name__ == "__main__":
    test_llama.main(["--arch", "mistral"] + sys.argv[1:])
