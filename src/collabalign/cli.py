"""`collabalign run CONFIG [a.b=value ...] [--out DIR] [--force]`, `resume RUN_DIR`, `reproduce NAME|all [--quick]
[--out DIR]`, `report DIR`, `list`, `train METHOD --data FILE [a.b=value ...] --out DIR`,
`score RUN --file TEXTS.jsonl [--user U]`, `generate RUN --prompt TEXT`, `demo [--out DIR]`,
`deploy CONFIG --nodes N --out DIR`, `node-worker SOCKET`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from collabalign.commands import (
    MAX_ERROR_CHARS,
    USER_ERRORS,
    config_dir,
    config_path,
    error_line,
    experiment,
    generate,
    node_settings,
    report,
    resolve_config,
    resume,
    run_config,
    score,
    train,
)
from collabalign.config import cut, short
from collabalign.deployment import MAX_NODES
from collabalign.experiments import EXPERIMENTS
from collabalign.federation.engine import RoundFailed
from collabalign.folders import claimed_folder
from collabalign.registry import METHODS
from collabalign.report import summarise_reports

MAX_NEW_TOKENS = 4096  # `generate --max-new-tokens`


def out_of_memory(err: BaseException) -> bool:
    """Whether `err` is a failed allocation (Python's, or torch's on the CPU or an accelerator)."""
    return isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError" \
        or "can't allocate memory" in str(err) or "out of memory" in str(err).lower()


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
            experiment(names[0])  # validates the name before any work
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
