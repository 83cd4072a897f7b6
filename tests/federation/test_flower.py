import numpy as np
import pytest

from collabalign.comm import Message
from collabalign.federation import simulate
from collabalign.federation.engine import EngineOptions, ReplySpec
from collabalign.federation.protocol import evaluate_per_client, mean_min_max

pytestmark = pytest.mark.flower
pytest.importorskip("flwr")
ray = pytest.importorskip("ray")


class Counter:
    """Each client replies with how often it has trained (a count kept only in its private state) and one
    draw from its round rng; the server state is the log of those replies. Its metrics need the private counts, so
    on Flower the nodes compute them (`client_metrics`) and the server combines them."""

    def init(self, seeds):
        return []

    def configure(self, state, round_, client_ids):
        return {cid: Message({}, {"round": round_}) for cid in client_ids}

    def client_update(self, message, client):
        count = int(client.state["count"][0]) + 1 if client.state else 1
        client.state = {"count": np.array([count], dtype=np.int64)}
        return Message({"draw": client.rng.random(2)}, {"count": count})

    def reply_spec(self, state, message, cid):
        return ReplySpec({"draw": ((2,), "<f8")}, count=False)

    def aggregate(self, state, replies, round_):
        return state + [(round_, cid, r.meta["count"], r["draw"].tolist()) for cid, r in replies.items()]

    def evaluate(self, state, clients, round_):
        return evaluate_per_client(self, state, clients, round_)

    def client_metrics(self, state, client, round_):
        return {"count": float(client.state["count"][0]) if client.state else 0.0}

    def combine_metrics(self, state, per_client, round_):
        return {"replies": float(len(state)), **mean_min_max(per_client)}


def both(algorithm, data, **kw):
    """The simulator with one client after another (as Flower's nodes train) and Flower's simulation engine, picked
    by `EngineOptions.engine`."""
    sim = simulate(algorithm, data, rounds=3, seed=11, progress=False, options=EngineOptions(batched=False), **kw)
    flower = simulate(algorithm, data, rounds=3, seed=11, progress=False, options=EngineOptions(engine="flower"), **kw)
    assert not ray.is_initialized()
    return sim, flower


def test_private_state_persists_across_rounds_and_is_evaluated_on_the_flower_nodes():
    data = {f"c{i}": None for i in range(3)}
    sim, flower = both(Counter(), data)
    counts = {cid: [c for _, k, c, _ in flower.state if k == cid] for cid in data}
    assert counts == {cid: [1, 2, 3] for cid in data}
    assert flower.state == sim.state  # same counts and the same per-round client rng draws
    assert flower.metrics == sim.metrics
    assert [m["count"] for m in flower.metrics] == [0.0, 1.0, 2.0, 3.0]  # the nodes' private counts, combined
    assert flower.ledger.rows == sim.ledger.rows and [t["round"] for t in flower.timing] == [1, 2, 3]
    assert all(c.state == {} for c in flower.clients.values())  # private state never leaves the nodes



class SlowGrid:
    """A stand-in Flower grid: message i's reply arrives at its i-th pull (none for `never`); records its pulls."""

    def __init__(self, count: int, never: int | None = None):
        self.count, self.never, self.pulls = count, never, 0

    def push_messages(self, messages):
        return [f"m{i}" for i in range(len(messages))]

    def pull_messages(self, ids):
        from types import SimpleNamespace

        self.pulls += 1
        ready = [i for i in range(self.count) if i < self.pulls and i != self.never and f"m{i}" in ids]
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=f"m{i}")) for i in ready]


def test_round_trip_returns_every_reply_once_or_what_came_before_the_timeout():
    from collabalign.federation.flower import _round_trip

    grid = SlowGrid(3)
    replies = _round_trip(grid, [None] * 3)
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m1", "m2"] and grid.pulls == 3
    grid = SlowGrid(3, never=1)
    replies = _round_trip(grid, [None] * 3, timeout_s=0.5)
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m2"]
    assert 3 <= grid.pulls <= 6  # asked 0.05, 0.1, 0.2, ... s apart: about four times in 0.5 s, not every tick
