import numpy as np
import pytest

from collabalign.federation import sample_clients, simulate
from collabalign.methods.fedavg import FedAvg, LocalOnly
from collabalign.runs import RunDir
from collabalign.seeding import Seeds

from .toy import LeastSquares, ManyAtOnce


def run(tmp_path=None, **kw):
    trainer = LeastSquares()
    return simulate(FedAvg(trainer), trainer.client_data(6), rounds=6, seed=3, progress=False, **kw)


def test_fedavg_converges_and_ledger_counts_every_message():
    res = run(fraction=0.5)
    assert res.metrics[0]["round"] == 0 and res.metrics[-1]["round"] == 6
    assert res.metrics[-1]["mse"] < 0.05 * res.metrics[0]["mse"]
    per_round = res.ledger.per_round()
    assert len(per_round) == 6
    # 3 of 6 clients per round, each receives and returns one 3-float message
    assert all(len([r for r in res.ledger.rows if r[0] == rnd and r[2] == "up"]) == 3 for rnd in per_round)
    msg_bytes = res.ledger.rows[0][3]
    assert res.ledger.total("down") == 6 * 3 * msg_bytes


def test_same_seed_gives_byte_identical_metrics(tmp_path):
    a, b = RunDir(tmp_path / "a"), RunDir(tmp_path / "b")
    a.write_metrics(run().metrics)
    b.write_metrics(run().metrics)
    assert (tmp_path / "a/metrics.jsonl").read_bytes() == (tmp_path / "b/metrics.jsonl").read_bytes()
    c = RunDir(tmp_path / "c")
    trainer = LeastSquares()
    c.write_metrics(simulate(FedAvg(trainer), trainer.client_data(6), rounds=6, seed=4, progress=False).metrics)
    assert (tmp_path / "c/metrics.jsonl").read_bytes() != (tmp_path / "a/metrics.jsonl").read_bytes()


def test_resume_after_checkpoint_equals_uninterrupted_run(tmp_path):
    full = run(fraction=0.5)
    ckpt = tmp_path / "ckpt"
    trainer = LeastSquares()
    data = trainer.client_data(6)
    simulate(FedAvg(trainer), data, rounds=4, seed=3, fraction=0.5, checkpoint=ckpt, progress=False)
    resumed = simulate(FedAvg(trainer), data, rounds=6, seed=3, fraction=0.5, checkpoint=ckpt, resume=True,
                       progress=False)
    assert resumed.metrics == full.metrics
    assert resumed.ledger.rows == full.ledger.rows
    np.testing.assert_array_equal(resumed.state["w"], full.state["w"])


@pytest.mark.parametrize("algorithm", [FedAvg, LocalOnly])
def test_the_sampled_clients_train_in_one_call_when_the_trainer_can(algorithm):
    trainer, plain = ManyAtOnce(), LeastSquares()
    many = simulate(algorithm(trainer), trainer.client_data(6), rounds=4, seed=3, fraction=0.5, progress=False)
    one_by_one = simulate(algorithm(plain), plain.client_data(6), rounds=4, seed=3, fraction=0.5, progress=False)
    assert trainer.calls == 4  # one call per round, for the 3 sampled clients together
    assert many.metrics == one_by_one.metrics and many.ledger.rows == one_by_one.ledger.rows
    np.testing.assert_array_equal(many.state["w"], one_by_one.state["w"])
    for cid, client in many.clients.items():  # local-only: each client's own model, kept between rounds
        assert client.state.keys() == one_by_one.clients[cid].state.keys()
        assert all((client.state[k] == one_by_one.clients[cid].state[k]).all() for k in client.state)


def test_local_only_keeps_private_state_and_sends_nothing_after_round_one():
    trainer = LeastSquares()
    res = simulate(LocalOnly(trainer), trainer.client_data(4), rounds=3, seed=0, progress=False)
    assert all(set(c.state) == {"w"} for c in res.clients.values())
    down = {rnd: b for rnd, b in ((r[0], r[3]) for r in res.ledger.rows if r[2] == "down")}
    assert down[1] > down[2] == down[3]  # round 1 carries the initial params, later rounds only metadata
    assert {"mse", "mse_min", "mse_max"} <= set(res.metrics[-1])


def test_sampling_is_seeded_and_validated():
    ids = [f"c{i}" for i in range(10)]
    a = sample_clients(Seeds(1), 5, ids, 0.3)
    assert a == sample_clients(Seeds(1), 5, ids, 0.3) and len(a) == 3
    assert sample_clients(Seeds(1), 5, ids, 1.0) == ids
    with pytest.raises(ValueError, match="fraction"):
        sample_clients(Seeds(1), 5, ids, 0.0)
