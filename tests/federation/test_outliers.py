"""The outlier screen when a round holds several outsized replies: each of them is rejected and named, every honest
reply is kept, and the aggregate is the mean of the honest ones alone."""

import numpy as np
import pytest

from collabalign.comm import Message
from collabalign.federation.engine import OUTLIER_FACTOR, Failure, outliers, run_rounds
from collabalign.federation.protocol import ClientContext
from collabalign.methods.fedavg import FedAvg
from collabalign.seeding import Seeds

ROUNDS = {  # update norms of a round's clients: honest ones near 1, outsized ones from 300 up, interleaved
    "2-of-5-outsized": {"c0": 1.0, "c1": 300.0, "c2": 0.8, "c3": 2000.0, "c4": 1.2},
    "3-of-7-outsized": {"c0": 1.0, "c1": 500.0, "c2": 0.8, "c3": 300.0, "c4": 1.2, "c5": 2000.0, "c6": 0.9},
    "2-of-4-outsized": {"c0": 300.0, "c1": 1.0, "c2": 2000.0, "c3": 0.8},
    "3-of-6-outsized": {"c0": 1.0, "c1": 300.0, "c2": 500.0, "c3": 0.8, "c4": 1.2, "c5": 2000.0},
}


def outsized(norms: dict[str, float]) -> list[str]:
    """The clients of a round in `ROUNDS` that sent an outsized update, in client order."""
    return [cid for cid, norm in norms.items() if norm >= 300]


@pytest.mark.parametrize("norms", list(ROUNDS.values()), ids=list(ROUNDS))
def test_every_outsized_reply_is_found_while_fewer_than_half_of_its_others_are_outsized(norms):
    found = outliers(norms, OUTLIER_FACTOR)
    assert set(found) == set(outsized(norms))
    for cid in found:  # each is measured against the median of the others, never with itself among them
        others = [v for c, v in norms.items() if c != cid]
        assert f"the median {np.median(others):.4g} of the round's other replies" in found[cid]


def test_with_outsized_replies_in_the_majority_the_screen_has_no_honest_scale_and_rejects_none():
    assert outliers({"c0": 1.0, "c1": 300.0, "c2": 500.0, "c3": 0.8, "c4": 2000.0}, OUTLIER_FACTOR) == {}


class StartAtZero:
    """A LocalTrainer stand-in for FedAvg: the parameters start at zero (the replies come from `FixedUpdates`)."""

    def initial_params(self, seeds: Seeds) -> dict[str, np.ndarray]:
        return {"w": np.zeros(4, np.float32)}

    def evaluate(self, params: dict[str, np.ndarray]) -> dict[str, float]:
        return {}


class FixedUpdates:
    """A transport whose client `cid` replies with the broadcast plus `updates[cid]`, with sample count 1."""

    def __init__(self, updates: dict[str, np.ndarray]):
        self.updates = updates

    def exchange(self, round_: int, messages: dict[str, Message]) -> dict[str, Message | Failure]:
        return {cid: Message({"w": msg["w"] + self.updates[cid]}, {"n": 1}) for cid, msg in messages.items()}

    def evaluate(self, round_: int, state: dict[str, np.ndarray]) -> None:
        return None


def updates_with(norms: dict[str, float]) -> dict[str, np.ndarray]:
    """One float32 update per client with the given L2 norm, each in its own direction."""
    directions = np.random.default_rng(0).normal(size=(len(norms), 4))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    return {cid: (norm * d).astype(np.float32) for (cid, norm), d in zip(norms.items(), directions, strict=True)}


@pytest.mark.parametrize("norms", [ROUNDS["2-of-5-outsized"], ROUNDS["3-of-7-outsized"]], ids=["2-of-5", "3-of-7"])
def test_a_round_with_several_outsized_replies_aggregates_the_mean_of_the_honest_ones(norms):
    updates = updates_with(norms)
    clients = {cid: ClientContext(cid, None) for cid in norms}
    result = run_rounds(FedAvg(StartAtZero()), FixedUpdates(updates), clients, rounds=1, seed=0)
    rejected = outsized(norms)
    assert [(f["round"], f["client"], f["kind"]) for f in result.faults] == [(1, cid, "rejected") for cid in rejected]
    assert all(f"outlier_factor {OUTLIER_FACTOR:g}" in f["reason"] for f in result.faults)
    assert result.metrics[-1]["dropped"] == len(rejected) and set(result.metrics[-1]["dropped_clients"]) == {
        f"{cid}@1" for cid in rejected}
    honest_mean = np.mean([updates[cid] for cid in norms if cid not in rejected], axis=0)
    np.testing.assert_allclose(result.state["w"], honest_mean, rtol=1e-6, atol=1e-7)
