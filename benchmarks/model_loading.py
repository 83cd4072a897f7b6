"""Backbone load times: the first SmolLM2 call converts the GGUF (once per machine), later calls read the
safetensors cache (goal: < 2 s); MiniLM and the tiny test Llama for comparison. Absolute seconds, printed.
Run: OMP_NUM_THREADS=1 .venv/bin/python benchmarks/model_loading.py
"""

from __future__ import annotations

import time

from collabalign.models.backbones import _smollm2_cache, minilm_l6, smollm2_135m, tiny_llama


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    cached = (_smollm2_cache()[1] / "model").exists()
    first = timed(smollm2_135m)
    print(f"smollm2_135m  first call  {first:6.2f} s  ({'from cache' if cached else 'GGUF conversion'})")
    print(f"smollm2_135m  second call {timed(smollm2_135m):6.2f} s  (goal < 2 s)")
    print(f"minilm_l6                 {timed(minilm_l6):6.2f} s")
    print(f"tiny_llama                {timed(tiny_llama):6.2f} s")


if __name__ == "__main__":
    main()
