"""In-process federated simulator: sampling, rounds, ledger, timing, checkpoints, resume, progress."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from collabalign.comm import Ledger, Message
from collabalign.federation.protocol import Algorithm, ClientContext, ServerState
from collabalign.seeding import Seeds


@dataclass
class SimulationResult:
    state: ServerState
    clients: dict[str, ClientContext]
    metrics: list[dict[str, Any]]  # one record per evaluated round, deterministic
    ledger: Ledger
    timing: list[dict[str, float]] = field(default_factory=list)  # per round: wall, client and server seconds


def sample_clients(seeds: Seeds, round_: int, client_ids: list[str], fraction: float) -> list[str]:
    """A seeded subset of max(1, round(fraction * n)) clients, in the original order."""
    if not 0 < fraction <= 1:
        raise ValueError(f"client fraction must be in (0, 1], got {fraction}")
    n = max(1, round(fraction * len(client_ids)))
    if n == len(client_ids):
        return list(client_ids)
    chosen = seeds.numpy("sampling", round_).choice(len(client_ids), size=n, replace=False)
    return [client_ids[i] for i in sorted(chosen)]


def simulate(algorithm: Algorithm, client_data: dict[str, Any], rounds: int, seed: int, fraction: float = 1.0,
             eval_every: int = 1, checkpoint: str | Path | None = None, checkpoint_every: int = 0,
             resume: bool = False, progress: bool = True, label: str = "") -> SimulationResult:
    """Runs `rounds` rounds of `algorithm` over the clients in `client_data` (id -> that client's data).

    Round 0 is the evaluation of the initial state. With `checkpoint` and `checkpoint_every`, the whole
    simulation state is saved every N rounds; `resume=True` continues from that file if it exists and
    gives the same result as an uninterrupted run.
    """
    seeds = Seeds(seed)
    ids = list(client_data)
    clients = {cid: ClientContext(cid, data) for cid, data in client_data.items()}
    ledger, metrics, timing = Ledger(), [], []
    start = 1
    if resume and checkpoint is not None and Path(checkpoint).exists():
        saved = torch.load(checkpoint, weights_only=False)
        state, metrics, timing, ledger = saved["state"], saved["metrics"], saved["timing"], Ledger(saved["ledger"])
        for cid, private in saved["client_states"].items():
            clients[cid].state = private
        start = saved["round"] + 1
    else:
        state = algorithm.init(seeds)
        metrics.append({"round": 0, **algorithm.evaluate(state, clients, 0)})
    batched = getattr(algorithm, "client_update_many", None)
    with _progress(progress) as bar:
        task = bar.add_task(label or type(algorithm).__name__, total=rounds, completed=start - 1)
        for rnd in range(start, rounds + 1):
            t0 = time.perf_counter()
            sampled = sample_clients(seeds, rnd, ids, fraction)
            messages = algorithm.configure(state, rnd, sampled)
            for cid, msg in messages.items():
                ledger.record(rnd, cid, "down", msg.nbytes)
                clients[cid].seed_round(seeds, rnd)
            t1 = time.perf_counter()
            if batched is not None:
                replies = batched(messages, {cid: clients[cid] for cid in messages})
            else:
                replies = {cid: algorithm.client_update(msg, clients[cid]) for cid, msg in messages.items()}
            t2 = time.perf_counter()
            for cid, reply in replies.items():
                ledger.record(rnd, cid, "up", _check(reply, cid).nbytes)
            state = algorithm.aggregate(state, replies, rnd)
            t3 = time.perf_counter()
            end_round(algorithm, state, clients, rnd, rounds, eval_every, metrics, timing, (t0, t1, t2, t3))
            if checkpoint is not None and checkpoint_every and rnd % checkpoint_every == 0:
                _save(checkpoint, {"round": rnd, "state": state, "metrics": metrics, "timing": timing,
                                   "ledger": ledger.rows, "client_states": {c: x.state for c, x in clients.items()}})
            bar.update(task, advance=1, description=f"{label or type(algorithm).__name__} {_short(metrics[-1])}")
    return SimulationResult(state, clients, metrics, ledger, timing)


def end_round(algorithm: Algorithm, state: ServerState, clients: dict[str, ClientContext], rnd: int, rounds: int,
              eval_every: int, metrics: list[dict[str, Any]], timing: list[dict[str, float]],
              marks: tuple[float, float, float, float]) -> None:
    """Evaluates when due and records the round's timing; `marks` = start, clients start, clients done, aggregated."""
    if rnd % eval_every == 0 or rnd == rounds:
        metrics.append({"round": rnd, **algorithm.evaluate(state, clients, rnd)})
    t0, t1, t2, t3 = marks
    timing.append({"round": rnd, "wall_s": time.perf_counter() - t0, "client_s": t2 - t1,
                   "server_s": (t1 - t0) + (t3 - t2)})


def _check(reply: Any, cid: str) -> Message:
    if not isinstance(reply, Message):
        raise TypeError(f"client {cid} returned {type(reply).__name__}, expected a Message")
    return reply


def _save(path: str | Path, payload: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def _short(record: dict[str, Any]) -> str:
    vals = [f"{k}={v:.3f}" for k, v in record.items() if k != "round" and isinstance(v, float | np.floating)]
    return " ".join(vals[:3])


def _progress(enabled: bool) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    disable=not enabled, transient=False)
