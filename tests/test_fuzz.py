"""Property-based fuzzing of every input boundary: random configs and overrides may only raise ConfigError, random
data files only DataError, random wire bytes only MessageError. Deterministic (derandomize) and quiet."""

from __future__ import annotations

import copy
import gzip
import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from collabalign.comm import Message, MessageError
from collabalign.commands import CONFIG_DIR, load_config
from collabalign.config import ConfigError, read_yaml, validate
from collabalign.data import DataError, load_commonsense, load_glue, load_hh_rlhf, load_tldr
from collabalign.data.amazon_reviews import read_reviews
from collabalign.data.formats import load_pairs
from collabalign.data.glue import LAYOUTS
from collabalign.data.pku_saferlhf import load_pku_saferlhf
from collabalign.experiments import EXPERIMENTS


def fuzz(examples: int) -> settings:
    """Deterministic, deadline-free settings that store nothing on disk."""
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


WORDS = ["nan", "inf", "-inf", "1e400", "-1", "0", "theory", "oracle", "adam", "gae", "synthetic", "hh", "r1",
         "tldr_like", "cpu", "books", "topic", "RTE", "prompt", "chosen", "text", "entailment", "1", "\t", ""]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-4, 40), st.integers(), st.floats(), st.text(max_size=8),
                    st.sampled_from(WORDS))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=5)
                      | st.dictionaries(st.text(max_size=6) | st.sampled_from(WORDS), inner, max_size=4),
                      max_leaves=12)
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10)
                    | st.sampled_from(WORDS), lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=6) | st.sampled_from(WORDS), inner, max_size=4), max_leaves=10)


# ---- (a) configs -------------------------------------------------------------------------------------------------

def field_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every field of a config and of its nested sections, as key paths."""
    out = []
    for name, info in model.model_fields.items():
        out.append((*prefix, name))
        for sub in (info.annotation, *get_args(info.annotation)):
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                out += field_paths(sub, (*prefix, name))
    return out


def shipped(name: str) -> list[dict[str, Any]]:
    """The experiment's shipped configs as dicts, without the CLI's keys."""
    folder = CONFIG_DIR / name.replace("-", "_")
    return [{k: v for k, v in read_yaml(p).items() if k not in ("experiment", "smoke")} for p in folder.glob("*.yaml")]


NAMES = sorted(EXPERIMENTS)
CONFIGS = {name: importlib.import_module(EXPERIMENTS[name]).Config for name in NAMES}
PATHS = {name: field_paths(CONFIGS[name]) for name in NAMES}
BASES = {name: [{}, *shipped(name)] for name in NAMES}


def set_path(data: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = data
    for part in path[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path[-1]] = value


@pytest.mark.parametrize("name", NAMES)
@fuzz(200)
@given(data=st.data())
def test_random_config_values_raise_only_config_error(name, data):
    config = copy.deepcopy(data.draw(st.sampled_from(BASES[name])))
    for path, value in data.draw(st.lists(st.tuples(st.sampled_from(PATHS[name]), VALUES), min_size=1, max_size=4)):
        set_path(config, path, value)
    try:
        validate(CONFIGS[name], config)
    except ConfigError:
        pass


def override(path: tuple[str, ...], value: Any, raw: str | None) -> str:
    return f"{'.'.join(path)}={raw if raw is not None else yaml.safe_dump(value, default_flow_style=True).strip()}"


KEYS = sorted({p for paths in PATHS.values() for p in paths} | {("experiment",), ("smoke",)})  # + the CLI's keys
OVERRIDES = st.one_of(
    st.builds(override, st.sampled_from(KEYS), VALUES,
              st.none() | st.text(max_size=12)),
    st.text(max_size=20),
)


EXPERIMENT_CONFIGS = sorted(p for p in CONFIG_DIR.rglob("*.yaml") if p.parent.name != "deploy")  # not deploy/


@fuzz(300)
@given(path=st.sampled_from(EXPERIMENT_CONFIGS), overrides=st.lists(OVERRIDES, max_size=3))
def test_random_overrides_raise_only_config_error(path, overrides):
    try:
        load_config(path, overrides)
    except ConfigError:
        pass


# ---- (b) data files ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@fuzz(500)
@given(content=st.binary(max_size=300) | st.text(max_size=200).map(str.encode))
def test_random_config_files_raise_only_config_error(folder, content):
    path = folder / "config.yaml"
    path.write_bytes(content)
    try:
        read_yaml(path)
    except ConfigError:
        pass


ROWS = {  # a valid row of each JSONL loader, mutated below
    "pairs": {"prompt": "Hi?", "chosen": "Hello.", "rejected": "Bye."},
    "hh_rlhf": {"chosen": "\n\nHuman: Hi?\n\nAssistant: Hello.", "rejected": "\n\nHuman: Hi?\n\nAssistant: Bye."},
    "pku_saferlhf": {"prompt": "Hi?", "response_0": "Hello.", "response_1": "Go away.", "better_response_id": 0,
                     "safer_response_id": 1, "is_response_0_safe": True, "is_response_1_safe": False},
    "tldr": {"info": {"id": "t1", "post": "A post.", "title": "T", "subreddit": "r"}, "worker": "w1",
             "summaries": [{"text": "one", "policy": "a"}, {"text": "two", "policy": "b"}], "choice": 1,
             "batch": "b1", "split": "train", "extra": {"confidence": 5}},
}
WHOLE = {  # a valid file of each whole-JSON loader
    "commonsense": [{"instruction": "Q?", "input": "", "output": "the answer is true", "answer": "true"}],
}
LOADERS: dict[str, Callable[[Path], Any]] = {
    "pairs": load_pairs,
    "hh_rlhf": load_hh_rlhf,
    "hh_rlhf_drop": lambda p: load_hh_rlhf(p, drop_invalid=True),
    "pku_saferlhf": load_pku_saferlhf,
    "tldr": load_tldr,
    "tldr_drop": lambda p: load_tldr(p, drop_invalid=True),
    "commonsense": load_commonsense,
    "commonsense_boolq": lambda p: load_commonsense(p, "boolq"),
    "amazon_reviews": lambda p: read_reviews(p, "books", 1),
}


def leaves(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Paths to every node of a JSON value (the root included)."""
    out = [prefix]
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for key, child in items:
        out += leaves(child, (*prefix, key))
    return out


@st.composite
def mutated(draw, template: Any) -> Any:
    """`template` with 0-3 nodes replaced by random JSON or deleted."""
    value = copy.deepcopy(template)
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(leaves(value)))
        if not path:
            return draw(JSON)
        parent = value
        for key in path[:-1]:
            parent = parent[key]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(JSON)
    return value


def load(folder: Path, loader: str, content: bytes, gz: bool = False) -> None:
    path = folder / f"{loader}.data"
    path.write_bytes(gzip.compress(content) if gz else content)
    try:
        LOADERS[loader](path)
    except DataError:
        pass


@fuzz(750)
@given(loader=st.sampled_from(sorted(LOADERS)), content=st.binary(max_size=300), gz=st.booleans())
def test_random_bytes_raise_only_data_error(folder, loader, content, gz):
    load(folder, loader, content, gz)


@fuzz(400)
@given(data=st.data(), loader=st.sampled_from(sorted(ROWS) + sorted(WHOLE)))
def test_mutated_json_rows_raise_only_data_error(folder, data, loader):
    if loader in WHOLE:
        text = json.dumps(data.draw(mutated(WHOLE[loader])))
    else:
        rows = data.draw(st.lists(mutated(ROWS[loader]) | st.text(max_size=20), min_size=1, max_size=4))
        text = "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows)
    for name in [n for n in LOADERS if n.startswith(loader)]:
        load(folder, name, text.encode())


CELLS = st.sampled_from(["0", "1", "2", "entailment", "not_entailment", "neutral", "contradiction", "-", "4.5", "7",
                         "nan", "", " ", "a cat", "\u00e9t\u00e9"]) | st.text(max_size=10)


@fuzz(300)
@given(task=st.sampled_from(sorted(LAYOUTS)), header=st.booleans(), data=st.data())
def test_random_glue_rows_raise_only_data_error(folder, task, header, data):
    columns = LAYOUTS[task].columns
    lines = ["\t".join(columns)] if header else []
    lines += ["\t".join(row) for row in data.draw(st.lists(st.lists(CELLS, min_size=len(columns) - 1,
                                                                    max_size=len(columns) + 1), max_size=4))]
    (folder / task).mkdir(exist_ok=True)
    for split in ("train", "dev"):
        stem = "dev_matched" if task == "MNLI" and split == "dev" else split
        (folder / task / f"{stem}.tsv").write_text("\n".join(lines) + "\n")
        try:
            load_glue(task, split, folder)
        except DataError:
            pass


TAGS = st.sampled_from(["rating", "review_text", "title", "unique_id", "x"])


@fuzz(500)
@given(blocks=st.lists(st.tuples(TAGS, CELLS | st.sampled_from(["5.0", "1.0", "2.5", "&amp;"]), st.booleans()),
                       max_size=5), closed=st.booleans())
def test_random_amazon_reviews_raise_only_data_error(folder, blocks, closed):
    text = "<review>" + "".join(f"<{tag}>{value}</{tag}>" if whole else f"<{tag}>{value}"
                                for tag, value, whole in blocks) + ("</review>" if closed else "")
    load(folder, "amazon_reviews", text.encode())


# ---- (c) wire bytes ----------------------------------------------------------------------------------------------

DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int32, np.int8, np.uint8, np.bool_]
ARRAYS = st.dictionaries(st.text(min_size=1, max_size=6), st.tuples(st.sampled_from(DTYPES),
                                                                    st.lists(st.integers(0, 3), max_size=3)),
                         max_size=3)
META = st.dictionaries(st.text(max_size=6), JSON, max_size=3)


def message(arrays: dict[str, tuple], meta: dict[str, Any]) -> Message:
    return Message({k: np.arange(int(np.prod(shape))).astype(dt).reshape(shape) for k, (dt, shape) in arrays.items()},
                   meta)


def deserialise(data: bytes) -> None:
    try:
        Message.deserialise(data)
    except MessageError:
        pass


@fuzz(500)
@given(data=st.binary(max_size=200) | st.binary(min_size=8, max_size=8).map(lambda b: b + b"{}"))
def test_random_bytes_raise_only_message_error(data):
    deserialise(data)


HEADER_VALUES = st.one_of(JSON, st.sampled_from(["BF16", "F8_E4M3", "F4", "F32", "I64", "BOOL", "C64", "U64"]),
                          st.lists(st.integers(-2, 2**40), max_size=3))


@fuzz(400)
@given(arrays=ARRAYS, meta=META, data=st.data())
def test_mutated_messages_raise_only_message_error_and_valid_ones_round_trip(arrays, meta, data):
    msg = message(arrays, meta)
    wire = msg.serialise()
    back = Message.deserialise(wire)
    assert back.meta == msg.meta and set(back) == set(msg) and back.serialise() == wire
    size = int.from_bytes(wire[:8], "little")
    header = json.loads(wire[8:8 + size])
    kind = data.draw(st.sampled_from(["truncate", "flip", "length", "header", "meta"]))
    if kind == "truncate":
        wire = wire[:data.draw(st.integers(0, len(wire) - 1))]
    elif kind == "flip":
        wire = bytearray(wire)
        for at in data.draw(st.lists(st.integers(0, len(wire) - 1), min_size=1, max_size=4)):
            wire[at] = data.draw(st.integers(0, 255))
        wire = bytes(wire)
    elif kind == "length":
        wire = data.draw(st.integers(0, 2**64 - 1)).to_bytes(8, "little") + wire[8:]
    else:
        if kind == "header":
            header = data.draw(mutated(header) | st.builds(dict, st.just({}), x=st.fixed_dictionaries(
                {"dtype": HEADER_VALUES, "shape": HEADER_VALUES, "data_offsets": HEADER_VALUES})))
        else:
            header["__metadata__"] = {"meta": data.draw(st.text(max_size=20) | JSON.map(json.dumps))}
        raw = json.dumps(header).encode()
        wire = len(raw).to_bytes(8, "little") + raw + wire[8 + size:]
    deserialise(wire)
