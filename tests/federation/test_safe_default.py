"""The engine's safe default: a client whose update is far above the round's others is dropped, a non-finite or
overflowing aggregate is never committed, and non-finite metrics are written as valid JSON."""

import json

import numpy as np
import pytest

from collabalign.federation import simulate
from collabalign.federation.checkpoint import Checkpoint
from collabalign.federation.engine import OUTLIER_FACTOR, EngineOptions, RoundFailed, outliers, within_float32
from collabalign.methods.fedavg import FedAvg
from collabalign.report import write_report
from collabalign.runs import RunDir, metric_line

from .test_engine import BAD, Faulty, Without, run, with_w
from .toy import LeastSquares


class Amplified(FedAvg):
    """FedAvg whose client BAD sends `factor` times its honest update in every round."""

    def __init__(self, trainer, factor):
        super().__init__(trainer)
        self.factor = factor

    def client_update(self, message, client):
        reply = super().client_update(message, client)
        if client.cid != BAD:
            return reply
        start = message["w"].astype(np.float64)
        return with_w(reply, (start + (reply["w"] - start) * self.factor).astype(np.float32))


class Float32Sum(FedAvg):
    """FedAvg that sums n_i * w_i in float32 before dividing: one large but finite reply overflows the sum."""

    def aggregate(self, state, replies, round_):
        total = sum(np.float32(r.meta["n"]) * r["w"] for r in replies.values())
        return {"w": total / np.float32(sum(r.meta["n"] for r in replies.values()))}


class Float32SumWithout(Float32Sum):
    """The reference: `Float32Sum` without BAD's reply in round 3."""

    def aggregate(self, state, replies, round_):
        kept = {c: r for c, r in replies.items() if (c, round_) != (BAD, 3)}
        return super().aggregate(state, kept, round_)


class Overflowing(Float32Sum, Faulty):
    """`Float32Sum` whose client BAD replies with float32's largest values in round 3."""

    def __init__(self, trainer):
        super().__init__(trainer, lambda r: with_w(r, np.full(3, 3e38, np.float32)), rounds=(3,))


@pytest.mark.parametrize("factor", [1e6, 1e30])
def test_by_default_a_client_sending_a_huge_update_every_round_is_dropped_and_named(factor):
    poisoned = run(Amplified(LeastSquares(), factor))
    reference = run(Without(LeastSquares()))
    assert poisoned.state["w"].tobytes() == reference.state["w"].tobytes()
    faults = [(f["round"], f["client"], f["kind"]) for f in poisoned.faults]
    assert faults == [(r, BAD, "rejected") for r in range(1, 7)]
    assert all(f"outlier_factor {OUTLIER_FACTOR:g}" in f["reason"] for f in poisoned.faults)
    assert poisoned.metrics[-1]["mse"] < 1e-3 and poisoned.metrics[-1]["dropped_clients"] == {
        f"{BAD}@6": f"rejected: {poisoned.faults[-1]['reason']}"}


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_switched_off_the_huge_update_reaches_the_state_and_its_infinite_metric_is_written_as_null(tmp_path):
    poisoned = run(Amplified(LeastSquares(), 1e6), options=EngineOptions(outlier_factor=None))
    assert not poisoned.faults and poisoned.metrics[-1]["mse"] == float("inf")
    RunDir(tmp_path).write_metrics(poisoned.metrics)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line, parse_constant=pytest.fail) for line in lines]  # no Infinity or NaN
    assert records[-1] == {"mse": None, "nonfinite": ["mse"], "round": 6}
    assert records[1]["mse"] > 1 and "nonfinite" not in records[1]
    assert write_report(tmp_path, "poisoned", plot_metrics=("mse",)).exists()  # a null plots as a gap


def test_honest_clients_are_never_screened_and_a_factor_just_above_them_drops_only_the_outlier():
    honest = run(FedAvg(LeastSquares()))
    assert not honest.faults
    tight = run(Amplified(LeastSquares(), 3.0), options=EngineOptions(outlier_factor=2.5))
    assert {f["client"] for f in tight.faults} == {BAD}


def test_two_replies_are_screened_against_each_other_and_a_single_one_is_not():
    two = run(Amplified(LeastSquares(), 1e6), fraction=0.4)  # 2 of 5 sampled per round
    sampled_bad = [f["round"] for f in two.faults]
    assert sampled_bad and all(f["client"] == BAD for f in two.faults)
    one = run(Amplified(LeastSquares(), 1e6), fraction=0.2, options=EngineOptions(outlier_factor=2.0))
    assert not one.faults


def test_outliers_compares_each_norm_with_the_median_of_the_others():
    assert outliers({"a": 1.0, "b": 1.2, "c": 0.9, "d": 500.0}, 100.0).keys() == {"d"}
    assert outliers({"a": 1.0, "b": 1000.0}, 100.0).keys() == {"b"}
    assert outliers({"a": 1.0, "b": 100.0}, 100.0) == {}  # at the factor exactly: kept
    assert outliers({"a": 1e9}, 100.0) == {}  # a single reply: nothing to compare with
    assert outliers({"a": 0.0, "b": 0.0, "c": 5.0}, 100.0) == {}  # the others sent no update: no scale
    assert outliers({"a": 1.0, "b": 1e9}, None) == {}
    assert "1e+03 times the median 1" in outliers({"a": 1.0, "b": 1000.0}, 10.0)["b"]


def test_the_factor_is_one_setting_validated_like_the_others_and_dumped_only_when_changed():
    assert EngineOptions().outlier_factor == OUTLIER_FACTOR
    assert EngineOptions.model_validate({"outlier_factor": None}).outlier_factor is None
    for bad in (1.0, 0.5, -3):
        with pytest.raises(ValueError, match="outlier_factor"):
            EngineOptions.model_validate({"outlier_factor": bad})
    assert "outlier_factor" not in EngineOptions().model_dump()  # snapshots and cache keys from before still match
    assert EngineOptions(outlier_factor=None).model_dump(mode="json")["outlier_factor"] is None


def test_within_float32_walks_state_trees():
    assert within_float32({"w": np.ones(3, np.float32), "seen": ["a"], "G": {"x": (1.0, 2)}, "n": 3})
    assert not within_float32({"G": {"x": [np.array([1.0, np.nan])]}})
    assert not within_float32({"w": np.array([1e39])})  # float64, beyond float32's range
    assert not within_float32([float("inf")])


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_an_overflowing_aggregate_is_not_committed_and_the_round_goes_on_without_the_client_that_caused_it():
    faulty = run(Overflowing(LeastSquares()), options=EngineOptions(outlier_factor=None))
    reference = run(Float32SumWithout(LeastSquares()))
    assert faulty.state["w"].tobytes() == reference.state["w"].tobytes()
    assert [(f["round"], f["client"]) for f in faulty.faults] == [(3, BAD)]
    assert "non-finite or beyond float32" in faulty.faults[0]["reason"]


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_when_too_few_replies_are_left_the_round_fails_and_the_last_completed_state_is_kept(tmp_path):
    trainer = LeastSquares()
    with pytest.raises(RoundFailed, match=rf"round 3: 4 valid replies of 5, min_replies = 5; dropped: {{'{BAD}'"):
        simulate(Overflowing(trainer), trainer.client_data(5), rounds=6, seed=3, progress=False,
                 checkpoint=tmp_path / "ck", options=EngineOptions(outlier_factor=None, min_replies=5))
    round_, tree, _ = Checkpoint(tmp_path / "ck").load()
    two_rounds = run(Float32Sum(LeastSquares()), rounds=2)
    assert round_ == 2 and tree["state"]["w"].tobytes() == two_rounds.state["w"].tobytes()


def test_metric_line_keeps_finite_records_byte_for_byte_and_nulls_nested_non_finite_values():
    record = {"round": 2, "mse": 0.5, "cells": [{"gain": 1.0}], "dropped_clients": {"c1@2": "timeout"}}
    assert metric_line(record) == json.dumps(record, sort_keys=True)
    bad = {"round": 2, "loss": float("nan"), "per": {"a": float("-inf"), "b": [1.0, float("inf")]}}
    assert json.loads(metric_line(bad), parse_constant=pytest.fail) == {
        "round": 2, "loss": None, "per": {"a": None, "b": [1.0, None]}, "nonfinite": ["loss", "per.a", "per.b.1"]}


def test_a_nan_metric_survives_the_checkpoint_and_a_continued_run_writes_the_same_metrics_file(tmp_path):
    class NanAtRound2(FedAvg):
        def evaluate(self, state, clients, round_):
            return {"mse": float("nan") if round_ == 2 else super().evaluate(state, clients, round_)["mse"]}

    trainer, ck = LeastSquares(), tmp_path / "ck"
    full = simulate(NanAtRound2(trainer), trainer.client_data(5), rounds=3, seed=3, progress=False)
    simulate(NanAtRound2(trainer), trainer.client_data(5), rounds=2, seed=3, progress=False, checkpoint=ck)
    resumed = simulate(NanAtRound2(trainer), trainer.client_data(5), rounds=3, seed=3, progress=False, checkpoint=ck,
                       resume=True)
    RunDir(tmp_path / "a").write_metrics(full.metrics)
    RunDir(tmp_path / "b").write_metrics(resumed.metrics)
    text = (tmp_path / "a" / "metrics.jsonl").read_text()
    assert text == (tmp_path / "b" / "metrics.jsonl").read_text()
    assert '"mse": null, "nonfinite": ["mse"], "round": 2' in text
