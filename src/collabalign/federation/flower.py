"""Flower adapter: runs the same `Algorithm` object under Flower's simulation engine (Message API).

Every `flwr` import of the project lives in this module, inside functions, so the rest of the
package imports without Flower.

How one run flows:

- The ServerApp (low-level ``@app.main()`` with a ``Grid``) runs in a thread of the calling process,
  so it hands its `SimulationResult` back through a closure (no temp file). It first sends every node a
  ``query`` message; each ClientApp answers with the client id its ``partition-id`` maps to (the i-th
  id of ``client_data``), giving the server its node -> client id routing table.
- Each round the server samples exactly as `simulate` does (`sample_clients`), calls
  `algorithm.configure`, and sends each sampled node a ``train`` message whose content is one
  ``ConfigRecord`` holding ``Message.serialise()`` bytes (the round travels as the message's
  ``group_id``). The ClientApp deserialises it, rebuilds the `ClientContext` (data by partition id,
  private state from ``context.state``, rngs from ``seed_round(Seeds(seed), round)``), calls
  `algorithm.client_update`, stores the private state back in ``context.state`` (a ``ConfigRecord``
  holding a serialised collabalign `Message`) and replies with the reply's serialised bytes.
- The ledger counts the length of the bytes actually put into / read out of the Flower records; they
  equal `Message.nbytes` (asserted), so the rows are identical to the simulator's. Flower's own
  envelope (metadata, protobuf framing) and the one-off ``query`` handshake are not counted.
- The server deserialises the replies in the order `configure` returned them, `aggregate`s and
  evaluates on round 0, every `eval_every` rounds and the last round, like the simulator.

In-process objects: Flower's Ray backend ships the ClientApp to its actors with cloudpickle on every
message, and the ClientApp here closes over the algorithm and the client data. To avoid pickling them
per message, they are put once into Ray's object store: Ray is initialised here, before Flower, with
the same ``init_args`` and the driver's ``sys.path`` as the workers' ``PYTHONPATH`` (what Flower's
backend would do); Flower reuses an initialised Ray, and shuts it down at the end, an already running
one included. The ClientApp carries only the object reference; each actor process loads it once and
caches it. The algorithm's and the data's classes must be importable from the driver's ``sys.path``.

Limits: `evaluate` runs on the server with client contexts whose ``state`` is empty (private state
never leaves the nodes), so personalised evaluation over private state needs a federated evaluate
round, which is not built here; the returned ``clients`` likewise have empty state. A batched
``client_update_many`` is not used: each node trains its own client. Private state round-trips through
safetensors, which stores names sorted. Flower's telemetry is off unless ``FLWR_TELEMETRY_ENABLED`` is
set. A real deployment (SuperLink + SuperNodes) would load each node's data from its node config;
only the simulation engine is wired here.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from collabalign.comm import Ledger, Message
from collabalign.federation.protocol import Algorithm, ClientContext
from collabalign.federation.simulator import SimulationResult, end_round, sample_clients
from collabalign.seeding import Seeds

_RECORD = "collabalign"  # name of the ConfigRecord in a message's content / a node's context.state
_PAYLOAD = "payload"  # its one bytes value: a serialised collabalign Message
_CLIENT_ID = "client_id"  # handshake reply: the client id of the node's partition
_STATE = "collabalign.private"  # name of the ConfigRecord in context.state holding the private state
_NODE_WAIT_S = 120.0

_ACTOR_CACHE: dict[str, Any] = {}  # per Ray actor process: object-store key -> (algorithm, client data)


def run_flower_simulation(algorithm: Algorithm, client_data: dict[str, Any], rounds: int, seed: int,
                          fraction: float = 1.0, eval_every: int = 1,
                          backend_config: dict[str, Any] | None = None) -> SimulationResult:
    """Runs `rounds` rounds of `algorithm` on Flower's simulation engine, one SuperNode per client.

    Same arguments and result as `simulate` (same seed -> same metrics and ledger rows);
    `backend_config` is merged key by key over small defaults (2 CPUs, 1 CPU per client, a 100 MB
    object store, no dashboard).
    """
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    import ray
    from flwr.simulation import run_simulation

    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    sample_clients(Seeds(seed), 1, list(client_data), fraction)  # validates fraction before starting Ray
    config = _backend_config(backend_config)
    outcome: dict[str, SimulationResult] = {}
    with _quiet_flower():
        if not ray.is_initialized():
            with warnings.catch_warnings():  # Ray's notice about accelerator env vars
                warnings.simplefilter("ignore", FutureWarning)
                ray.init(**{"runtime_env": _worker_env(), **config["init_args"]})
        try:
            ref = ray.put((algorithm, client_data))
            server = _server_app(algorithm, client_data, rounds, seed, fraction, eval_every, outcome)
            run_simulation(server_app=server, client_app=_client_app(ref, list(client_data), seed),
                           num_supernodes=len(client_data), backend_config=config)
        finally:
            if ray.is_initialized():
                ray.shutdown()
    if "result" not in outcome:
        raise RuntimeError("Flower's ServerApp finished without a result (see the log above)")
    return outcome["result"]


def _backend_config(user: dict[str, Any] | None) -> dict[str, Any]:
    config: dict[str, Any] = {
        "init_args": {"num_cpus": 2, "object_store_memory": 100 * 2**20, "include_dashboard": False,
                      "logging_level": logging.WARNING, "log_to_driver": False},
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
    }
    for key, value in (user or {}).items():  # Flower spells keys with '-' or '_'; Ray needs '_'
        key = key.replace("-", "_")
        if isinstance(value, dict):
            value = {**config.get(key, {}), **{k.replace("-", "_"): v for k, v in value.items()}}
        config[key] = value
    return config


def _worker_env() -> dict[str, Any]:
    """What Flower's Ray backend gives workers when it starts Ray itself: the driver's sys.path."""
    path = os.pathsep.join([*sys.path, *filter(None, [os.environ.get("PYTHONPATH")])])
    return {"env_vars": {"PYTHONPATH": path}}


@contextmanager
def _quiet_flower() -> Iterator[None]:
    """Flower's logger at WARNING, without run_simulation's deprecation notice; restored on exit."""
    logger, level = logging.getLogger("flwr"), logging.getLogger("flwr").level

    def drop(record: logging.LogRecord) -> bool:
        return "`run_simulation` function is deprecated" not in record.getMessage()

    logger.setLevel(logging.WARNING)
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)
        logger.setLevel(level)


def _server_app(algorithm: Algorithm, client_data: dict[str, Any], rounds: int, seed: int, fraction: float,
                eval_every: int, outcome: dict[str, SimulationResult]) -> Any:
    from flwr.app import ConfigRecord, Context, RecordDict
    from flwr.app import Message as FlowerMessage
    from flwr.serverapp import Grid, ServerApp

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        seeds, ids = Seeds(seed), list(client_data)
        node_of = _handshake(grid, len(ids))
        clients = {cid: ClientContext(cid, data) for cid, data in client_data.items()}  # state stays on nodes
        ledger, timing = Ledger(), []
        state = algorithm.init(seeds)
        metrics = [{"round": 0, **algorithm.evaluate(state, clients, 0)}]
        for rnd in range(1, rounds + 1):
            t0 = time.perf_counter()
            messages = algorithm.configure(state, rnd, sample_clients(seeds, rnd, ids, fraction))
            out = []
            for cid, msg in messages.items():
                payload = msg.serialise()
                assert len(payload) == msg.nbytes
                ledger.record(rnd, cid, "down", len(payload))
                content = RecordDict({_RECORD: ConfigRecord({_PAYLOAD: payload})})
                out.append(FlowerMessage(content, node_of[cid], "train", group_id=str(rnd)))
            t1 = time.perf_counter()
            by_node = {r.metadata.src_node_id: r for r in grid.send_and_receive(out)}
            t2 = time.perf_counter()
            replies = {}
            for cid in messages:
                payload = _payload(by_node.get(node_of[cid]), cid)
                reply = Message.deserialise(payload)
                assert len(payload) == reply.nbytes
                ledger.record(rnd, cid, "up", len(payload))
                replies[cid] = reply
            state = algorithm.aggregate(state, replies, rnd)
            t3 = time.perf_counter()
            end_round(algorithm, state, clients, rnd, rounds, eval_every, metrics, timing, (t0, t1, t2, t3))
        outcome["result"] = SimulationResult(state, clients, metrics, ledger, timing)

    return app


def _handshake(grid: Any, n: int) -> dict[str, int]:
    """client id -> node id, asked of each node (its ClientApp knows its partition id)."""
    from flwr.app import Message as FlowerMessage
    from flwr.app import RecordDict

    deadline = time.monotonic() + _NODE_WAIT_S
    while len(nodes := list(grid.get_node_ids())) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(nodes)} of {n} Flower nodes registered")
        time.sleep(0.05)
    replies = grid.send_and_receive([FlowerMessage(RecordDict(), node, "query", group_id="0") for node in nodes])
    node_of = {}
    for reply in replies:
        if reply.has_error():
            raise RuntimeError(f"Flower node {reply.metadata.src_node_id} failed: {reply.error.reason}")
        node_of[str(reply.content.config_records[_RECORD][_CLIENT_ID])] = reply.metadata.src_node_id
    if len(node_of) != n:
        raise RuntimeError(f"{len(node_of)} of {n} Flower nodes answered the handshake")
    return node_of


def _payload(reply: Any, cid: str) -> bytes:
    if reply is None:
        raise RuntimeError(f"no Flower reply from client {cid}")
    if reply.has_error():
        raise RuntimeError(f"Flower ClientApp of client {cid} failed: {reply.error.reason}")
    return bytes(reply.content.config_records[_RECORD][_PAYLOAD])


def _client_app(ref: Any, ids: list[str], seed: int) -> Any:
    """A ClientApp that answers the handshake and runs `client_update`; `ref` is the object-store ref."""
    from flwr.app import ConfigRecord, Context, RecordDict
    from flwr.app import Message as FlowerMessage
    from flwr.clientapp import ClientApp

    app = ClientApp()

    def cid_of(context: Context) -> str:
        return ids[int(context.node_config["partition-id"])]

    @app.query()
    def whoami(message: FlowerMessage, context: Context) -> FlowerMessage:
        content = RecordDict({_RECORD: ConfigRecord({_CLIENT_ID: cid_of(context)})})
        return FlowerMessage(content, reply_to=message)

    @app.train()
    def train(message: FlowerMessage, context: Context) -> FlowerMessage:
        algorithm, client_data = _load(ref)
        cid = cid_of(context)
        msg = Message.deserialise(bytes(message.content.config_records[_RECORD][_PAYLOAD]))
        client = ClientContext(cid, client_data[cid], _restore(context))
        client.seed_round(Seeds(seed), int(message.metadata.group_id))
        reply = algorithm.client_update(msg, client)
        if not isinstance(reply, Message):
            raise TypeError(f"client {cid} returned {type(reply).__name__}, expected a Message")
        context.state[_STATE] = ConfigRecord({_PAYLOAD: Message(client.state).serialise()})
        return FlowerMessage(RecordDict({_RECORD: ConfigRecord({_PAYLOAD: reply.serialise()})}), reply_to=message)

    return app


def _load(ref: Any) -> tuple[Algorithm, dict[str, Any]]:
    """The (algorithm, client data) pair from Ray's object store, fetched once per actor process."""
    import ray

    key = ref.hex()
    if key not in _ACTOR_CACHE:
        _ACTOR_CACHE.clear()  # one run at a time per actor
        _ACTOR_CACHE[key] = ray.get(ref)
    return _ACTOR_CACHE[key]


def _restore(context: Any) -> dict[str, Any]:
    record = context.state.config_records.get(_STATE)
    return dict(Message.deserialise(bytes(record[_PAYLOAD]))) if record is not None else {}

