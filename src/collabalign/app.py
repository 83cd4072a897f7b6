"""The Flower app behind `flwr run .`: the quickstart's FedAvg-LoRA reward model on a Flower deployment (a SuperLink
and one SuperNode per client), through the shared round engine (`federation.flower.serve` and `client_app`).

Run config (``[tool.flwr.app.config]`` in pyproject.toml; ``flwr run . --run-config FILE.toml`` overrides it):
``config`` a quickstart config file ("" = the shipped quick config), ``overrides`` its dotted overrides separated by
";", ``seed``, ``method`` (fedavg-lora), ``min-replies`` and ``timeout`` (seconds a round waits for its nodes; 0 =
no limit), ``out`` the folder where the ServerApp writes ``metrics.jsonl`` (a line per evaluated round, as it goes)
and ``adapters.safetensors`` (the final LoRA factors and head), relative to the ServerApp's working directory.

Node config (``flower-supernode --node-config "partition-id=I num-partitions=N"``): node I runs client I of the
config's N clients and encodes that client's pairs only (`federated_job` with ``own``); the server holds none.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from safetensors.numpy import save_file

from collabalign.config import ConfigError, apply_overrides, read_yaml, validate
from collabalign.experiments.quickstart.comparison import client_ids, federated_job
from collabalign.experiments.quickstart.config import Config
from collabalign.federation import flower
from collabalign.federation.engine import EngineOptions
from collabalign.federation.protocol import Algorithm, ClientContext
from collabalign.runs import metric_line

QUICK_CONFIG = Path(__file__).parent / "configs" / "quickstart" / "quick.yaml"
METHODS = ("fedavg-lora",)


def job_config(run_config: dict[str, Any]) -> tuple[Config, int]:
    """The quickstart config and seed a run config names; a bad one is a ConfigError naming the key."""
    if run_config["method"] not in METHODS:
        raise ConfigError(f"method = {run_config['method']!r}: must be one of {', '.join(METHODS)}")
    path = str(run_config["config"]) or str(QUICK_CONFIG)
    overrides = [o.strip() for o in str(run_config["overrides"]).split(";") if o.strip()]
    data = apply_overrides(read_yaml(path), overrides)
    if data.pop("experiment", "quickstart") != "quickstart":
        raise ConfigError(f"{path}: not a quickstart config")
    data.pop("smoke", None)
    return validate(Config, data, path), int(run_config["seed"])


def engine_options(run_config: dict[str, Any]) -> EngineOptions:
    """min_replies and the per-round timeout from a run config (timeout 0: wait for every node)."""
    timeout = float(run_config["timeout"])
    return EngineOptions(min_replies=int(run_config["min-replies"]), timeout_s=timeout if timeout > 0 else None)


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """The rounds over the connected SuperNodes; metrics appended as rounds end, the final adapters at the end."""
    cfg, seed = job_config(context.run_config)
    algorithm, _ = federated_job(cfg, seed, own=[])  # the server holds the held-out pairs, no client's pairs
    out = Path(str(context.run_config["out"]))
    out.mkdir(parents=True, exist_ok=True)
    metrics = out / "metrics.jsonl"
    metrics.write_text("")

    def append(round_: int, record: dict[str, Any]) -> None:
        with metrics.open("a", encoding="utf-8") as f:
            f.write(metric_line(record) + "\n")

    clients = {cid: ClientContext(cid, None) for cid in client_ids(cfg)}
    result = flower.serve(grid, algorithm, clients, cfg.train.rounds, seed, options=engine_options(context.run_config),
                          on_round=append)
    save_file(result.state, str(out / "adapters.safetensors"))


def node_client(context: Context) -> str:
    """The client id of this SuperNode's partition (its node config must match the job's number of clients)."""
    cfg, _ = job_config(context.run_config)
    partition, n = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    if n != cfg.split.clients or not 0 <= partition < n:
        raise ConfigError(f"node config partition-id={partition} num-partitions={n}: the job has "
                          f"{cfg.split.clients} clients")
    return client_ids(cfg)[partition]


def node_job(context: Context) -> tuple[Algorithm, Any, int]:
    """The algorithm, this node's client data and the seed (built once per process)."""
    return _node_job(json.dumps(dict(context.run_config), sort_keys=True), node_client(context))


@functools.cache
def _node_job(run_config: str, cid: str) -> tuple[Algorithm, Any, int]:
    cfg, seed = job_config(json.loads(run_config))
    algorithm, data = federated_job(cfg, seed, own=[cid])
    return algorithm, data[cid], seed


client_app = flower.client_app(node_client, node_job)
