"""Robust aggregation rules and client-level DP of the FedAvg family."""

import numpy as np
import pytest

from collabalign.comm import Message
from collabalign.config import ConfigError, validate
from collabalign.federation import simulate
from collabalign.federation.aggregation import Aggregation, Privacy, combine, privacy_spent
from collabalign.methods.fedavg import FedAvg

from .toy import LeastSquares


def replies(values):
    return [Message({"w": np.asarray(v, np.float32)}, {"n": 10}) for v in values]


HONEST = [[1.0, 2.0], [1.1, 2.1], [0.9, 1.9], [1.0, 2.2]]
BASE = {"w": np.zeros(2, np.float32)}


@pytest.mark.parametrize("rule", ["median", "trimmed_mean"])
def test_robust_rules_ignore_one_large_but_finite_reply(rule):
    poisoned = replies(HONEST + [[1e4, -1e4]])
    cfg = Aggregation(rule=rule, trim=0.2)
    robust = combine(BASE, poisoned, np.ones(5), cfg, 1)["w"]
    mean = combine(BASE, poisoned, np.ones(5), Aggregation(), 1)["w"]
    assert np.abs(robust - np.array([1.0, 2.0])).max() < 0.15 < np.abs(mean - np.array([1.0, 2.0])).max()
    assert robust.dtype == np.float32


def test_trimmed_mean_cuts_the_extremes_per_coordinate():
    got = combine(BASE, replies([[0, 9], [1, 1], [2, 2], [3, 3], [100, -5]]), np.ones(5),
                  Aggregation(rule="trimmed_mean", trim=0.2), 1)["w"]
    np.testing.assert_allclose(got, [2.0, 2.0])  # (1+2+3)/3 and (1+2+3)/3


def test_private_mean_clips_each_update_and_adds_noise_of_the_stated_scale():
    dp = Privacy(clip=1.0, noise_multiplier=0.0)
    out = combine(BASE, replies([[30.0, 40.0], [0.3, 0.4]]), np.ones(2), Aggregation(privacy=dp), 1)["w"]
    np.testing.assert_allclose(out, [(0.6 + 0.3) / 2, (0.8 + 0.4) / 2], rtol=1e-6)  # (30, 40) clipped to norm 1
    big = {"w": np.zeros(20000, np.float32)}
    noisy = Privacy(clip=0.5, noise_multiplier=2.0, seed=3)
    msgs = [Message({"w": np.zeros(20000, np.float32)}, {"n": 1}) for _ in range(4)]
    draw = combine(big, msgs, np.ones(4), Aggregation(privacy=noisy), 7)["w"]
    assert abs(draw.std() - 2.0 * 0.5 / 4) < 0.01
    assert np.array_equal(draw, combine(big, msgs, np.ones(4), Aggregation(privacy=noisy), 7)["w"])
    assert not np.array_equal(draw, combine(big, msgs, np.ones(4), Aggregation(privacy=noisy), 8)["w"])


def test_privacy_spent_grows_with_rounds_and_sampling_and_shrinks_with_noise():
    dp = Privacy(clip=1.0, noise_multiplier=2.0, delta=1e-5)
    eps = [privacy_spent(dp, 100, 10, t) for t in (1, 10, 100)]
    assert 0 < eps[0] < eps[1] < eps[2]
    assert privacy_spent(dp, 100, 50, 10) > eps[1]  # more clients per round: more exposure each
    assert privacy_spent(Privacy(clip=1.0, noise_multiplier=4.0), 100, 10, 10) < eps[1]
    assert privacy_spent(Privacy(clip=1.0, noise_multiplier=0.0), 100, 10, 10) == float("inf")
    # every client every round (q = 1): T Gaussian mechanisms of multiplier s = z / 2; the classical RDP -> DP
    # conversion min_a T a / (2 s^2) + log(1 / delta) / (a - 1) bounds the accountant's (tighter) ε from above
    s, t = 1.0, 10
    classic = min(t * a / (2 * s * s) + np.log(1e5) / (a - 1) for a in np.linspace(1.01, 200, 20000))
    assert 0.7 * classic < privacy_spent(dp, 10, 10, t) <= classic


def test_fedavg_with_privacy_still_learns_and_configs_are_checked():
    trainer = LeastSquares()
    dp = Aggregation(privacy=Privacy(clip=5.0, noise_multiplier=0.05, seed=1))
    result = simulate(FedAvg(trainer, dp), trainer.client_data(6), rounds=8, seed=0, progress=False)
    assert result.metrics[-1]["mse"] < 0.1 * result.metrics[0]["mse"]
    with pytest.raises(ConfigError, match="trim"):
        validate(Aggregation, {"rule": "trimmed_mean", "trim": 0.5})
    with pytest.raises(ConfigError, match="clip"):
        validate(Aggregation, {"privacy": {"clip": -1, "noise_multiplier": 1}})
