"""Flower adapter: runs the same `Algorithm` object under Flower (Message API), in Flower's simulation engine
(`run_flower_simulation`) and, through `serve` and `client_app`, in a deployment (`collabalign.app`).

Every `flwr` import of the project lives in this module and in `app.py`, inside functions, so the rest of the
package imports without Flower.

How one run flows:

- The ServerApp (low-level ``@app.main()`` with a ``Grid``) calls `serve`: it first sends every node a ``query``
  message; each ClientApp answers with the client id of its partition, giving the server its client id -> node id
  routing table. Then the shared round engine (`engine.run_rounds`) runs with `GridTransport`.
- Each round the engine samples, calls `algorithm.configure`, and the transport sends each sampled node a ``train``
  message whose content is one ``ConfigRecord`` holding ``Message.serialise()`` bytes (the round travels as the
  message's ``group_id``). The ClientApp deserialises it, rebuilds the `ClientContext` (its data, its private state,
  rngs from ``seed_round(Seeds(seed), round)``), calls `algorithm.client_update`, stores the private state back and
  replies with the reply's serialised bytes. The private state lives in a `NodeStore` (safetensors in the node's own
  folder, one file per round, so it survives a SuperNode restart) where the app gives one, else in Flower's
  ``context.state`` (a ``ConfigRecord`` holding a serialised collabalign `Message`). A node that errs, does not
  answer within ``options.timeout_s`` or sends bytes that do not parse is that round's `Failure`, handled by the
  engine like any dropped client.
- The ledger counts the bytes put into / read out of the Flower records, which are `Message.nbytes`, so its rows
  equal the simulator's. Flower's own envelope, the one-off ``query`` handshake and evaluation messages are not
  counted.
- Evaluation: an algorithm with the client-side hooks (`client_metrics`, `combine_metrics`) is evaluated on the
  nodes: an ``evaluate`` message carries the server state (`checkpoint.flatten`: its arrays, the JSON skeleton in the
  metadata) to every node, each answers its client's metrics from its private state, the server combines them. Other
  algorithms evaluate on the server, with client contexts whose ``state`` is empty.

In-process objects (simulation): Flower's Ray backend ships the ClientApp to its actors with cloudpickle on every
message, and the ClientApp here closes over the algorithm and the client data. To avoid pickling them per message,
they are put once into Ray's object store: Ray is initialised here, before Flower, with the same ``init_args`` and
the driver's ``sys.path`` as the workers' ``PYTHONPATH`` (what Flower's backend would do); Flower reuses an
initialised Ray, and shuts it down at the end, an already running one included. The ClientApp carries only the object
reference; each actor process loads it once and caches it. The algorithm's and the data's classes must be importable
from the driver's ``sys.path``.

Limits: the returned ``clients`` have empty state (private state never leaves the nodes). A batched
``client_update_many`` is not used: each node trains its own client. Private state round-trips through safetensors,
which stores names sorted. Flower's telemetry is off unless ``FLWR_TELEMETRY_ENABLED`` is set.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from collabalign.comm import Message, MessageError
from collabalign.federation.checkpoint import Checkpoint, flatten, unflatten
from collabalign.federation.engine import EngineOptions, Failure, SimulationResult, run_rounds, sample_clients
from collabalign.federation.flower_client import (
    CLIENT_ID,
    PAYLOAD,
    PROPERTIES,
    RECORD,
    Handler,
    client_app,
    content,
    payload_of,
    whoami,
)
from collabalign.federation.protocol import Algorithm, ClientContext, ServerState
from collabalign.runs import atomic_write_bytes
from collabalign.seeding import Seeds

_STATE = "collabalign.private"  # name of the ConfigRecord in context.state holding the private state
_POLL_S = (0.05, 1.0)  # the ServerApp asks for replies after 0.05 s, then ever less often, at least once a second
_NODE_WAIT_S = 120.0

_ACTOR_CACHE: dict[str, Any] = {}  # per Ray actor process: object-store key -> (algorithm, client data)

Job = Callable[[Any], tuple[Algorithm, Any, int]]  # a node's Flower Context -> (algorithm, its client's data, seed)


def run_flower_simulation(algorithm: Algorithm, client_data: dict[str, Any], rounds: int, seed: int,
                          fraction: float = 1.0, eval_every: int = 1, options: EngineOptions | None = None,
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
                # Ray runs its workers at niceness 15: beside any other work they starve (a round 4-5x slower
                # beside three busy processes on two cores); the simulation is the work asked for, so at 0
                os.environ.setdefault("RAY_worker_niceness", "0")
                ray.init(**{"runtime_env": _worker_env(), **config["init_args"]})
        try:
            ref = ray.put((algorithm, client_data))
            server = _server_app(algorithm, client_data, rounds, seed, fraction, eval_every,
                                 options or EngineOptions(), outcome)
            run_simulation(server_app=server, client_app=_simulation_client(ref, list(client_data), seed),
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
                eval_every: int, options: EngineOptions, outcome: dict[str, SimulationResult]) -> Any:
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        clients = {cid: ClientContext(cid, data) for cid, data in client_data.items()}  # state stays on nodes
        outcome["result"] = serve(grid, algorithm, clients, rounds, seed, fraction, eval_every, options)

    return app


def serve(grid: Any, algorithm: Algorithm, clients: dict[str, ClientContext], rounds: int, seed: int,
          fraction: float = 1.0, eval_every: int = 1, options: EngineOptions | None = None,
          on_round: Callable[[int, dict[str, Any]], None] | None = None,
          checkpoint: Checkpoint | None = None, node_of: dict[str, int] | None = None) -> SimulationResult:
    """A ServerApp's work: the handshake with one node per client of `clients` (unless `node_of` holds its routing
    table already), then the rounds on the shared engine over `GridTransport` (with a `checkpoint`, saved every
    round and continued from when it exists)."""
    options = options or EngineOptions()
    node_of = node_of or handshake(grid, sorted(clients))[0]
    return run_rounds(algorithm, GridTransport(grid, node_of, options.timeout_s), clients, rounds, seed, fraction,
                      eval_every, options, checkpoint, on_round)


class GridTransport:
    """The engine's transport over a Flower `Grid`: one ``train`` message per sampled node, the round as its
    ``group_id``; an error reply, a missing reply (node gone, `timeout_s` passed) or bytes that do not parse become
    that client's `Failure`. `evaluate` asks every node for its client's metrics."""

    def __init__(self, grid: Any, node_of: dict[str, int], timeout_s: float | None = None):
        self.grid, self.node_of, self.timeout_s = grid, node_of, timeout_s

    def exchange(self, round_: int, messages: dict[str, Message]) -> dict[str, Message | Failure]:
        out = {cid: (msg, self.node_of[cid]) for cid, msg in messages.items()}
        by_node = self._send(out, "train", round_)
        return {cid: _reply(by_node.get(self.node_of[cid])) for cid in messages}

    def evaluate(self, round_: int, state: ServerState) -> dict[str, dict[str, float]]:
        arrays: dict[str, Any] = {}
        message = Message(arrays, {"tree": flatten(state, arrays)})
        by_node = self._send({cid: (message, node) for cid, node in self.node_of.items()}, "evaluate", round_)
        replies = {cid: _reply(by_node.get(node)) for cid, node in self.node_of.items()}
        return {cid: dict(r.meta) for cid, r in replies.items() if isinstance(r, Message)}

    def _send(self, out: dict[str, tuple[Message, int]], kind: str, round_: int) -> dict[int, Any]:
        """Each message to its node; the replies by node id."""
        from flwr.app import Message as FlowerMessage

        sent = [FlowerMessage(content(msg.serialise()), node, kind, group_id=str(round_))
                for msg, node in out.values()]
        return {r.metadata.src_node_id: r for r in _round_trip(self.grid, sent, self.timeout_s)}


def _round_trip(grid: Any, messages: list[Any], timeout_s: float | None = None) -> list[Any]:
    """Flower's `grid.send_and_receive` (the replies that came within `timeout_s`; None: all), asking the SuperLink for
    them after 0.05 s and then twice as long each time up to every second, where Flower's asks every 3 s: a round
    whose clients answer in a second no longer waits for the next 3-second tick."""
    waiting = set(grid.push_messages(messages))
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    replies, pause = [], _POLL_S[0]
    while waiting and (deadline is None or time.monotonic() < deadline):
        time.sleep(pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic())))
        pulled = list(grid.pull_messages(waiting))
        replies += pulled
        waiting -= {reply.metadata.reply_to_message_id for reply in pulled}
        pause = min(2 * pause, _POLL_S[1])
    return replies


def _reply(reply: Any) -> Message | Failure:
    if reply is None:
        return Failure("missing", "no reply from its node (gone, or past the timeout)")
    if reply.has_error():
        return Failure("error", str(reply.error.reason))
    try:
        return Message.deserialise(payload_of(reply))
    except (MessageError, KeyError) as err:
        return Failure("corrupt", str(err))


def handshake(grid: Any, ids: list[str]) -> tuple[dict[str, int], dict[str, dict[str, Any]]]:
    """(client id -> node id, client id -> what its node declares), asked of each node (its ClientApp knows its
    partition); waits for the nodes to connect."""
    from flwr.app import Message as FlowerMessage
    from flwr.app import RecordDict

    deadline = time.monotonic() + _NODE_WAIT_S
    while len(nodes := list(grid.get_node_ids())) < len(ids):
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(nodes)} of {len(ids)} Flower nodes registered")
        time.sleep(0.05)
    replies = _round_trip(grid, [FlowerMessage(RecordDict(), node, "query", group_id="0") for node in nodes])
    node_of, properties = {}, {}
    for reply in replies:
        if reply.has_error():
            raise RuntimeError(f"Flower node {reply.metadata.src_node_id} failed: {reply.error.reason}")
        record = reply.content.config_records[RECORD]
        cid = str(record[CLIENT_ID])
        node_of[cid], properties[cid] = reply.metadata.src_node_id, json.loads(str(record.get(PROPERTIES, "{}")))
    if sorted(node_of) != ids:
        raise RuntimeError(f"Flower nodes answered the handshake as clients {sorted(node_of)}, expected {ids}")
    return node_of, properties


class NodeStore:
    """A client's private state kept in a node's own folder, one safetensors file per round it trained in (the newest
    two kept): a killed and restarted SuperNode continues from it, and a round run again (a resumed ServerApp) starts
    from the state of the round before, as the first time."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    def _rounds(self) -> list[int]:
        return sorted(int(p.stem[len("round-"):]) for p in self.folder.glob("round-*.safetensors")
                      if p.stem[len("round-"):].isdigit())

    def load(self, before: int) -> dict[str, Any]:
        """The state saved by the latest round before `before` (empty: none)."""
        earlier = [r for r in self._rounds() if r < before]
        if not earlier:
            return {}
        return dict(Message.deserialise((self.folder / f"round-{earlier[-1]:05d}.safetensors").read_bytes()))

    def save(self, round_: int, state: dict[str, Any]) -> None:
        """`state` as round `round_`'s; older files but the one this round started from are removed. A client that
        keeps no state writes nothing."""
        if not state and not self._rounds():
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.folder / f"round-{round_:05d}.safetensors", Message(state).serialise())
        earlier = [r for r in self._rounds() if r < round_]
        for r in earlier[:-1]:
            (self.folder / f"round-{r:05d}.safetensors").unlink(missing_ok=True)


def train_reply(algorithm: Algorithm, data: Any, seed: int, cid: str, round_: int, payload: bytes,
                state: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """One client's `client_update` on a serialised message, from its private `state`: (reply bytes, new state)."""
    client = ClientContext(cid, data, state)
    client.seed_round(Seeds(seed), round_)
    reply = algorithm.client_update(Message.deserialise(payload), client)
    if not isinstance(reply, Message):
        raise TypeError(f"client {cid} returned {type(reply).__name__}, expected a Message")
    return reply.serialise(), client.state


def metrics_reply(algorithm: Algorithm, data: Any, cid: str, round_: int, payload: bytes,
                  state: dict[str, Any]) -> bytes:
    """One client's `client_metrics` of the server state a serialised evaluate message carries."""
    metrics = algorithm.client_metrics(evaluated_state(payload), ClientContext(cid, data, state), round_)
    return Message({}, {k: float(v) for k, v in metrics.items()}).serialise()


def evaluated_state(payload: bytes) -> Any:
    """The server state a serialised evaluate message carries."""
    message = Message.deserialise(payload)
    return unflatten(message.meta["tree"], dict(message))


def in_process_handler(client_id: Callable[[Any], str], job: Job) -> Handler:
    """A ClientApp handler that runs the client of `client_id(context)` in the ClientApp's own process, its private
    state in Flower's ``context.state`` (what a simulation's nodes keep)."""

    def handle(kind: str, context: Any, round_: int, payload: bytes) -> bytes:
        from flwr.app import ConfigRecord

        cid = client_id(context)
        if kind == "query":
            return whoami(cid)
        algorithm, data, seed = job(context)
        if kind == "evaluate":
            return metrics_reply(algorithm, data, cid, round_, payload, _restore(context))
        reply, state = train_reply(algorithm, data, seed, cid, round_, payload, _restore(context))
        context.state[_STATE] = ConfigRecord({PAYLOAD: Message(state).serialise()})
        return reply

    return handle


def _simulation_client(ref: Any, ids: list[str], seed: int) -> Any:
    """The ClientApp of a simulation: node i runs client ``ids[i]``; the job comes from Ray's object store (`ref`)."""

    def client_id(context: Any) -> str:
        return ids[int(context.node_config["partition-id"])]

    def job(context: Any) -> tuple[Algorithm, Any, int]:
        algorithm, client_data = _load(ref)
        return algorithm, client_data[client_id(context)], seed

    return client_app(in_process_handler(client_id, job))


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
    return dict(Message.deserialise(bytes(record[PAYLOAD]))) if record is not None else {}
