"""A deployment's node side: what a SuperNode's ClientApp does with each message (`handle`), in its own process or in
a long-lived node worker (`serve`) that keeps the job built between messages.

Flower starts a fresh ClientApp process for every message; built there, the job (the model loaded, the client's data
encoded) would be built again every round. A node worker (``collabalign node-worker SOCKET``, started beside each
SuperNode by `collabalign deploy`) builds each job once and answers every message of the run from memory; the
ClientApp, given ``worker=SOCKET`` in its node config, imports Flower and the standard library only and forwards each
message's bytes over the node's Unix socket (`ask`). The worker is a process of its own, apart from the SuperNode.

Private state: with ``state-dir`` in the node config, in a `NodeStore` under ``state-dir/<job key>/<client>`` (it
survives a restart of the SuperNode and of the worker); else it travels with the message as bytes the caller keeps
(Flower's node context). A personalised job's node saves its client's own model (`FederatedJob.personal`) there after
the last round's evaluation, in ``result/`` (as `collabalign train` saves a run).
"""

from __future__ import annotations

import functools
import json
import os
import socket
import struct
from pathlib import Path
from typing import Any

NODE_KEYS = ("partition-id", "num-partitions", "state-dir", "worker")  # the rest: settings the node declares
_HEADER = struct.Struct("!I")  # length of the JSON header
_BLOB = struct.Struct("!Q")  # length of each byte blob


class NodeError(RuntimeError):
    """The node worker could not answer (its reason in one line)."""


def handle(kind: str, run_config: dict[str, Any], node_config: dict[str, Any], round_: int, payload: bytes,
           state: bytes) -> tuple[bytes, bytes]:
    """One message of `kind` ("query", "train", "evaluate") for the node of `node_config` in the run of `run_config`:
    (reply bytes, the private state's new bytes when the caller keeps it, else b"")."""
    from collabalign.comm import Message
    from collabalign.federation.flower import NodeStore, evaluated_state, metrics_reply, train_reply
    from collabalign.federation.flower_client import whoami
    from collabalign.federation.protocol import ClientContext

    job, key = _job(json.dumps(run_config, sort_keys=True))
    cid = client_of(list(job.clients), node_config)
    if kind == "query":
        declared = {k: v for k, v in node_config.items() if k not in NODE_KEYS}
        return whoami(cid, declared), b""
    folder = str(node_config.get("state-dir", ""))
    store = NodeStore(Path(folder) / key / cid) if folder else None
    before = round_ + 1 if kind == "evaluate" else round_  # evaluation reads the state the round left
    private = store.load(before) if store is not None else (dict(Message.deserialise(state)) if state else {})
    data = job.clients[cid]
    if kind == "evaluate":
        reply = metrics_reply(job.algorithm, data, cid, round_, payload, private)
        if store is not None and job.personal is not None and round_ == job.rounds:  # the client's own model
            job.personal(evaluated_state(payload), ClientContext(cid, data, private)).save(store.folder / "result")
        return reply, b""
    reply, private = train_reply(job.algorithm, data, job.seed, cid, round_, payload, private)
    if store is not None:
        store.save(round_, private)
        return reply, b""
    return reply, Message(private).serialise()


def client_of(ids: list[str], node_config: dict[str, Any]) -> str:
    """The client id of the node's partition (its node config must match the job's number of clients)."""
    from collabalign.config import ConfigError

    partition, n = int(node_config["partition-id"]), int(node_config["num-partitions"])
    if n != len(ids) or not 0 <= partition < n:
        raise ConfigError(f"node config partition-id={partition} num-partitions={n}: the job has {len(ids)} clients")
    return ids[partition]


@functools.cache
def _job(run_config: str) -> tuple[Any, str]:
    """The run's job, built once per process, and its key (what names its private-state folders)."""
    from collabalign import jobs

    spec = jobs.spec_of(json.loads(run_config))
    return jobs.build(spec), jobs.job_key(spec)


def _send(sock: socket.socket, header: dict[str, Any], *blobs: bytes) -> None:
    head = json.dumps(header).encode()
    sock.sendall(b"".join([_HEADER.pack(len(head)), head, *(_BLOB.pack(len(b)) + b for b in blobs)]))


def _receive(sock: socket.socket, blobs: int) -> tuple[dict[str, Any], list[bytes]]:
    def exactly(n: int) -> bytes:
        chunks, left = [], n
        while left:
            chunk = sock.recv(min(left, 1 << 20))
            if not chunk:
                raise ConnectionError("the peer closed the connection mid-message")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    header = json.loads(exactly(_HEADER.unpack(exactly(_HEADER.size))[0]))
    return header, [exactly(_BLOB.unpack(exactly(_BLOB.size))[0]) for _ in range(blobs)]


def ask(path: str | Path, kind: str, run_config: dict[str, Any], node_config: dict[str, Any], round_: int,
        payload: bytes, state: bytes) -> tuple[bytes, bytes]:
    """`handle` in the node worker listening on `path`; its error as a NodeError."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(path))
        except OSError as err:
            raise NodeError(f"no node worker at {path}: {err}") from None
        _send(sock, {"kind": kind, "run_config": run_config, "node_config": node_config, "round": round_},
              payload, state)
        header, (reply, new_state) = _receive(sock, 2)
    if not header["ok"]:
        raise NodeError(header["error"])
    return reply, new_state


def serve(path: str | Path) -> None:
    """The node worker: answers `ask` on the Unix socket `path` (owner-only), one message at a time, until killed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        old = os.umask(0o177)
        try:
            server.bind(str(path))
        except OSError as err:  # e.g. a path past the ~107 bytes a Unix socket's name may have
            from collabalign.config import ConfigError

            raise ConfigError(f"node-worker {path}: cannot listen there: {err}") from None
        finally:
            os.umask(old)
        server.listen()
        while True:
            connection, _ = server.accept()
            with connection:
                try:
                    header, (payload, state) = _receive(connection, 2)
                except (ConnectionError, ValueError, struct.error):
                    continue  # a caller that went away mid-message: nothing to answer
                try:
                    reply, new_state = handle(header["kind"], header["run_config"], header["node_config"],
                                              int(header["round"]), payload, state)
                    answer = ({"ok": True}, reply, new_state)
                except Exception as err:  # the caller gets the reason; the worker stays up for the next message
                    answer = ({"ok": False, "error": f"{type(err).__name__}: {err}"}, b"", b"")
                try:
                    _send(connection, *answer)
                except OSError:
                    continue  # the caller went away (killed ClientApp): its SuperNode reports the round's failure
