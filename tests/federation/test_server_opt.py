"""Each server optimiser equals its published update rule (Reddi et al. 2021, Algorithm 2; Hsu et al. 2019 for
FedAvgM), checked on one coordinate by hand over three rounds: clients whose local training adds a fixed change to
what they receive, so the combined change Δ_t of every round is known in advance. With η = 1 plain FedAvg is what
`FedAvg` computes; the state (moments included) survives a checkpoint and resume."""

import math

import numpy as np
import pytest

from collabalign.federation.server_opt import ServerOptimizer
from collabalign.federation.simulator import simulate
from collabalign.methods.fedavg import FedAvg, FedOpt, fedavg

CHANGE = {"a": 0.5, "b": 1.5}  # client -> what its local training adds to every parameter (weights 1 and 3)
SAMPLES = {"a": 1, "b": 3}


class Shift:
    """A LocalTrainer whose training adds the client's fixed change: the weighted mean change is 1.25 every round."""

    def initial_params(self, seeds):
        return {"w": np.array([1.0, -2.0])}

    def train(self, params, data, rng):
        return {"w": params["w"] + CHANGE[data]}, SAMPLES[data]

    def evaluate(self, params):
        return {"w0": float(params["w"][0])}


def by_hand(rule: str, lr: float, beta1: float, beta2: float, tau: float, x: float, rounds: int) -> float:
    """The published rule on one coordinate; every round's combined change is x̄ - x = 1.25."""
    m, v = 0.0, (tau**2 if rule in ("fedadagrad", "fedadam", "fedyogi") else 0.0)
    for _ in range(rounds):
        d = 1.25
        if rule == "fedavg":
            x += lr * d
        elif rule == "fedavgm":
            v = beta1 * v + d
            x += lr * v
        else:
            m = beta1 * m + (1 - beta1) * d
            if rule == "fedadagrad":
                v = v + d * d
            elif rule == "fedadam":
                v = beta2 * v + (1 - beta2) * d * d
            else:
                v = v - (1 - beta2) * d * d * math.copysign(1.0, v - d * d)
            x += lr * m / (math.sqrt(v) + tau)
    return x


@pytest.mark.parametrize("rule", ["fedavg", "fedavgm", "fedadagrad", "fedadam", "fedyogi"])
def test_each_rule_is_its_published_update(rule):
    opt = ServerOptimizer(rule=rule, lr=0.3, beta1=0.8, beta2=0.95, tau=0.01)
    algorithm = FedOpt(Shift(), server=opt)
    state = algorithm.init(None)
    for rnd in range(1, 4):
        replies = {cid: algorithm.client_update(m, type("C", (), {"data": cid, "torch_rng": None})())
                   for cid, m in algorithm.configure(state, rnd, ["a", "b"]).items()}
        state = algorithm.aggregate(state, replies, rnd)
        for i, start in enumerate((1.0, -2.0)):
            assert state["params"]["w"][i] == pytest.approx(by_hand(rule, 0.3, 0.8, 0.95, 0.01, start, rnd), abs=1e-12)


def test_fedavg_at_step_one_is_plain_fedavg_and_a_run_resumes_with_its_moments(tmp_path):
    assert type(fedavg(Shift(), server=ServerOptimizer())) is FedAvg
    plain = simulate(FedAvg(Shift()), {"a": "a", "b": "b"}, 3, seed=0, progress=False)
    same = simulate(FedOpt(Shift()), {"a": "a", "b": "b"}, 3, seed=0, progress=False)
    np.testing.assert_array_equal(plain.state["w"], same.state["params"]["w"])

    adam = FedOpt(Shift(), server=ServerOptimizer(rule="fedadam", lr=0.1))
    whole = simulate(adam, {"a": "a", "b": "b"}, 4, seed=0, progress=False)
    simulate(adam, {"a": "a", "b": "b"}, 2, seed=0, progress=False, checkpoint=tmp_path / "ck")
    resumed = simulate(adam, {"a": "a", "b": "b"}, 4, seed=0, progress=False, checkpoint=tmp_path / "ck", resume=True)
    assert [m["round"] for m in resumed.metrics] == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(whole.state["params"]["w"], resumed.state["params"]["w"])
    np.testing.assert_array_equal(whole.state["moments"]["v"]["w"], resumed.state["moments"]["v"]["w"])
