"""Tests that kill mutations the rest of the suite let live (issue 35): resume's `checkpoint.reset`, `min_replies`
between 1 and the sampled count, and FedAvg's sample weights."""

import json

import numpy as np
import pytest

from collabalign.comm import Message
from collabalign.federation import simulate
from collabalign.federation.checkpoint import Checkpoint
from collabalign.federation.engine import EngineOptions, RoundFailed
from collabalign.methods.fedavg import FedAvg

from .toy import LeastSquares


class Killed(Exception):
    """Stands for a kill -9 in the middle of a checkpoint save."""


def rounds_logged(folder):
    return [json.loads(line)["round"] for line in (folder / "rounds.jsonl").read_text().splitlines()]


def test_resume_after_a_kill_between_a_rounds_log_line_and_its_state_logs_each_round_once(tmp_path, monkeypatch):
    trainer, ck = LeastSquares(), tmp_path / "ck"
    data = trainer.client_data(5)
    save = Checkpoint.save

    def killed_at_round_3(self, round_, tree):
        if round_ == 3:
            raise Killed
        save(self, round_, tree)

    monkeypatch.setattr(Checkpoint, "save", killed_at_round_3)
    with pytest.raises(Killed):
        simulate(FedAvg(trainer), data, rounds=6, seed=3, checkpoint=ck, progress=False)
    monkeypatch.undo()
    assert rounds_logged(ck) == [0, 1, 2, 3] and Checkpoint(ck).load()[0] == 2  # round 3 logged, its state not
    resumed = simulate(FedAvg(trainer), data, rounds=6, seed=3, checkpoint=ck, resume=True, progress=False)
    full = simulate(FedAvg(trainer), data, rounds=6, seed=3, progress=False)
    assert resumed.metrics == full.metrics and resumed.ledger.rows == full.ledger.rows
    assert rounds_logged(ck) == list(range(7))
    again = simulate(FedAvg(trainer), data, rounds=6, seed=3, checkpoint=ck, resume=True, progress=False)
    assert again.metrics == full.metrics  # the finished run reads back, as a continued run folder does


class FailIn(FedAvg):
    """FedAvg whose clients `failing` raise in round `at`."""

    def __init__(self, trainer, failing, at):
        super().__init__(trainer)
        self.failing, self.at = set(failing), at

    def client_update(self, message, client):
        if client.cid in self.failing and message.meta["round"] == self.at:
            raise RuntimeError("network down")
        return super().client_update(message, client)


def test_a_round_with_some_but_fewer_than_min_replies_stops_and_keeps_the_last_state(tmp_path):
    trainer, ck = LeastSquares(), tmp_path / "ck"
    data, options = trainer.client_data(5), EngineOptions(min_replies=3)
    enough = simulate(FailIn(trainer, ["c0", "c1"], at=4), data, rounds=6, seed=3, progress=False, options=options)
    assert [(f["round"], f["client"]) for f in enough.faults] == [(4, "c0"), (4, "c1")]
    with pytest.raises(RoundFailed, match="round 4: 2 valid replies of 5, min_replies = 3"):
        simulate(FailIn(trainer, ["c0", "c1", "c2"], at=4), data, rounds=6, seed=3, checkpoint=ck, progress=False,
                 options=options)
    round_, saved, _ = Checkpoint(ck).load()
    three = simulate(FedAvg(trainer), data, rounds=3, seed=3, progress=False)
    assert round_ == 3 and saved["state"]["w"].tobytes() == three.state["w"].tobytes()


W = np.array([[1.0, 0.0], [0.0, 1.0], [4.0, 4.0]], np.float32)
N = [1, 3, 6]
WEIGHTED = (np.array(N, np.float64)[:, None] * W).sum(0) / sum(N)  # [2.5, 2.7]; the plain mean is [5/3, 5/3]


def test_fedavg_aggregates_replies_weighted_by_their_sample_counts():
    replies = {cid: Message({"w": w}, {"n": n}) for cid, w, n in zip("abc", W, N, strict=True)}
    state = FedAvg(LeastSquares()).aggregate({"w": np.zeros(2, np.float32)}, replies, 1)
    assert state["w"].dtype == np.float32
    np.testing.assert_allclose(state["w"], WEIGHTED, rtol=1e-6)


class Target:
    """A LocalTrainer whose client returns its data's target vector and its sample count."""

    def initial_params(self, seeds):
        return {"w": np.zeros(2, np.float32)}

    def train(self, params, data, rng):
        target, n = data
        return {"w": target}, n

    def evaluate(self, params):
        return {"w0": float(params["w"][0]), "w1": float(params["w"][1])}


def test_a_fedavg_round_is_the_sample_weighted_mean_of_the_clients():
    data = {f"c{i}": (w, n) for i, (w, n) in enumerate(zip(W, N, strict=True))}
    result = simulate(FedAvg(Target()), data, rounds=1, seed=0, progress=False)
    np.testing.assert_allclose(result.state["w"], WEIGHTED, rtol=1e-6)
