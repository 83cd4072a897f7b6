"""The round engine under faults: poisoned replies, raising and slow clients, too few replies, checkpoints and
resume, and what partial participation promises."""

import time
from collections import Counter

import numpy as np
import pytest

from collabalign.comm import Message
from collabalign.federation import sample_clients, simulate
from collabalign.federation.checkpoint import Checkpoint, CheckpointError
from collabalign.federation.engine import (
    EngineOptions,
    InProcess,
    ReplySpec,
    RoundFailed,
    check_reply,
    clip_update,
    evaluate,
)
from collabalign.federation.protocol import ClientContext
from collabalign.methods.fedavg import FedAvg, LocalOnly
from collabalign.seeding import Seeds

from .toy import LeastSquares, ManyAtOnce

BAD = "c2"


class Faulty(FedAvg):
    """FedAvg whose client BAD replies with `fault(reply)` (or raises / sleeps inside it) in `rounds`."""

    def __init__(self, trainer, fault, rounds=(1, 2, 3, 4, 5, 6)):
        super().__init__(trainer)
        self.fault, self.rounds = fault, set(rounds)

    def client_update(self, message, client):
        reply = super().client_update(message, client)
        if client.cid == BAD and message.meta["round"] in self.rounds:
            return self.fault(reply)
        return reply


class Without(FedAvg):
    """The reference: FedAvg that leaves BAD's reply out of the aggregate in `rounds`."""

    def __init__(self, trainer, rounds=(1, 2, 3, 4, 5, 6)):
        super().__init__(trainer)
        self.rounds = set(rounds)

    def aggregate(self, state, replies, round_):
        if round_ in self.rounds:
            replies = {c: r for c, r in replies.items() if c != BAD}
        return super().aggregate(state, replies, round_)


def run(algorithm, rounds=6, **kw):
    trainer = algorithm.trainer
    return simulate(algorithm, trainer.client_data(5), rounds=rounds, seed=3, progress=False, **kw)


def with_w(reply, w, **meta):
    return Message({"w": w}, {**reply.meta, **meta})


def raise_(_):
    raise RuntimeError("disk full")


POISONS = {
    "nan": lambda r: with_w(r, np.where(np.arange(3) == 1, np.nan, r["w"]).astype(np.float32)),
    "inf": lambda r: with_w(r, np.full(3, np.inf, np.float32)),
    "broadcastable shape": lambda r: with_w(r, r["w"][None, :]),
    "scalar shape": lambda r: with_w(r, r["w"][:1]),
    "float64": lambda r: with_w(r, r["w"].astype(np.float64)),
    "extra array": lambda r: Message({**r, "x": np.zeros(2, np.float32)}, r.meta),
    "missing array": lambda r: Message({}, r.meta),
    "n = 0": lambda r: with_w(r, r["w"], n=0),
    "n < 0": lambda r: with_w(r, r["w"], n=-5),
    "n nan": lambda r: with_w(r, r["w"], n=float("nan")),
    "n a string": lambda r: with_w(r, r["w"], n="20"),
    "n missing": lambda r: Message(dict(r), {}),
    "not a Message": lambda r: dict(r),
    "raises": raise_,
}


def test_a_subclass_that_overrides_client_update_is_not_bypassed_by_the_batched_hook():
    faulty = run(Faulty(ManyAtOnce(), POISONS["nan"], rounds=(2,)))
    reference = run(Without(ManyAtOnce(), rounds=(2,)))
    assert [(f["round"], f["client"]) for f in faulty.faults] == [(2, BAD)]
    assert faulty.state["w"].tobytes() == reference.state["w"].tobytes()


@pytest.mark.parametrize("poison", list(POISONS))
def test_a_bad_reply_is_dropped_named_and_leaves_the_server_state_as_without_that_client(poison):
    faulty = run(Faulty(LeastSquares(), POISONS[poison], rounds=(2, 4)))
    reference = run(Without(LeastSquares(), rounds=(2, 4)))
    assert faulty.state["w"].tobytes() == reference.state["w"].tobytes()
    assert [(f["round"], f["client"]) for f in faulty.faults] == [(2, BAD), (4, BAD)]
    assert faulty.faults[0]["kind"] == ("error" if poison == "raises" else "rejected")
    by_round = {m["round"]: m for m in faulty.metrics}
    assert by_round[2]["dropped"] == 1 and f"{BAD}@2" in by_round[2]["dropped_clients"]
    assert "dropped" not in by_round[3]
    assert [m["mse"] for m in faulty.metrics] == [m["mse"] for m in reference.metrics]


def test_a_huge_update_is_rejected_by_the_norm_bound_and_otherwise_clipped():
    huge = lambda r: with_w(r, r["w"] * np.float32(1e6))  # noqa: E731
    bounded = run(Faulty(LeastSquares(), huge, rounds=(3,)), options=EngineOptions(max_update_norm=100.0))
    reference = run(Without(LeastSquares(), rounds=(3,)))
    assert bounded.state["w"].tobytes() == reference.state["w"].tobytes()
    assert "exceeds" in bounded.faults[0]["reason"]
    unscreened = {"outlier_factor": None}  # else the default screen drops the huge reply before clipping
    clipped = run(Faulty(LeastSquares(), huge, rounds=(3,)), options=EngineOptions(clip_norm=1.0, **unscreened))
    unclipped = run(Faulty(LeastSquares(), huge, rounds=(3,)), options=EngineOptions(**unscreened))
    assert not clipped.faults and np.abs(clipped.state["w"]).max() < 10 < np.abs(unclipped.state["w"]).max()


def test_clip_update_scales_only_the_update_and_keeps_dtypes():
    base = np.array([1.0, 1.0], np.float32)
    spec = ReplySpec({"w": ((2,), "<f4")}, {"w": base})
    reply = Message({"w": np.array([4.0, 5.0], np.float32)}, {"n": 3})
    out = clip_update(reply, spec, 1.0)
    np.testing.assert_allclose(out["w"], base + np.array([0.6, 0.8]), rtol=1e-6)
    assert out["w"].dtype == np.float32 and out.meta == {"n": 3}
    assert clip_update(reply, spec, 10.0) is reply
    assert check_reply(out, spec) is None


def test_a_raising_client_gets_its_private_state_back_and_the_batched_path_isolates_it():
    class Batched(Faulty):
        calls = 0

        def client_update_many(self, messages, clients):
            Batched.calls += 1
            for cid in messages:
                clients[cid].state = {"scratch": np.ones(1)}  # partial work a failure must undo
            if BAD in messages:
                raise RuntimeError("one client broke the batch")
            return super().client_update_many(messages, clients)

    faulty = run(Batched(LeastSquares(), raise_, rounds=(2,)))
    reference = run(Without(LeastSquares(), rounds=(2,)))
    assert faulty.state["w"].tobytes() == reference.state["w"].tobytes()
    assert faulty.faults == [{"round": 2, "client": BAD, "kind": "error", "reason": "RuntimeError: disk full"}]
    assert Batched.calls == 6
    assert all(c.state == {"scratch": np.ones(1)} or not c.state for c in faulty.clients.values())
    assert not faulty.clients[BAD].state or "scratch" in faulty.clients[BAD].state


def test_a_client_past_the_timeout_is_dropped():
    def slow(reply):
        time.sleep(0.3)
        return reply

    faulty = run(Faulty(LeastSquares(), slow, rounds=(2,)), rounds=3, options=EngineOptions(timeout_s=0.1))
    assert [(f["round"], f["client"], f["kind"]) for f in faulty.faults] == [(2, BAD, "timeout")]


def test_too_few_replies_stop_the_run_resumably_and_resume_ends_as_an_uninterrupted_run(tmp_path):
    class AllFail(FedAvg):
        def client_update(self, message, client):
            if message.meta["round"] == 4:
                raise RuntimeError("network down")
            return super().client_update(message, client)

    trainer = LeastSquares()
    data = trainer.client_data(5)
    with pytest.raises(RoundFailed, match="round 4: 0 valid replies of 5, min_replies = 2"):
        simulate(AllFail(trainer), data, rounds=6, seed=3, checkpoint=tmp_path / "ck", progress=False,
                 options=EngineOptions(min_replies=2))
    assert Checkpoint(tmp_path / "ck").load()[0] == 3
    resumed = simulate(FedAvg(trainer), data, rounds=6, seed=3, checkpoint=tmp_path / "ck", resume=True,
                       progress=False)
    full = simulate(FedAvg(trainer), data, rounds=6, seed=3, progress=False)
    assert resumed.metrics == full.metrics and resumed.ledger.rows == full.ledger.rows
    assert resumed.state["w"].tobytes() == full.state["w"].tobytes()
    lines = (tmp_path / "ck" / "rounds.jsonl").read_text().splitlines()
    assert len(lines) == 7  # round 0 .. 6, each once, though round 4 was tried before the failure


def test_checkpoints_hold_no_pickle_and_refuse_foreign_files(tmp_path):
    trainer = LeastSquares()
    simulate(FedAvg(trainer), trainer.client_data(3), rounds=2, seed=0, checkpoint=tmp_path / "ck", progress=False)
    names = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert names == ["rounds.jsonl", "state-00002.safetensors", "state.json"]
    (tmp_path / "ck" / "state-00002.safetensors").write_bytes(b"\x80\x04K\x01.")  # a pickle
    with pytest.raises(CheckpointError, match="unreadable checkpoint"):
        Checkpoint(tmp_path / "ck").load()


def test_partial_participation_draws_fresh_subsets_at_the_promised_frequency():
    ids = [f"c{i}" for i in range(10)]
    rounds = [sample_clients(Seeds(7), r, ids, 0.3) for r in range(1, 3001)]
    assert all(len(s) == 3 and s == sorted(s, key=ids.index) for s in rounds)
    assert len({tuple(s) for s in rounds[:20]}) >= 15  # not one subset every round
    counts = Counter(c for s in rounds for c in s)
    assert all(abs(counts[c] / 3000 - 0.3) < 0.03 for c in ids), counts
    assert rounds[:50] != [sample_clients(Seeds(8), r, ids, 0.3) for r in range(1, 51)]


def test_client_side_evaluation_combines_the_answers_and_names_the_missing():
    """An algorithm with client-side hooks is evaluated from the clients' answers (remote transports); a client
    that does not answer is named in ``eval_missing``; in process its `evaluate` runs here, the same combination."""
    trainer = LeastSquares()
    algorithm = LocalOnly(trainer)
    clients = {cid: ClientContext(cid, d) for cid, d in trainer.client_data(3).items()}
    state = algorithm.init(Seeds(0))
    clients["c1"].state = {"w": state["w"] + 1}

    class TwoAnswer:
        def evaluate(self, round_, state):
            return {cid: algorithm.client_metrics(state, clients[cid], round_) for cid in ("c2", "c1")}

    record = evaluate(algorithm, TwoAnswer(), state, clients, 1)
    answered = [trainer.evaluate(state)["mse"], trainer.evaluate(clients["c1"].state)["mse"]]
    assert record["eval_missing"] == ["c0"] and record["mse"] == pytest.approx(np.mean(answered))
    assert evaluate(algorithm, InProcess(algorithm, clients, 0), state, clients, 1) == \
        algorithm.evaluate(state, clients, 1)
