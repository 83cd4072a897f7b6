"""The Flower app behind `collabalign deploy` and `flwr run .`: one federated method's job (`jobs.py`) on a Flower
deployment (a SuperLink and one SuperNode per client), through the shared round engine (`federation.flower.serve`
on the server, `node.handle` on the nodes).

Run config (``[tool.flwr.app.config]`` in pyproject.toml; ``flwr run . --run-config FILE.toml`` overrides it):
``config`` a deployment config (`jobs.py`: method, data and the method's settings, its ``engine`` and
``aggregation`` sections included; "" = the shipped deploy/fedavg-lora.yaml), ``overrides`` its dotted overrides
separated by ";", ``out`` the run folder (absolute: it is read on the ServerApp's machine). The ServerApp writes
there ``metrics.jsonl`` (a line per evaluated round, as it goes) and ``checkpoint/`` (every round), and at the end the
method's saved result (``manifest.json``, ``adapters/`` or ``arrays.safetensors``) and ``ledger.csv``. Run again with
the same ``out``, it continues from the last completed round.

Node config (``flower-supernode --node-config "partition-id=I num-partitions=N state-dir='PATH' worker='SOCKET'"``):
node I runs client I of the job's N clients (in the job's order), on its client's data only; with ``state-dir`` it
keeps its client's private state there (`node.py`), so a killed and restarted SuperNode continues where it was
(without, in Flower's node context, which a restart loses); with ``worker`` each message goes to the node worker
listening on that Unix socket, which keeps the job built between rounds (without, the ClientApp builds it for each
message). This module imports Flower and the standard library only: the ClientApp runs once per message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from collabalign import node
from collabalign.federation import flower_client
from collabalign.federation.flower_client import PAYLOAD

_STATE = "collabalign.node"  # the ConfigRecord in Flower's node context holding the private state (no state-dir)

server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """The rounds over the connected SuperNodes, checkpointed; metrics appended as rounds end; the result at the end."""
    from collabalign import jobs

    serve_job(grid, jobs.spec_of(dict(context.run_config)), Path(str(context.run_config["out"])))


def serve_job(grid: Grid, spec: Any, out: Path) -> Any:
    """The job of `spec` on the grid's nodes (the server holds no client's data), with what the nodes declare in their
    node configs (`jobs.with_node_settings`), writing the run folder `out`."""
    from collabalign import jobs
    from collabalign.federation import flower
    from collabalign.federation.checkpoint import Checkpoint
    from collabalign.federation.protocol import ClientContext
    from collabalign.runs import RunDir, metric_line

    job = jobs.build(spec)
    node_of, declared = flower.handshake(grid, sorted(job.clients))
    if (adapted := jobs.with_node_settings(spec, list(job.clients), declared)) is not spec:
        job = jobs.build(adapted)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = Checkpoint(out / "checkpoint")
    log = checkpoint.load()[2] if checkpoint.exists else []
    run_dir, metrics = RunDir(out, create=False), out / "metrics.jsonl"
    run_dir.write_metrics([line["metrics"] for line in log if line["metrics"]])  # the rounds a rerun continues after

    def append(round_: int, record: dict[str, Any]) -> None:
        with metrics.open("a", encoding="utf-8") as f:
            f.write(metric_line(record) + "\n")

    clients = {cid: ClientContext(cid, None) for cid in job.clients}
    sim = flower.serve(grid, job.algorithm, clients, job.rounds, job.seed, job.fraction, job.eval_every,
                       job.options, on_round=append, checkpoint=checkpoint, node_of=node_of)
    result = job.finish(sim)
    result.save(out)
    run_dir.write_ledgers({job.label: sim.ledger})
    return result


def handle(kind: str, context: Context, round_: int, payload: bytes) -> bytes:
    """One message on this node: in its node worker when the node config names one, else here."""
    run_config, node_config = dict(context.run_config), dict(context.node_config)
    record = context.state.config_records.get(_STATE)
    state = bytes(record[PAYLOAD]) if record is not None else b""
    worker = str(node_config.get("worker", ""))
    if worker:
        reply, state = node.ask(worker, kind, run_config, node_config, round_, payload, state)
    else:
        reply, state = node.handle(kind, run_config, node_config, round_, payload, state)
    if state:
        context.state[_STATE] = ConfigRecord({PAYLOAD: state})
    return reply


client_app = flower_client.client_app(handle)
