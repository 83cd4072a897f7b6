"""collabalign: collaborative alignment of language models (reward models, policies, LoRA adapters)."""

import os

# MKL (torch's CPU BLAS) picks its kernels by the memory alignment of the operands unless told to be strict, so the
# same matrix product on the same numbers can differ in the last bits between two processes (a tensor read from numpy
# or from a message lies wherever the allocator put it). Strict mode makes it depend on the numbers only: a deployed
# node computes what the in-process simulator computes, a resumed run what an uninterrupted one does. MKL reads this at
# its first call, so it holds whenever collabalign is imported before the first matrix product; a value the user set
# wins.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

__version__ = "0.1.0"
