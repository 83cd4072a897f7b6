"""What each `collabalign` command does, apart from parsing its arguments (`cli.py`): run, resume and report an
experiment, train a method through its entry point, score and generate with a saved run."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel, ValidationError

from collabalign.artifacts import ArtifactError
from collabalign.comm import MessageError
from collabalign.config import (
    ConfigError,
    apply_overrides,
    cut,
    field_problems,
    parse_override,
    read_yaml,
    short,
    validate,
)
from collabalign.data.errors import DataError, PromptError
from collabalign.experiments import EXPERIMENTS
from collabalign.federation.checkpoint import CheckpointError
from collabalign.federation.engine import RoundFailed
from collabalign.folders import claimed_folder
from collabalign.registry import METHODS
from collabalign.report import summarise_reports, write_report
from collabalign.runs import RunDir, fingerprint

CONFIG_DIR = Path(__file__).parent / "configs"
# one line and exit code 2, never a traceback
USER_ERRORS = (ArtifactError, CheckpointError, ConfigError, DataError, MessageError, PromptError, ValidationError)
MAX_ERROR_CHARS = 1000  # an error line is cut to this length


def experiment(name: str) -> ModuleType:
    if name not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment {short(name)}; known: {', '.join(sorted(EXPERIMENTS))}")
    return importlib.import_module(EXPERIMENTS[name])


def load_config(path: Path, overrides: list[str] = ()) -> tuple[str, ModuleType, Any, bool]:
    """A config file with overrides -> (experiment name, its module, its validated Config, smoke flag)."""
    data = apply_overrides(read_yaml(path), list(overrides))
    name = data.pop("experiment", None)
    if not isinstance(name, str):
        raise ConfigError(f"{path}: experiment = {short(name)}: must be one of {', '.join(sorted(EXPERIMENTS))}")
    smoke = data.pop("smoke", False)  # a quick config: its report says it is a low-power smoke run
    if not isinstance(smoke, bool):
        raise ConfigError(f"{path}: smoke = {short(smoke)}: must be true or false")
    module = experiment(name)
    return name, module, validate(module.Config, data, str(path)), smoke


def check_devices(cfg: BaseModel, prefix: str = "") -> None:
    """A ConfigError unless every `device` setting of `cfg` names a device torch knows and this machine has."""
    import torch

    for key, value in cfg:
        if isinstance(value, BaseModel):
            check_devices(value, f"{prefix}{key}.")
        elif key == "device" and isinstance(value, str):
            try:
                device = torch.device(value)
            except RuntimeError:
                raise ConfigError(f"{prefix}{key} = {short(value)}: not a torch device (cpu, cuda, cuda:N, mps, "
                                  "meta)") from None
            if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
                raise ConfigError(f"{prefix}{key} = {short(value)}: this machine has {torch.cuda.device_count()} "
                                  "CUDA device(s); use cpu")
            if device.type == "mps" and not torch.backends.mps.is_available():
                raise ConfigError(f"{prefix}{key} = {short(value)}: MPS is not available here; use cpu")


def run_config(path: Path, overrides: list[str], out: Path | None, progress: bool = True, force: bool = False) -> Path:
    """Validates the config, runs its experiment into a run directory and writes the report; returns report.md.

    A folder that already holds this config continues it (finished simulations and cached parts are read back);
    one holding a run of another config is refused unless `force`, which also drops its stale checkpoints; one
    holding anything else is refused (`folders.claimed_folder`)."""
    path = resolve_config(path)
    name, module, cfg, smoke = load_config(path, overrides)
    check_devices(cfg)
    config = {"experiment": name, "smoke": smoke, **cfg.model_dump(mode="json")}
    target = out or Path("runs") / f"{name}-{path.stem}"
    with claimed_folder(target, "run", fingerprint(config), force) as claim:
        run = RunDir(target)
        run.read_status()  # an unreadable status.json is refused before anything is written
        if claim.replaced:
            shutil.rmtree(target / "checkpoints", ignore_errors=True)
        run.write_config(config)
        return _execute(run, name, module, cfg, progress)


def _execute(run: RunDir, name: str, module: ModuleType, cfg: Any, progress: bool) -> Path:
    """Runs the experiment in `run` with its status file kept current: a crash leaves 'failed' and the error; a user
    error (bad data, unreadable checkpoint) leaves the status the folder had, or 'failed' in a new folder."""
    saved = run.saved_status()
    run.write_status("running")
    start = time.perf_counter()
    try:
        with run.active():
            module.run(cfg, run, progress)
    except USER_ERRORS as err:
        if saved is not None:
            run.restore_status(saved)
        else:
            run.write_status("failed", error_line(err))
        raise
    except BaseException as err:
        run.write_status("failed", f"{type(err).__name__}: {err}".splitlines()[0])
        if isinstance(err, RoundFailed):
            raise RoundFailed(f"{err}; `collabalign resume {run.path}` continues from the last completed round") \
                from None
        raise
    run.write_status("finished")
    print(f"{name}: finished in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return write_report(run.path, module.TITLE)


def resume(run_dir: Path, progress: bool = True) -> Path:
    """Continues the run in `run_dir` from its config snapshot and checkpoints (see `RunDir.next_checkpoint`)."""
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{run_dir}: not a run directory (no config.yaml)")
    with claimed_folder(run_dir, "resume"):
        run = RunDir(run_dir)
        config = run.read_config()
        name = config.pop("experiment", None)
        smoke = config.pop("smoke", False)
        module = experiment(str(name))
        cfg = validate(module.Config, config, str(run_dir / "config.yaml"))
        check_devices(cfg)
        if run.read_status().get("status") == "finished":
            print(f"{run_dir}: already finished", file=sys.stderr)
            return write_report(run.path, module.TITLE)
        run.write_config({"experiment": name, "smoke": smoke, **cfg.model_dump(mode="json")})
        return _execute(run, str(name), module, cfg, progress)


def report(folder: Path) -> Path:
    """Rewrites report.md of a run folder (finished, failed or killed), or of every run below a `reproduce` folder
    and its index."""
    if (folder / "config.yaml").exists():
        with claimed_folder(folder, "report"):
            name = RunDir(folder, create=False).read_config().get("experiment")
            return write_report(folder, experiment(name).TITLE if name in EXPERIMENTS else "")
    runs = sorted(p.parent for p in folder.glob("*/config.yaml")) if folder.is_dir() else []
    if not runs:
        raise ConfigError(f"{folder}: not a run directory (no config.yaml) nor a folder of runs")
    for run in runs:
        report(run)
    with claimed_folder(folder, "report"):
        return summarise_reports([r for r in runs if (r / "summary.json").exists()], folder)


def resolve_config(path: Path) -> Path:
    """A config file, or a shipped config by the name `collabalign list` prints (e.g. quickstart/main)."""
    if path.exists() or len(path.parts) != 2:
        return path
    shipped = config_dir(path.parts[0]) / f"{path.parts[1]}.yaml"
    return shipped if shipped.exists() else path


def config_dir(name: str) -> Path:
    """An experiment's config folder: its name with '-' as '_' (pshare-lora -> configs/pshare_lora)."""
    return CONFIG_DIR / name.replace("-", "_")


def config_path(name: str, quick: bool) -> Path:
    return config_dir(name) / ("quick.yaml" if quick else "main.yaml")


def train(method: str, data: Path, config: Path | None, overrides: list[str], out: Path, progress: bool) -> Path:
    """Trains `method` through its entry point on a data file (config from a YAML file and/or overrides) and saves
    the result in `out`, a new or empty folder held for the whole run (`folders.claimed_folder`): a failed run leaves it
    as it was. Returns the manifest's path."""
    if method not in METHODS:
        raise ConfigError(f"unknown method {short(method)}; known: {', '.join(METHODS)}")
    entry = METHODS[method]
    module = importlib.import_module(entry.module)
    values = apply_overrides(read_yaml(config) if config is not None else {}, overrides)
    cfg = validate(getattr(module, entry.config), values, str(config or "overrides"))
    check_devices(cfg)
    with claimed_folder(out, "train") as claim:
        try:
            result = getattr(module, entry.train)(cfg, data, progress=progress)
            result.save(out)
        except BaseException:
            claim.discard()
            raise
    shown = {k: v for k, v in result.metrics.items() if isinstance(v, int | float | str)}
    print(f"{method}: {json.dumps(shown)}", file=sys.stderr)
    if "baseline" in result.metrics:
        from collabalign.baselines import sentence

        print(sentence(method, result.metrics["baseline"]), file=sys.stderr)
    return out / "manifest.json"


def node_settings(items: list[str], nodes: int) -> dict[int, dict[str, Any]]:
    """`--node-config I:KEY=VALUE` items by node (values read as YAML scalars: 4 is a number)."""
    out: dict[int, dict[str, Any]] = {}
    for item in items:
        node, sep, setting = item.partition(":")
        key, eq, value = setting.partition("=")
        if not (sep and eq and node.isdigit() and key) or int(node) >= nodes:
            raise ConfigError(f"--node-config {item}: must be I:KEY=VALUE with I a node 0..{nodes - 1}")
        out.setdefault(int(node), {})[key] = parse_override(f"{key}={value}")[1]
    return out


def score(run: Path, file: Path, user: str | None, adapter: str | None) -> None:
    """Prints each text of `file` as a JSON line with its score (a reward model) or scores (a classifier)."""
    from collabalign.data.formats import load_texts
    from collabalign.models.saved import SavedScorer

    texts, second = load_texts(file)
    scores = SavedScorer(run, f"user-{user}" if user is not None else adapter)(texts, second)
    for i, text in enumerate(texts):
        value = scores[i].tolist()
        print(json.dumps({"text": text, **({"text_pair": second[i]} if second else {}),
                          ("score" if scores.ndim == 1 else "scores"): value}))


def generate(run: Path, prompts: list[str], adapter: str | None, max_new_tokens: int, temperature: float,
             seed: int) -> None:
    """Prints one reply per prompt from the run's saved policy (each prompt checked before the policy loads)."""
    from collabalign.policy.saved import saved_policy
    from collabalign.seeding import Seeds

    for i, prompt in enumerate(prompts):
        if not prompt.strip():
            raise ConfigError(f"--prompt {i + 1}: empty")
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(f"--prompt {i + 1}: not valid UTF-8 text") from None

    policy = saved_policy(run, adapter)
    rollout = policy.generate(prompts, max_new_tokens, generator=Seeds(seed).torch("generate"),
                              temperature=temperature)
    for text in rollout.responses:
        print(text)

def error_line(err: Exception) -> str:
    """A user error in one line, 'file: field: problem'; a multi-line message's lines are joined with '; '."""
    if isinstance(err, ValidationError):
        return cut(f"{err.title}: invalid value(s): " + "; ".join(field_problems(err)), MAX_ERROR_CHARS)
    head, *rest = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
    return cut(head + (": " + "; ".join(rest) if rest else ""), MAX_ERROR_CHARS)
