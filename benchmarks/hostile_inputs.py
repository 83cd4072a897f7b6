"""Hostile and careless inputs against `collabalign train`, `score`, `generate` and `deploy`.

Each case runs `python -m collabalign.cli ...` as a subprocess, in a new session, with the source tree `--src` first
on PYTHONPATH (so its node workers and Flower apps use it too), inside a sandbox folder, and records: the exit code,
the first line of stderr, whether stderr holds a Python traceback, wall seconds, the peak RSS of the process tree,
what was written in the sandbox outside the case's --out (names, sizes, mtimes and modes before and after), and
whether a trained run the case targets or sits beside lost or changed files (their bytes before and after). A case
past the memory or time cap is killed with its whole process tree; processes a case leaves behind (a SuperLink,
SuperNodes, node workers) are stopped by process id, only descendants of the case's own processes.

    .venv/bin/python benchmarks/hostile_inputs.py --src /tmp/before-src/src --out /tmp/hostile-before
    .venv/bin/python benchmarks/hostile_inputs.py --out /tmp/hostile-after --only t01 s02 d07

Writes OUT/hostile.md (the table and totals) and OUT/hostile.json (the rows), both after every case. The sandbox is
OUT/sandbox: example data, a P-ShareLoRA reward run and a fed-tune policy run trained first (on tiny-llama), the
bomb files (built once, by streaming, and kept for reruns) and one folder per case; each case's stdout and stderr are
in OUT/logs/. A traceback's first line says nothing, so the table shows its last line (the exception) instead.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

import numpy as np
import psutil

TRACEBACK = b"Traceback (most recent call last)"
EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*: ")  # 'ValueError: ...' (not a log line's 'INFO :')
GIB = 1 << 30
CELL_CHARS = 120  # a table cell's text is cut here
SMALL = {  # the smallest settings of each method, so that a normal case takes seconds
    "pshare-lora": ["model=tiny-llama", "epochs=1", "max_length=32"],
    "pshare-lora-federated": ["model=tiny-llama", "rounds=1", "local_steps=1", "max_length=32"],
    "fedavg-lora": ["model=tiny-llama", "rounds=1", "max_length=32"],
    "fslora": ["model=tiny-llama", "ranks=[2]", "rounds=1", "local_steps=1", "max_length=32"],
    "firm": ["model=tiny-llama", "rounds=1", "clients=2", "batch_size=2", "max_new_tokens=4", "step=rloo",
             "samples=2"],
    "meta-reward": ["model=tiny-llama", "policy=tiny-llama", "sft_steps=0", "inner_steps=1", "outer_steps=1",
                    "test_steps=1", "select_every=1", "max_length=32"],
    "affpcl": ["steps=10"],
    "fed-tune": ["model=tiny-llama", "rounds=1", "local_steps=1", "batch_size=2", "max_response_tokens=8"],
}
DEPLOY = ["deploy/fedavg-lora", "model=tiny-llama", "rounds=1", "max_length=32"]
REAL_DEPLOY_CAP_S = 300.0  # a case that starts a real deployment (about a minute on 2 busy cores) gets this long


@dataclass(frozen=True)
class Sandbox:
    """The folder every case runs in, and the interpreter and source tree that run them."""

    root: Path
    python: str
    src: Path

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def reward(self) -> Path:
        return self.root / "runs" / "reward"

    @property
    def policy(self) -> Path:
        return self.root / "runs" / "policy"

    @property
    def bombs(self) -> Path:
        return self.root / "bombs"

    @property
    def cases(self) -> Path:
        return self.root / "cases"

    def cli(self, *args: str) -> list[str]:
        return [self.python, "-m", "collabalign.cli", *args]

    def env(self) -> dict[str, str]:
        """The environment of every subprocess: offline, one thread, Flower's home, HOME, TMPDIR and the model cache
        inside the sandbox (so stray writes show), the source tree first on PYTHONPATH, no inherited data limits."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("COLLABALIGN_")}
        path = [str(self.src), *filter(None, [os.environ.get("PYTHONPATH")])]
        env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1", FLWR_HOME=str(self.root / "flwr-home"),
                   HOME=str(self.root / "home"), TMPDIR=str(self.root / "tmp"),
                   COLLABALIGN_CACHE=str(self.root / "cache"), PYTHONPATH=os.pathsep.join(path))
        return env


@dataclass
class Plan:
    """What a case runs (several commands: started together), its --out, and the runs or files it must not
    change (beside the prepared runs, always checked)."""

    argvs: list[list[str]]
    out: Path | None = None
    guard: list[Path] = field(default_factory=list)
    time_cap_s: float | None = None  # None: the --time-cap
    check: Callable[[], str] | None = None  # a note on the outcome, read after the run


@dataclass(frozen=True)
class Case:
    id: str
    command: str
    input: str
    plan: Callable[[Sandbox, Path], Plan]  # (sandbox, the case's own empty folder) -> what to run


@dataclass
class Outcome:
    exits: list[str]
    seconds: float
    peak_mb: float
    leftovers: list[str]


@dataclass
class Row:
    id: str
    command: str
    input: str
    exit: str
    stderr: str
    traceback: bool
    seconds: float
    peak_mb: float
    outside: list[str]
    result: str
    notes: str
    stderr_tail: str


# ---- data files ----------------------------------------------------------------------------------------------------

def write_jsonl(path: Path, rows: Iterable[object]) -> Path:
    with path.open("w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def pairs(box: Sandbox) -> Path:
    """The example pairs of users ana and ben."""
    return box.data / "pairs-ab.jsonl"


def pairs_with_user(box: Sandbox, folder: Path, user: object) -> Path:
    """The ana/ben pairs with ana's rows given `user`."""
    rows = [row | {"user": user} if row["user"] == "ana" else row for row in read_jsonl(pairs(box))]
    return write_jsonl(folder / "pairs.jsonl", rows)


def labelled_with(box: Sandbox, folder: Path, label: Callable[[int], object]) -> Path:
    rows = [row | {"label": label(row["label"])} for row in read_jsonl(box.data / "labelled.jsonl")]
    return write_jsonl(folder / "labelled.jsonl", rows)


def with_line(box: Sandbox, folder: Path, line: bytes) -> Path:
    """The ana/ben pairs, then one more line (raw bytes)."""
    path = folder / "pairs.jsonl"
    path.write_bytes((pairs(box)).read_bytes() + line + b"\n")
    return path


def big_row_file(path: Path, first: dict, key: str, mib: int, rest: Iterable[dict] = ()) -> Path:
    """A JSONL file whose first row is `first` with `key` holding `mib` MiB of words, then `rest`."""
    row = json.dumps(first | {key: ""})
    head, tail = row.split(f'"{key}": ""')
    with path.open("w") as f:
        f.write(f'{head}"{key}": "')
        f.write(("basil " * (1 << 18))[:1 << 20] * mib)
        f.write(f'"{tail}\n')
        f.writelines(json.dumps(r) + "\n" for r in rest)
    return path


def npz_bomb(path: Path) -> Path:
    """An .npz of 4 MiB whose X_a inflates to 4 GiB of float64 zeros (y_a to 1 GiB), built by streaming."""
    if path.exists():
        return path
    rows, tmp = 1 << 27, path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, shape in (("X_a.npy", (rows, 4)), ("y_a.npy", (rows,))):
            with zf.open(name, "w", force_zip64=True) as member:
                np.lib.format.write_array_header_1_0(member, {"descr": "<f8", "fortran_order": False,
                                                              "shape": shape})
                _write_repeated(member, bytes(1 << 24), 8 * int(np.prod(shape)))
    tmp.rename(path)
    return path


def gzip_bomb(path: Path, head: bytes, fill: bytes, size: int, tail: bytes) -> Path:
    """A gzip file of `head`, `fill` repeated to `size` bytes and `tail`, built by streaming."""
    if path.exists():
        return path
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wb") as f:
        f.write(head)
        _write_repeated(f, fill * ((1 << 24) // len(fill)), size)
        f.write(tail)
    tmp.rename(path)
    return path


def _write_repeated(f: IO[bytes], block: bytes, size: int) -> None:
    written = 0
    while written < size:
        written += f.write(block[:size - written])


def line_bomb(box: Sandbox) -> Path:
    """One valid JSONL pair whose prompt is 4 GiB of 'a' on one line, gzipped (about 4 MiB)."""
    return gzip_bomb(box.bombs / "line-4gib.jsonl.gz", b'{"prompt": "', b"a", 4 * GIB,
                     b'", "chosen": "x", "rejected": "y", "user": "ana"}\n')


def blank_bomb(box: Sandbox) -> Path:
    """10**9 blank lines, gzipped (about 1 MiB)."""
    return gzip_bomb(box.bombs / "blank-lines.jsonl.gz", b"", b"\n", 10**9, b"")


def billion_laughs(path: Path) -> Path:
    """A YAML config whose lora.targets aliases 9 levels of 9-fold lists (9**9 strings once expanded)."""
    levels = ['&l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    levels += [f"&l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    path.write_text("lora:\n  targets: [" + ", ".join(levels) + "]\n")
    return path


# ---- case plans ----------------------------------------------------------------------------------------------------

def train(box: Sandbox, folder: Path, method: str, data: Path | str, *overrides: str, out: Path | str | None = None,
          guard: Iterable[Path] = ()) -> Plan:
    """`train` with the method's smallest settings, then `overrides`; --out folder/out unless given (a str: as it
    is, so that '' stays '')."""
    out = folder / "out" if out is None else out
    argv = box.cli("train", method, *SMALL.get(method, []), *overrides, "--data", str(data), "--out", str(out),
                   "--no-progress")
    return Plan([argv], Path(out), list(guard))


def copy_run(source: Path, folder: Path, damage: Callable[[Path], object] = lambda run: None) -> Path:
    run = folder / "run"
    shutil.copytree(source, run)
    damage(run)
    return run


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])


def edit_json(path: Path, **changes: object) -> None:
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def score(box: Sandbox, run: Path, *args: str) -> Plan:
    return Plan([box.cli("score", str(run), *args)], guard=[run])


def score_texts(box: Sandbox, run: Path, *args: str) -> Plan:
    return score(box, run, "--file", str(box.data / "texts.jsonl"), *args)


def damaged_score(damage: Callable[[Path], object]) -> Callable[[Sandbox, Path], Plan]:
    """Scores user ana's texts with a copy of the reward run damaged by `damage` (given the copy's folder)."""
    return lambda b, d: score_texts(b, copy_run(b.reward, d, damage), "--user", "ana")


def generate(box: Sandbox, *args: str, run: Path | None = None) -> Plan:
    run = box.policy if run is None else run
    return Plan([box.cli("generate", str(run), *args)], guard=[run])


def prompt_gen(*args: str, prompt: str = "How do I keep basil fresh?") -> Callable[[Sandbox, Path], Plan]:
    return lambda b, d: generate(b, "--prompt", prompt, "--max-new-tokens", "4", *args)


def deploy(box: Sandbox, folder: Path, *args: str, out: Path | None = None, guard: Iterable[Path] = (),
           config: list[str] | None = None, real: bool = False) -> Plan:
    out = folder / "out" if out is None else out
    argv = box.cli("deploy", *(DEPLOY if config is None else config), *args, "--out", str(out), "--no-progress")
    return Plan([argv], out, list(guard), REAL_DEPLOY_CAP_S if real else None)


def pair_into_one_out(box: Sandbox, folder: Path) -> Plan:
    """Two pshare-lora runs started together into one --out, users ana/ben and ben/zed; the note says whose manifest
    and adapters end there."""
    out = folder / "out"
    first, second = train(box, folder, "pshare-lora", pairs(box)), ps_user("zed")(box, folder)

    def check() -> str:
        manifest = out / "manifest.json"
        listed = set(json.loads(manifest.read_text())["adapters"]) if manifest.exists() else set()
        present = {p.name for p in (out / "adapters").iterdir()} if (out / "adapters").is_dir() else set()
        method = json.loads(manifest.read_text())["method"] if manifest.exists() else "none"
        mixed = "MIXED: " if present != listed else ""
        return f"{mixed}manifest {method} lists {sorted(listed)}; adapters/ holds {sorted(present)}"

    return Plan(first.argvs + second.argvs, out, check=check)


def out_below_file(box: Sandbox, folder: Path) -> Plan:
    (folder / "afile").write_text("x")
    return train(box, folder, "pshare-lora", pairs(box), out=folder / "afile" / "run")


def out_dangling_link(box: Sandbox, folder: Path) -> Plan:
    (folder / "link").symlink_to(folder / "nowhere" / "target")
    return train(box, folder, "pshare-lora", pairs(box), out=folder / "link")


def out_empty_string(box: Sandbox, folder: Path) -> Plan:
    """`--out ""` (the working folder) beside a trained run."""
    existing = copy_run(box.reward, folder)
    plan = train(box, folder, "pshare-lora", pairs(box), out="", guard=[existing])
    return Plan(plan.argvs, folder, plan.guard)


def deploy_over_user_folder(box: Sandbox, folder: Path) -> Plan:
    mine = folder / "F" / "deployment" / "mine.txt"
    mine.parent.mkdir(parents=True)
    mine.write_text("the user's own notes\n")
    return deploy(box, folder, "--nodes", "3", out=folder / "F", guard=[mine], real=True)


def deploy_config_outside(box: Sandbox, folder: Path) -> Plan:
    config = folder / "evil.yaml"
    config.write_text("train: fedavg-lora\ndata: ../../../../../../../../../etc/passwd\nmodel: tiny-llama\n"
                      "rounds: 1\n")
    return deploy(box, folder, "--nodes", "3", config=[str(config)])


def ps_user(user: object, method: str = "pshare-lora") -> Callable[[Sandbox, Path], Plan]:
    return lambda b, d: train(b, d, method, pairs_with_user(b, d, user))


def traversal(method: str) -> Callable[[Sandbox, Path], Plan]:
    """A user that climbs out of adapters/: with --out CASE/deep/out, it lands in the case's own folder."""
    return lambda b, d: train(b, d, method, pairs_with_user(b, d, "x/../../../../victim"), out=d / "deep" / "out")


def fs_label(label: Callable[[int], object]) -> Callable[[Sandbox, Path], Plan]:
    return lambda b, d: train(b, d, "fslora", labelled_with(b, d, label))


def ps_data(make: Callable[[Sandbox, Path], Path | str], *overrides: str) -> Callable[[Sandbox, Path], Plan]:
    return lambda b, d: train(b, d, "pshare-lora", make(b, d), *overrides)


def ps_override(*overrides: str) -> Callable[[Sandbox, Path], Plan]:
    return ps_data(lambda b, d: pairs(b), *overrides)


def dep(*args: str, real: bool = False) -> Callable[[Sandbox, Path], Plan]:
    return lambda b, d: deploy(b, d, *args, real=real)


def solo_pair(b: Sandbox, d: Path) -> Path:
    rows = read_jsonl(pairs(b))
    return write_jsonl(d / "pairs.jsonl", [*rows, rows[0] | {"user": "solo"}])


def empty_strings(b: Sandbox, d: Path) -> Path:
    rows = [{"prompt": "", "chosen": "", "rejected": "", "user": user} for user in ("ana", "ben") for _ in range(4)]
    return write_jsonl(d / "pairs.jsonl", rows)


def fifty_mib_pair(b: Sandbox, d: Path) -> Path:
    rows = read_jsonl(pairs(b))
    return big_row_file(d / "pairs.jsonl", rows[0], "prompt", 50, rows[1:])


def fifty_mib_text(b: Sandbox, d: Path) -> Path:
    return big_row_file(d / "texts.jsonl", {"prompt": "", "response": "Stand it in water."}, "prompt", 50)


def truncated_npz(b: Sandbox, d: Path) -> Path:
    data = (b.data / "agents.npz").read_bytes()
    (d / "agents.npz").write_bytes(data[:len(data) // 2])
    return d / "agents.npz"


def new_file(name: str, content: bytes = b"") -> Callable[[Sandbox, Path], Path]:
    def make(b: Sandbox, d: Path) -> Path:
        (d / name).write_bytes(content)
        return d / name
    return make


def mkdir(b: Sandbox, d: Path) -> Path:
    (d / "adir").mkdir()
    return d / "adir"


CASES = [
    # train: names, labels and settings
    Case("t01", "train", "pshare-lora: user 'x/../../../../victim' (--out CASE/deep/out)", traversal("pshare-lora")),
    Case("t02", "train", "pshare-lora-federated: user 'x/../../../../victim' (--out CASE/deep/out)",
         traversal("pshare-lora-federated")),
    Case("t03", "train", "pshare-lora: user '../../../a'", ps_user("../../../a")),
    Case("t04", "train", "pshare-lora: a 300-character user", ps_user("u" * 300)),
    Case("t05", "train", "pshare-lora: a user 'a\\0b' (NUL byte)", ps_user("a\x00b")),
    Case("t06", "train", "pshare-lora: users 1 and \"1\" in one file",
         lambda b, d: train(b, d, "pshare-lora", write_jsonl(d / "pairs.jsonl", [
             r | {"user": 1 if r["user"] == "ana" else "1"} for r in read_jsonl(pairs(b))]))),
    Case("t07", "train", "pshare-lora: a user with one pair", ps_data(solo_pair)),
    Case("t08", "train", "fslora: labels 10**11 (for 1)", fs_label(lambda y: 10**11 * y)),
    Case("t09", "train", "fslora: labels 10**30 (for 1)", fs_label(lambda y: 10**30 * y)),
    Case("t10", "train", "fslora: every label 1 (one class)", fs_label(lambda y: 1)),
    Case("t11", "train", "firm rewards=[nosuch]",
         lambda b, d: train(b, d, "firm", b.data / "prompts.jsonl", "rewards=[nosuch]")),
    Case("t12", "train", "meta-reward held_out=nosuchdomain",
         lambda b, d: train(b, d, "meta-reward", b.data / "pairs.jsonl", "held_out=nosuchdomain")),
    Case("t13", "train", "pshare-lora lora.targets=[nosuch]", ps_override("lora.targets=[nosuch]")),
    Case("t14", "train", "pshare-lora max_length=1000000 (tiny-llama: 1024 positions)",
         ps_override("max_length=1000000")),
    Case("t15", "train", "--out below a file (afile/run)", out_below_file),
    Case("t16", "train", "--out a dangling symlink", out_dangling_link),
    Case("t17", "train", "--out /proc/collabalign-hostile/run (unwritable)",
         lambda b, d: train(b, d, "pshare-lora", pairs(b), out=Path("/proc/collabalign-hostile/run"))),
    Case("t18", "train", "two pshare-lora (users ana/ben, zed/ben) into one --out, started together",
         pair_into_one_out),
    # train: data files
    Case("t19", "train", "affpcl: a truncated .npz", lambda b, d: train(b, d, "affpcl", truncated_npz(b, d))),
    Case("t20", "train", "affpcl: an .npz whose X_a inflates to 4 GiB (4 MiB file)",
         lambda b, d: train(b, d, "affpcl", npz_bomb(b.bombs / "npz-4gib.npz"))),
    Case("t21", "train", "pshare-lora: gzip of one 4 GiB line", ps_data(lambda b, d: line_bomb(b))),
    Case("t22", "train", "pshare-lora --data /dev/zero", ps_data(lambda b, d: "/dev/zero")),
    Case("t23", "train", "pshare-lora: 1 MiB gzip of 10**9 blank lines", ps_data(lambda b, d: blank_bomb(b))),
    Case("t24", "train", "pshare-lora: one valid line with a 50 MiB prompt", ps_data(fifty_mib_pair)),
    Case("t25", "train", "pshare-lora: a missing data file", ps_data(lambda b, d: d / "missing.jsonl")),
    Case("t26", "train", "pshare-lora: a folder as data file", ps_data(mkdir)),
    Case("t27", "train", "pshare-lora: a line of invalid JSON",
         ps_data(lambda b, d: with_line(b, d, b'{"prompt": "a", "chosen": '))),
    Case("t28", "train", "pshare-lora: a line with non-UTF-8 bytes",
         ps_data(lambda b, d: with_line(b, d, b'{"prompt": "caf\xe9\xff", "chosen": "a", "rejected": "b", '
                                              b'"user": "ana"}'))),
    # train: more careless inputs
    Case("t29", "train", "an unknown method (train nosuch)", lambda b, d: train(b, d, "nosuch", pairs(b))),
    Case("t30", "train", "pshare-lora nosuch=1 (unknown key)", ps_override("nosuch=1")),
    Case("t31", "train", "fedavg-lora rounds=1000000000",
         lambda b, d: train(b, d, "fedavg-lora", pairs(b), "rounds=1000000000")),
    Case("t32", "train", "pshare-lora: an empty data file", ps_data(new_file("empty.jsonl"))),
    Case("t33", "train", "--out an existing trained run",
         lambda b, d: train(b, d, "pshare-lora", pairs(b), out=copy_run(b.reward, d), guard=[d / "run"])),
    Case("t34", "train", "--out '' (the working folder, which holds a trained run)", out_empty_string),
    Case("t35", "train", "--config: YAML billion laughs in lora.targets",
         lambda b, d: Plan([b.cli("train", "pshare-lora", *SMALL["pshare-lora"], "--config",
                                  str(billion_laughs(d / "laughs.yaml")), "--data", str(pairs(b)), "--out",
                                  str(d / "out"), "--no-progress")], d / "out")),
    Case("t36", "train", "override lora.targets= 50,000 nested '['", ps_override("lora.targets=" + "[" * 50_000)),
    Case("t37", "train", "fslora: labels NaN", fs_label(lambda y: float("nan"))),
    Case("t38", "train", "pshare-lora --data /etc/passwd", ps_data(lambda b, d: "/etc/passwd")),
    Case("t39", "train", "pshare-lora: prompt, chosen and rejected all ''", ps_data(empty_strings)),
    Case("t40", "train", "pshare-lora lora.rank=1000000000", ps_override("lora.rank=1000000000")),
    # score
    Case("s01", "score", "adapter folder user-ana deleted",
         damaged_score(lambda r: shutil.rmtree(r / "adapters" / "user-ana"))),
    Case("s02", "score", "adapter_model.safetensors truncated",
         damaged_score(lambda r: truncate(r / "adapters" / "user-ana" / "adapter_model.safetensors"))),
    Case("s03", "score", "adapter_config.json invalid JSON",
         damaged_score(lambda r: (r / "adapters" / "user-ana" / "adapter_config.json").write_text("{not json"))),
    Case("s04", "score", "head.safetensors missing",
         damaged_score(lambda r: (r / "adapters" / "user-ana" / "head.safetensors").unlink())),
    Case("s05", "score", "manifest.json cut to 40 bytes",
         damaged_score(lambda r: (r / "manifest.json").write_bytes((r / "manifest.json").read_bytes()[:40]))),
    Case("s06", "score", "--user ../../x", lambda b, d: score_texts(b, b.reward, "--user", "../../x")),
    Case("s07", "score", "--user nosuch", lambda b, d: score_texts(b, b.reward, "--user", "nosuch")),
    Case("s08", "score", "--file a missing file",
         lambda b, d: score(b, b.reward, "--file", str(d / "missing.jsonl"), "--user", "ana")),
    Case("s09", "score", "no --file", lambda b, d: score(b, b.reward, "--user", "ana")),
    Case("s10", "score", "--file with a 50 MiB line",
         lambda b, d: score(b, b.reward, "--file", str(fifty_mib_text(b, d)), "--user", "ana")),
    Case("s11", "score", "a policy run (fed-tune)", lambda b, d: score_texts(b, b.policy)),
    Case("s12", "score", "a run folder that does not exist", lambda b, d: score_texts(b, d / "norun")),
    Case("s13", "score", "--adapter ../../../../etc", lambda b, d: score_texts(b, b.reward, "--adapter",
                                                                              "../../../../etc")),
    Case("s14", "score", "--file /dev/zero", lambda b, d: score(b, b.reward, "--file", "/dev/zero", "--user", "ana")),
    Case("s15", "score", "adapter_config.json r=1000000000",
         damaged_score(lambda r: edit_json(r / "adapters" / "user-ana" / "adapter_config.json", r=10**9))),
    Case("s16", "score", "manifest.json max_length=1000000000",
         damaged_score(lambda r: edit_json(r / "manifest.json", max_length=10**9))),
    Case("s17", "score", "manifest.json base_model nosuch-org/nosuch-model",
         damaged_score(lambda r: edit_json(r / "manifest.json", base_model="nosuch-org/nosuch-model"))),
    Case("s18", "score", "--file an empty file",
         lambda b, d: score(b, b.reward, "--file", str(new_file("empty.jsonl")(b, d)), "--user", "ana")),
    # generate
    Case("g01", "generate", "--max-new-tokens 0", prompt_gen("--max-new-tokens", "0")),
    Case("g02", "generate", "--max-new-tokens -5", prompt_gen("--max-new-tokens", "-5")),
    Case("g03", "generate", "--max-new-tokens 1000000000", prompt_gen("--max-new-tokens", "1000000000")),
    Case("g04", "generate", "--temperature nan", prompt_gen("--temperature", "nan")),
    Case("g05", "generate", "--temperature -1", prompt_gen("--temperature", "-1")),
    Case("g06", "generate", "a prompt of 300 words (> 256 tokens)", prompt_gen(prompt=" ".join(["basil"] * 300))),
    Case("g07", "generate", "a reward-model run (P-ShareLoRA)",
         lambda b, d: generate(b, "--prompt", "Hi", "--max-new-tokens", "4", run=b.reward)),
    Case("g08", "generate", "policy adapter_model.safetensors truncated",
         lambda b, d: generate(b, "--prompt", "Hi", "--max-new-tokens", "4", run=copy_run(
             b.policy, d, lambda r: truncate(r / "adapters" / "policy" / "adapter_model.safetensors")))),
    Case("g09", "generate", "--temperature inf", prompt_gen("--temperature", "inf")),
    Case("g10", "generate", "--prompt ''", prompt_gen(prompt="")),
    Case("g11", "generate", "a 96 KiB prompt (~16,000 tokens; 1024 positions)",
         prompt_gen(prompt="basil " * 16_000)),
    Case("g12", "generate", "--adapter nosuch", prompt_gen("--adapter", "nosuch")),
    Case("g13", "generate", "a prompt with non-UTF-8 bytes", prompt_gen(prompt=os.fsdecode(b"caf\xe9 \xff?"))),
    Case("g14", "generate", "--seed -1", prompt_gen("--seed", "-1")),
    # deploy
    Case("d01", "deploy", "quickstart/quick --nodes 3 (an experiment config)",
         lambda b, d: deploy(b, d, "--nodes", "3", config=["quickstart/quick"])),
    Case("d02", "deploy", "--nodes 0", dep("--nodes", "0")),
    Case("d03", "deploy", "--nodes -1", dep("--nodes", "-1")),
    Case("d04", "deploy", "--nodes 1000", dep("--nodes", "1000")),
    Case("d05", "deploy", "deploy/fslora --nodes 3 --node-config 0:rank=999 (real)",
         lambda b, d: deploy(b, d, "--nodes", "3", "--node-config", "0:rank=999", real=True,
                             config=["deploy/fslora", "model=tiny-llama", "rounds=1", "local_steps=1",
                                     "max_length=32", "engine.timeout_s=60"])),
    Case("d06", "deploy", "--node-config rank=4 (no node)", dep("--nodes", "3", "--node-config", "rank=4")),
    Case("d07", "deploy", "--out a folder `train` wrote (real)",
         lambda b, d: deploy(b, d, "--nodes", "3", out=copy_run(b.reward, d), guard=[d / "run"], real=True)),
    Case("d08", "deploy", "--out F holding the user's own deployment/mine.txt (real)", deploy_over_user_folder),
    Case("d09", "deploy", "a missing config file",
         lambda b, d: deploy(b, d, "--nodes", "3", config=[str(d / "missing.yaml")])),
    Case("d10", "deploy", "a config whose data is ../../../etc/passwd", deploy_config_outside),
    Case("d11", "deploy", "override nosuch=1", dep("nosuch=1", "--nodes", "3")),
    Case("d12", "deploy", "--out a file",
         lambda b, d: deploy(b, d, "--nodes", "3", out=new_file("afile", b"x")(b, d))),
    Case("d13", "deploy", "a folder as config", lambda b, d: deploy(b, d, "--nodes", "3", config=[str(d)])),
    Case("d14", "deploy", "--node-config 5:rank=4 (3 nodes)", dep("--nodes", "3", "--node-config", "5:rank=4")),
    Case("d15", "deploy", "deploy/fedavg-lora rounds=0", dep("rounds=0", "--nodes", "3")),
]


# ---- running a case ------------------------------------------------------------------------------------------------

def describe(proc: psutil.Process) -> str:
    try:
        return " ".join(Path(word).name for word in proc.cmdline()[:4])[:60]
    except psutil.Error:
        return f"pid {proc.pid}"


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def collect(roots: Iterable[psutil.Process], seen: dict[int, psutil.Process]) -> None:
    """Adds `roots` and all their descendants to `seen` (Flower's processes start sessions of their own, so only the
    process tree finds them)."""
    for root in roots:
        try:
            for proc in [root, *root.children(recursive=True)]:
                seen.setdefault(proc.pid, proc)
        except psutil.Error:
            continue


def supervise(argvs: list[list[str]], cwd: Path, env: dict[str, str], logs: Path, memory_cap: int,
              time_cap_s: float) -> Outcome:
    """Runs `argvs` together, each in a new session; polls the RSS of their process trees every 0.1 s and kills
    every process in them past either cap; then stops whatever they left running."""
    procs = []
    for i, argv in enumerate(argvs):
        with open(logs.with_suffix(f".{i}.stdout"), "wb") as out, open(logs.with_suffix(f".{i}.stderr"), "wb") as err:
            procs.append(subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                          start_new_session=True))
    seen: dict[int, psutil.Process] = {}
    start, peak, killed, stopped = time.monotonic(), 0, None, set()
    while True:
        running = [psutil.Process(p.pid) for p in procs if p.poll() is None]  # not reaped: the pid is still theirs
        collect(running, seen)
        rss = 0
        for proc in seen.values():
            try:
                rss += proc.memory_info().rss if alive(proc) else 0
            except psutil.Error:
                continue
        peak = max(peak, rss)
        if not running:
            break
        if rss > memory_cap or time.monotonic() - start > time_cap_s:
            killed = "memory" if rss > memory_cap else "time"
            collect(running, seen)
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    stopped.add(p.pid)
            break
        time.sleep(0.1)
    collect([p for p in seen.values() if alive(p)], seen)
    leftovers = [p for p in seen.values() if alive(p) and p.pid not in {q.pid for q in procs}]
    left = [] if killed else [describe(p) for p in leftovers]  # a killed case's descendants are no news
    for proc in leftovers:
        try:
            proc.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(leftovers, timeout=10)
    codes = [p.wait() for p in procs]
    exits = [f"killed: {killed}" if p.pid in stopped else str(code) for p, code in zip(procs, codes, strict=True)]
    return Outcome(exits, time.monotonic() - start, peak / (1 << 20), left)


def snapshot(root: Path, skip: set[Path]) -> dict[str, tuple]:
    """Every entry below `root` but those in `skip` (and below them): files by size, mtime and mode, folders by mode,
    links by target."""
    entries: dict[str, tuple] = {}

    def walk(folder: Path) -> None:
        for entry in os.scandir(folder):
            path = Path(entry.path)
            if path in skip:
                continue
            st = entry.stat(follow_symlinks=False)
            rel = str(path.relative_to(root))
            if entry.is_symlink():
                entries[rel] = ("link", os.readlink(path))
            elif entry.is_dir(follow_symlinks=False):
                entries[rel] = ("dir", st.st_mode)
                walk(path)
            else:
                entries[rel] = ("file", st.st_size, st.st_mtime_ns, st.st_mode)

    walk(root)
    return entries


def changes(before: dict[str, tuple], after: dict[str, tuple], root: Path, skip: set[Path]) -> list[str]:
    """'+path' (new), '-path' (gone), '~path' (changed); a new folder that leads to a skipped path (--out's parents)
    is not a change."""
    parents = {str(p.relative_to(root)) for s in skip if s.is_relative_to(root) for p in s.parents
               if p.is_relative_to(root) and p != root}
    added = [f"+{k}" for k in sorted(after.keys() - before.keys()) if not (after[k][0] == "dir" and k in parents)]
    gone = [f"-{k}" for k in sorted(before.keys() - after.keys())]
    changed = [f"~{k}" for k in sorted(before.keys() & after.keys()) if before[k] != after[k]]
    return added + gone + changed


def digest(path: Path) -> dict[str, str]:
    """sha256 of every file at or below `path` by its relative name (empty when nothing is there)."""
    if path.is_symlink() or path.is_file():
        return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()}
    files = sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink()) if path.is_dir() else []
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def result_change(before: dict[Path, dict[str, str]], after: dict[Path, dict[str, str]], root: Path) -> str:
    """'no', or which files of the guarded runs were lost, changed or added."""
    found = []
    for path, old in before.items():
        new, name = after[path], path.relative_to(root)
        lost = sorted(old.keys() - new.keys())
        changed = sorted(k for k in old.keys() & new.keys() if old[k] != new[k])
        added = sorted(new.keys() - old.keys())
        for what, names in (("LOST", lost), ("CHANGED", changed), ("added", added)):
            if names:
                found.append(f"{what} {len(names)} in {name}: {', '.join(names[:3])}")
    return "; ".join(found) or "no"


def stderr_summary(path: Path) -> tuple[str, bool, str]:
    """(the first line, or where it opens a traceback '[tb] ' and the exception's line; whether a traceback is in it;
    its last 2,000 characters)."""
    traceback, tail, head = False, b"", b""
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            traceback = traceback or TRACEBACK in tail[-64:] + block
            head = head or block[:1 << 16]
            tail = (tail + block)[-(1 << 14):]
    text = tail.decode(errors="replace")
    lines = [line for line in head.decode(errors="replace").splitlines() if line.strip()]
    first = lines[0] if lines else ""
    if first.startswith("Traceback"):
        raised = [line for line in text.splitlines() if EXCEPTION_LINE.match(line)]
        first = "[tb] " + (raised[-1] if raised else text.strip().splitlines()[-1])
    return first, traceback, text[-2000:]


def run_case(case: Case, box: Sandbox, logs: Path, memory_cap: int, time_cap_s: float) -> Row:
    folder = box.cases / case.id
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    plan = case.plan(box, folder)
    out = plan.out
    skip = {Path(os.path.abspath(out)), Path(os.path.realpath(out))} if out is not None else set()
    guards = [box.reward, box.policy, *plan.guard]
    tree, runs = snapshot(box.root, skip), {g: digest(g) for g in guards}
    outcome = supervise(plan.argvs, folder, box.env(), logs / case.id, memory_cap, plan.time_cap_s or time_cap_s)
    outside = changes(tree, snapshot(box.root, skip), box.root, skip)
    result = result_change(runs, {g: digest(g) for g in guards}, box.root)
    summaries = [stderr_summary(logs / f"{case.id}.{i}.stderr") for i in range(len(plan.argvs))]
    notes = [f"left running, stopped: {', '.join(outcome.leftovers)}"] if outcome.leftovers else []
    stdout = sum((logs / f"{case.id}.{i}.stdout").stat().st_size for i in range(len(plan.argvs)))
    if stdout > 1 << 20:
        notes.append(f"stdout {stdout / (1 << 20):.0f} MiB")
    if plan.check is not None:
        notes.append(plan.check())
    return Row(case.id, case.command, case.input, "/".join(outcome.exits), " | ".join(s[0] for s in summaries),
               any(s[1] for s in summaries), round(outcome.seconds, 1), round(outcome.peak_mb), outside, result,
               "; ".join(notes), "\n---\n".join(s[2] for s in summaries))


# ---- preparation and report ----------------------------------------------------------------------------------------

def prepare(box: Sandbox) -> str:
    """Example data, the shipped example files the deploy configs read, the bombs, and the two trained runs (anew:
    they come from this source tree); returns the path collabalign is imported from."""
    for name in ("data", "home", "tmp", "cache", "flwr-home", "bombs", "cases"):
        (box.root / name).mkdir(parents=True, exist_ok=True)
    code = ("import sys, collabalign; from collabalign.examples import write_examples; "
            "from collabalign.jobs import example_file; write_examples(sys.argv[1]); "
            "[example_file(n) for n in ('pairs', 'labelled', 'prompts')]; print(collabalign.__file__)")
    where = _run(box, [box.python, "-c", code, str(box.data)]).strip()
    if not Path(where).resolve().is_relative_to(box.src.resolve()):
        raise SystemExit(f"collabalign is imported from {where}, not from --src {box.src}")
    write_jsonl(pairs(box), [r for r in read_jsonl(box.data / "pairs.jsonl") if r["user"] in ("ana", "ben")])
    npz_bomb(box.bombs / "npz-4gib.npz")
    line_bomb(box)
    blank_bomb(box)
    shutil.rmtree(box.root / "runs", ignore_errors=True)
    _run(box, box.cli("train", "pshare-lora", *SMALL["pshare-lora"], "--data", str(pairs(box)), "--out",
                      str(box.reward), "--no-progress"))
    _run(box, box.cli("train", "fed-tune", *SMALL["fed-tune"], "--data", str(box.data / "pairs.jsonl"), "--out",
                      str(box.policy), "--no-progress"))
    return where


def _run(box: Sandbox, argv: list[str]) -> str:
    done = subprocess.run(argv, cwd=box.root, env=box.env(), capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"preparation failed: {' '.join(argv)}\n{done.stderr[-3000:]}")
    return done.stdout


def cell(text: str) -> str:
    text = " ".join(text.split())
    text = text if len(text) <= CELL_CHARS else text[:CELL_CHARS - 1] + "…"
    return text.replace("|", "\\|")


def totals(rows: list[Row]) -> list[str]:
    exits = Counter(r.exit for r in rows)
    killed = Counter(e for r in rows for e in r.exit.split("/") if e.startswith("killed"))
    return [f"- cases: {len(rows)}",
            f"- tracebacks: {sum(r.traceback for r in rows)} ({', '.join(r.id for r in rows if r.traceback)})",
            f"- exit codes: {', '.join(f'{k}: {v}' for k, v in sorted(exits.items()))}",
            f"- wrote outside --out: {sum(bool(r.outside) for r in rows)} "
            f"({', '.join(r.id for r in rows if r.outside)})",
            f"- trained result lost or changed: {sum(r.result != 'no' for r in rows)} "
            f"({', '.join(r.id for r in rows if r.result != 'no')})",
            f"- killed for memory: {killed['killed: memory']}, for time: {killed['killed: time']}",
            f"- left processes running: {sum('left running' in r.notes for r in rows)}"]


def write_report(rows: list[Row], meta: dict[str, object], out: Path) -> None:
    (out / "hostile.json").write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1) + "\n")
    lines = ["# Hostile inputs", "", *(f"- {k}: {v}" for k, v in meta.items()), "",
             "| id | command | input | exit | stderr (first line) | traceback | s | peak MB | written outside --out "
             "| trained run lost/changed | notes |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        outside = f"{len(r.outside)}: {', '.join(r.outside[:3])}" if r.outside else "no"
        lines.append(f"| {r.id} | {r.command} | {cell(r.input)} | {r.exit} | {cell(r.stderr)} | "
                     f"{'YES' if r.traceback else 'no'} | {r.seconds:g} | {r.peak_mb:g} | {cell(outside)} | "
                     f"{cell(r.result)} | {cell(r.notes)} |")
    (out / "hostile.md").write_text("\n".join([*lines, "", "Totals:", "", *totals(rows)]) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=Path(__file__).resolve().parents[1] / "src",
                        help="the source tree to test (first on PYTHONPATH)")
    parser.add_argument("--python", default="/work/main/.venv/bin/python")
    parser.add_argument("--out", type=Path, default=Path("/tmp/hostile"), help="table, JSON, logs and sandbox")
    parser.add_argument("--only", nargs="+", default=[], help="case ids (e.g. t01 s02 d07, or t01,s02)")
    parser.add_argument("--memory-cap-gb", type=float, default=6.0)
    parser.add_argument("--time-cap", type=float, default=150.0, help="seconds per case (real deployments: "
                        f"{REAL_DEPLOY_CAP_S:g})")
    args = parser.parse_args()
    only = {i for item in args.only for i in item.split(",") if i}
    unknown = only - {c.id for c in CASES}
    if unknown:
        parser.error(f"unknown case ids: {', '.join(sorted(unknown))}")
    out = args.out.resolve()
    box, logs = Sandbox(out / "sandbox", args.python, args.src.resolve()), out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    print(f"preparing {box.root} ...", file=sys.stderr)
    meta: dict[str, object] = {"src": str(box.src), "collabalign imported from": prepare(box), "python": box.python,
                               "memory cap GB": args.memory_cap_gb, "time cap s": args.time_cap,
                               "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    rows: list[Row] = []
    for case in [c for c in CASES if not only or c.id in only]:
        row = run_case(case, box, logs, int(args.memory_cap_gb * GIB), args.time_cap)
        rows.append(row)
        print(f"{row.id} {row.command:8s} exit {row.exit:>14s} {row.seconds:6.1f} s {row.peak_mb:6.0f} MB "
              f"tb={row.traceback} outside={len(row.outside)} result={row.result[:40]} :: {row.stderr[:80]}",
              file=sys.stderr, flush=True)
        write_report(rows, meta, out)
    print(out / "hostile.md")


if __name__ == "__main__":
    main()
