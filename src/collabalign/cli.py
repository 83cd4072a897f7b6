"""`collabalign run CONFIG [a.b=value ...]`, `reproduce NAME|all [--quick] [--out DIR]`, `report RUN_DIR`, `list`."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from collabalign.config import ConfigError, apply_overrides, read_yaml, validate
from collabalign.experiments import EXPERIMENTS
from collabalign.report import summarise_reports, write_report
from collabalign.runs import RunDir

CONFIG_DIR = Path(__file__).parent / "configs"


def _experiment(name: str) -> ModuleType:
    if name not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment {name!r}; known: {', '.join(sorted(EXPERIMENTS))}")
    return importlib.import_module(EXPERIMENTS[name])


def load_config(path: Path, overrides: list[str] = ()) -> tuple[str, ModuleType, Any, bool]:
    """A config file with overrides -> (experiment name, its module, its validated Config, smoke flag)."""
    data = apply_overrides(read_yaml(path), list(overrides))
    name = data.pop("experiment", None)
    if name is None:
        raise ConfigError(f"{path}: missing key 'experiment' (one of {', '.join(sorted(EXPERIMENTS))})")
    smoke = data.pop("smoke", False)  # a quick config: its report says it is a low-power smoke run
    if not isinstance(smoke, bool):
        raise ConfigError(f"{path}: smoke = {smoke!r}: must be true or false")
    module = _experiment(name)
    return name, module, validate(module.Config, data, str(path)), smoke


def run_config(path: Path, overrides: list[str], out: Path | None, progress: bool = True) -> Path:
    """Validates the config, runs its experiment into a run directory and writes the report; returns report.md."""
    name, module, cfg, smoke = load_config(path, overrides)
    run = RunDir(out or Path("runs") / f"{name}-{path.stem}")
    run.write_config({"experiment": name, "smoke": smoke, **cfg.model_dump(mode="json")})
    start = time.perf_counter()
    module.run(cfg, run, progress)
    print(f"{name}: finished in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return write_report(run.path, module.TITLE)


def config_dir(name: str) -> Path:
    """An experiment's config folder: its name with '-' as '_' (pshare-lora -> configs/pshare_lora)."""
    return CONFIG_DIR / name.replace("-", "_")


def config_path(name: str, quick: bool) -> Path:
    return config_dir(name) / ("quick.yaml" if quick else "main.yaml")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="collabalign", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run one experiment config")
    p_run.add_argument("config", type=Path)
    p_run.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr=0.001")
    p_run.add_argument("--out", type=Path)
    p_rep = sub.add_parser("reproduce", help="run a paper's reproduction (or all)")
    p_rep.add_argument("name", help=f"one of: all, {', '.join(sorted(EXPERIMENTS))}")
    p_rep.add_argument("--quick", action="store_true", help="the small CI-sized config")
    p_rep.add_argument("--out", type=Path, default=Path("runs"))
    p_report = sub.add_parser("report", help="rewrite report.md of a run directory")
    p_report.add_argument("run_dir", type=Path)
    sub.add_parser("list", help="list experiments and their configs")
    for p in (p_run, p_rep):
        p.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.command == "run":
            print(run_config(args.config, args.overrides, args.out, not args.no_progress))
        elif args.command == "reproduce":
            names = sorted(EXPERIMENTS) if args.name == "all" else [args.name]
            _experiment(names[0])  # validates the name before any work
            dirs = []
            for name in names:
                report = run_config(config_path(name, args.quick), [], args.out / name, not args.no_progress)
                dirs.append(report.parent)
                print(report)
            if len(names) > 1:
                print(summarise_reports(dirs, args.out))
        elif args.command == "report":
            if not (args.run_dir / "summary.json").exists():
                raise ConfigError(f"{args.run_dir}: not a run directory (no summary.json)")
            name = RunDir(args.run_dir).read_config().get("experiment")
            print(write_report(args.run_dir, _experiment(name).TITLE if name in EXPERIMENTS else ""))
        else:
            for name in sorted(EXPERIMENTS):
                configs = ", ".join(sorted(str(p.relative_to(CONFIG_DIR)) for p in config_dir(name).glob("*.yaml")))
                print(f"{name:14s} {configs}")
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
