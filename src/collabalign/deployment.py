"""`collabalign deploy CONFIG --nodes N`: a deployment config's job (`jobs.py`) on a real Flower deployment on this
machine's loopback: a SuperLink with TLS and SuperNode authentication, N SuperNodes that sign in with their own keys
(certificates and keys made in the run folder), the job started with `flwr run`. The run folder gets what the
ServerApp writes (metrics.jsonl, checkpoint/, manifest.json, adapters/, ledger.csv) and a report.md; every process
started is stopped by process id at the end, on an error and on Ctrl-C.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from collabalign import jobs
from collabalign.artifacts import read_manifest
from collabalign.config import ConfigError
from collabalign.federation.deploy import LoopbackDeployment, flower_path, kill_tree
from collabalign.folders import claimed_folder
from collabalign.runs import RunDir, atomic_write_text, fingerprint

APP_TOML = """[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "collabalign-deployment"
version = "1.0.0"
dependencies = []

[tool.flwr.app]
publisher = "collabalign"

[tool.flwr.app.components]
serverapp = "collabalign.app:server_app"
clientapp = "collabalign.app:client_app"

[tool.flwr.app.config]
config = ""
overrides = ""
out = ""
"""


MAX_NODES = 64  # SuperNodes one loopback deployment starts (each with its processes)


def write_app(folder: Path) -> Path:
    """A Flower app folder whose ServerApp and ClientApp are the installed `collabalign.app`'s (what `flwr run`
    packages: no project checkout needed)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(APP_TOML)
    return folder


def deploy(config: Path, overrides: list[str], nodes: int, out: Path, progress: bool = True,
           timeout_s: float = 24 * 3600, node_settings: dict[int, dict[str, Any]] | None = None,
           isolation: str = "subprocess") -> Path:
    """Runs the job of the deployment config on `nodes` loopback SuperNodes (node I declaring `node_settings[I]` in
    its node config; ClientApps in Flower's `isolation` mode) in the run folder `out` (new, or a deployment of the
    same job to continue: `folders.claimed_folder`); returns the run folder's report. The config, the node settings and
    the folder are checked before any model loads or process starts."""
    if not 1 <= nodes <= MAX_NODES:
        raise ConfigError(f"--nodes {nodes}: must be in 1..{MAX_NODES}")
    spec = jobs.read_spec(config, overrides)
    jobs.check_node_settings(spec, node_settings or {})
    env = flower_env()
    key = fingerprint({"job": jobs.job_key(spec), "nodes": nodes, "node_settings": node_settings or {}})
    with claimed_folder(out, "deploy", key) as claim:
        try:
            clients = list(jobs.build(spec).clients)
            if nodes != len(clients):
                raise ConfigError(f"--nodes {nodes}: the job of {config} has {len(clients)} clients "
                                  f"({', '.join(clients[:10])}); deploy it on {len(clients)} nodes")
        except BaseException:
            claim.discard()
            raise
        run_config = {"config": str(Path(config).resolve()), "overrides": "; ".join(overrides),
                      "out": str(out.resolve())}
        return _run(spec, run_config, nodes, env, progress, timeout_s, node_settings, isolation)


def flower_env() -> dict[str, str]:
    """The environment of the deployment's processes: Flower's CLIs found beside this Python, as installed with it
    (a ConfigError when they are not there)."""
    try:
        path = flower_path(os.environ.get("PATH", ""))
    except RuntimeError as err:
        raise ConfigError(str(err)) from None
    return {"PATH": path, "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "FLWR_TELEMETRY_ENABLED": os.environ.get("FLWR_TELEMETRY_ENABLED", "0")}


def _run(spec: jobs.JobSpec, run_config: dict[str, str], nodes: int, env: dict[str, str], progress: bool,
         timeout_s: float, node_settings: dict[int, dict[str, Any]] | None, isolation: str) -> Path:
    """The deployment itself: `flwr run` of the app with `run_config` (config, overrides, the claimed run folder)."""
    out = Path(run_config["out"])
    start = time.monotonic()
    root = out / "deployment"
    shutil.rmtree(root, ignore_errors=True)  # certificates, keys and logs of an earlier attempt: made anew
    root.mkdir(parents=True)
    with LoopbackDeployment(root, env=env, state_dir=out / "node-state", workers=True,
                            isolation=isolation) as deployment:
        deployment.node_settings = node_settings or {}
        deployment.start(nodes)
        deployment.wait_status(list(range(nodes)), "online")
        run = deployment.run(write_app(root / "app"), run_config)
        try:
            shown = 0
            while run.poll() is None:
                if time.monotonic() - start > timeout_s:
                    raise TimeoutError(f"the deployment ran past {timeout_s:g} s; logs in {root}")
                shown = _show_rounds(out / "metrics.jsonl", shown, progress)
                time.sleep(0.5)
            _show_rounds(out / "metrics.jsonl", shown, progress)
        finally:  # Ctrl-C or an error: the `flwr run` client goes too (the SuperLink and nodes go with the `with`)
            if run.poll() is None:
                kill_tree(run)
        if run.returncode != 0 or not (out / "manifest.json").exists():
            raise RuntimeError(f"the deployment failed; its log: {root / 'run.log'}\n" + deployment.log("run")[-3000:])
    return write_report(out, spec, nodes, time.monotonic() - start)


def _show_rounds(metrics: Path, shown: int, progress: bool) -> int:
    """Prints the metric lines written since the `shown` first; returns how many are shown now."""
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    if progress:
        for line in lines[shown:]:
            print(f"deploy: {line}", file=sys.stderr, flush=True)
    return len(lines)


def write_report(out: Path, spec: jobs.JobSpec, nodes: int, seconds: float) -> Path:
    """report.md: the job, the final metrics, the bytes each way and the clients dropped, from the run folder."""
    run = RunDir(out, create=False)
    manifest, rounds = read_manifest(out), run.read_metrics()
    sent = {d: sum(led.total(d) for led in run.read_ledgers().values()) for d in ("down", "up")}
    final = {k: v for k, v in rounds[-1].items() if isinstance(v, int | float)}
    dropped = sorted({c for r in rounds for c in r.get("dropped_clients", {})})
    lines = [f"# Deployment: {spec.method}", "",
             f"`{spec.method}` on a Flower deployment on this machine's loopback: a SuperLink with TLS and SuperNode "
             f"authentication and {nodes} SuperNodes, one per client, each holding only its own client's data and "
             f"private state (in node-state/). Data: `{spec.data}`. {len(rounds) - 1} rounds evaluated after round 0 "
             f"in {seconds:.0f} s.", "", "| final metric | value |", "|---|---|",
             *(f"| {k} | {v:.4g} |" for k, v in final.items()), "",
             f"Bytes sent: {sent['down']:,} down, {sent['up']:,} up (ledger.csv, every message). "
             f"Clients dropped from a round: {', '.join(dropped) if dropped else 'none'}.", "",
             f"Saved: {', '.join(manifest['adapters']) or ', '.join(manifest['arrays'])} (manifest.json; "
             "`collabalign score` and `collabalign generate` read this folder). The per-round metrics are in "
             "metrics.jsonl; the processes' logs in deployment/."]
    if "baseline" in manifest["metrics"]:
        from collabalign.baselines import sentence

        lines += ["", f"Against its baseline: {sentence(spec.method, manifest['metrics']['baseline'])}."]
    path = out / "report.md"
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path
