"""`collabalign run CONFIG [a.b=value ...] [--out DIR] [--force]`, `resume RUN_DIR`, `reproduce NAME|all [--quick]
[--out DIR]`, `report DIR`, `list`, `train METHOD --data FILE [a.b=value ...] --out DIR`,
`score RUN --file TEXTS.jsonl [--user U]`, `generate RUN --prompt TEXT`, `demo [--out DIR]`,
`deploy CONFIG --nodes N --out DIR`, `node-worker SOCKET`."""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

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
from collabalign.deployment import MAX_NODES
from collabalign.experiments import EXPERIMENTS
from collabalign.federation.checkpoint import CheckpointError
from collabalign.federation.engine import RoundFailed
from collabalign.registry import METHODS
from collabalign.report import summarise_reports, write_report
from collabalign.runs import RunDir, claimed_folder, fingerprint

CONFIG_DIR = Path(__file__).parent / "configs"
# one line and exit code 2, never a traceback
USER_ERRORS = (ArtifactError, CheckpointError, ConfigError, DataError, MessageError, PromptError, ValidationError)
MAX_ERROR_CHARS = 1000  # an error line is cut to this length
MAX_NEW_TOKENS = 4096  # `generate --max-new-tokens`


def _experiment(name: str) -> ModuleType:
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
    module = _experiment(name)
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
    holding anything else is refused (`runs.claimed_folder`)."""
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
        module = _experiment(str(name))
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
            return write_report(folder, _experiment(name).TITLE if name in EXPERIMENTS else "")
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


def out_of_memory(err: BaseException) -> bool:
    """Whether `err` is a failed allocation (Python's, or torch's on the CPU or an accelerator)."""
    return isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError" \
        or "can't allocate memory" in str(err) or "out of memory" in str(err).lower()


def error_line(err: Exception) -> str:
    """A user error in one line, 'file: field: problem'; a multi-line message's lines are joined with '; '."""
    if isinstance(err, ValidationError):
        return cut(f"{err.title}: invalid value(s): " + "; ".join(field_problems(err)), MAX_ERROR_CHARS)
    head, *rest = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
    return cut(head + (": " + "; ".join(rest) if rest else ""), MAX_ERROR_CHARS)


def train(method: str, data: Path, config: Path | None, overrides: list[str], out: Path, progress: bool) -> Path:
    """Trains `method` through its entry point on a data file (config from a YAML file and/or overrides) and saves
    the result in `out`, a new or empty folder held for the whole run (`runs.claimed_folder`): a failed run leaves it
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


def _in(kind: type[int] | type[float], low: float, high: float) -> Callable[[str], int | float]:
    """An argparse type: a number of `kind` in [low, high] (NaN never is), checked before anything loads."""
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{short(text)}: not {'an integer' if kind is int else 'a number'}") \
                from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{short(text)}: must be in {low:,}..{high:,}")
        return value

    return parse


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors as one line, like every other user error (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {cut(' '.join(message.splitlines()), MAX_ERROR_CHARS)} (see `{self.prog} --help`)\n")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="collabalign", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run one experiment config")
    p_run.add_argument("config", type=Path, help="a YAML file, or a name from `collabalign list`")
    p_run.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr=0.001")
    p_run.add_argument("--out", type=Path)
    p_run.add_argument("--force", action="store_true", help="reuse an --out folder that holds another run")
    p_resume = sub.add_parser("resume", help="continue a stopped or killed run from its checkpoints")
    p_resume.add_argument("run_dir", type=Path)
    p_rep = sub.add_parser("reproduce", help="run a paper's reproduction (or all)")
    p_rep.add_argument("name", help=f"one of: all, {', '.join(sorted(EXPERIMENTS))}")
    p_rep.add_argument("--quick", action="store_true", help="the small CI-sized config")
    p_rep.add_argument("--out", type=Path, default=Path("runs/reproduce"),
                       help="a folder for the experiments' run folders (new, or one `reproduce` wrote)")
    p_report = sub.add_parser("report", help="rewrite report.md of a run directory")
    p_report.add_argument("run_dir", type=Path)
    sub.add_parser("list", help="list experiments and their configs")
    p_train = sub.add_parser("train", help="train a method on your own data file and save its adapters")
    p_train.add_argument("method", help=f"one of: {', '.join(METHODS)}")
    p_train.add_argument("overrides", nargs="*", help="config values, e.g. model=smollm2-135m lora.rank=4")
    p_train.add_argument("--data", type=Path, required=True, help="the method's JSONL file (AffPCL: an .npz file)")
    p_train.add_argument("--config", type=Path, help="a YAML file with the method's config")
    p_train.add_argument("--out", type=Path, required=True, help="an empty or new folder for the saved run")
    p_score = sub.add_parser("score", help="score texts with a saved reward model or classifier (JSON lines out)")
    p_score.add_argument("run_dir", type=Path, help="a folder an entry point saved (manifest.json, adapters/)")
    p_score.add_argument("--file", type=Path, required=True,
                         help='JSONL rows {"text", "text_pair"?} or {"prompt", "response"}')
    p_score.add_argument("--user", help="a P-ShareLoRA user's own reward model (adapter user-USER)")
    p_score.add_argument("--adapter", help="which saved adapter (default: the only one, or global)")
    p_demo = sub.add_parser("demo", help="train each method on the example data and write one report")
    p_demo.add_argument("--out", type=Path, default=Path("runs/demo"))
    p_gen = sub.add_parser("generate", help="sample replies from a saved policy")
    p_gen.add_argument("run_dir", type=Path)
    p_gen.add_argument("--prompt", action="append", required=True, help="a prompt (repeat for several)")
    p_gen.add_argument("--adapter", help="which saved adapter (default: the only one)")
    p_gen.add_argument("--max-new-tokens", type=_in(int, 1, MAX_NEW_TOKENS), default=64)
    p_gen.add_argument("--temperature", type=_in(float, 0, 100), default=0.0, help="0: greedy")
    p_gen.add_argument("--seed", type=_in(int, 0, 2**32 - 1), default=0)
    p_deploy = sub.add_parser("deploy", help="run a federated method on a loopback Flower deployment (TLS, node auth)")
    p_deploy.add_argument("config", type=Path, help="a deployment config (method, data, settings), e.g. "
                          "deploy/fedavg-lora")
    p_deploy.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rounds=2")
    p_deploy.add_argument("--nodes", type=_in(int, 1, MAX_NODES), required=True,
                          help="SuperNodes to start: one per client of the job")
    p_deploy.add_argument("--out", type=Path, required=True,
                          help="the run folder (a new one, or one to continue from its checkpoint)")
    p_deploy.add_argument("--node-config", action="append", default=[], metavar="I:KEY=VALUE",
                          help="what SuperNode I declares in its node config, e.g. 0:rank=4 (FSLoRA: its LoRA rank)")
    p_worker = sub.add_parser("node-worker", help="serve a SuperNode's ClientApp messages from memory (deployments)")
    p_worker.add_argument("socket", type=Path, help="the Unix socket to listen on (node config: worker=SOCKET)")
    for p in (p_run, p_resume, p_rep, p_train, p_deploy):
        p.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.command == "run":
            print(run_config(args.config, args.overrides, args.out, not args.no_progress, args.force))
        elif args.command == "resume":
            print(resume(args.run_dir, not args.no_progress))
        elif args.command == "reproduce":
            names = sorted(EXPERIMENTS) if args.name == "all" else [args.name]
            _experiment(names[0])  # validates the name before any work
            with claimed_folder(args.out, "reproduce"):
                dirs = []
                for name in names:
                    written = run_config(config_path(name, args.quick), [], args.out / name, not args.no_progress)
                    dirs.append(written.parent)
                    print(written)
                if len(names) > 1:
                    print(summarise_reports(dirs, args.out))
        elif args.command == "report":
            print(report(args.run_dir))
        elif args.command == "train":
            print(train(args.method, args.data, args.config, args.overrides, args.out, not args.no_progress))
        elif args.command == "score":
            score(args.run_dir, args.file, args.user, args.adapter)
        elif args.command == "demo":
            from collabalign.demo import run_demo

            with claimed_folder(args.out, "demo"):
                print(run_demo(args.out))
        elif args.command == "deploy":
            from collabalign.deployment import deploy

            try:
                print(deploy(resolve_config(args.config), args.overrides, args.nodes, args.out, not args.no_progress,
                             node_settings=node_settings(args.node_config, args.nodes)))
            except KeyboardInterrupt:
                print(f"deploy: interrupted; every process it started is stopped; run it again with --out {args.out} "
                      "to continue from the last completed round", file=sys.stderr)
                return 130
        elif args.command == "node-worker":
            from collabalign.node import serve

            serve(args.socket)
        elif args.command == "generate":
            generate(args.run_dir, args.prompt, args.adapter, args.max_new_tokens, args.temperature, args.seed)
        else:
            print("config name (for `collabalign run NAME`)   file")
            for name in sorted(EXPERIMENTS):
                for path in sorted(config_dir(name).glob("*.yaml")):
                    print(f"{name + '/' + path.stem:40s} {path}")
            print("\ndeployment config (`collabalign deploy NAME`) file")
            for path in sorted(config_dir("deploy").glob("*.yaml")):
                print(f"{'deploy/' + path.stem:40s} {path}")
    except USER_ERRORS as err:
        print(f"error: {error_line(err)}", file=sys.stderr)
        return 2
    except RoundFailed as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{args.command}: interrupted; a `run` continues with `collabalign resume`, a `train` left nothing",
              file=sys.stderr)
        return 130
    except (MemoryError, RuntimeError) as err:  # a setting that asks for more memory than the machine has
        if not out_of_memory(err):
            raise
        print(f"error: out of memory ({error_line(err)}); a setting asks for more than this machine has (e.g. "
              "lora.rank, batch_size, max_length, users)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
