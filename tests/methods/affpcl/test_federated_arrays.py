"""Federated AffPCL on agent arrays (one round per step, agents as clients) is `train_affpcl`'s AffPCL: the same
personal and central models to float64 rounding, whatever the step sizes and batch; each agent's model saved where
its state is equals the one the job gathers; the server refuses row ids outside the pooled rows."""

import numpy as np
import pytest

from collabalign.comm import Message
from collabalign.examples import agent_arrays
from collabalign.methods.affpcl.entry import AffPCLConfig, train_affpcl
from collabalign.methods.affpcl.federated_arrays import (
    FederatedAffPCLConfig,
    affpcl_federated_job,
    train_affpcl_federated,
)

ARRAYS = agent_arrays(agents=3, seed=5)
AGENTS = {k[2:]: (v, ARRAYS[f"y_{k[2:]}"]) for k, v in ARRAYS.items() if k.startswith("X_")}


@pytest.mark.parametrize("settings", [{"steps": 300}, {"steps": 120, "alpha": 0.02, "decay": 0.01, "batch": 3,
                                                        "seed": 7}])
def test_the_federated_run_is_the_centralised_affpcl(settings):
    federated = train_affpcl_federated(FederatedAffPCLConfig(**settings, eval_every=40), AGENTS)
    central = train_affpcl(AffPCLConfig(**settings, ratios="exact", test_fraction=0), AGENTS)
    assert sorted(federated.arrays) == sorted(central.arrays) == ["central", *(f"solution/{a}" for a in AGENTS)]
    for name, value in central.arrays.items():
        np.testing.assert_allclose(federated.arrays[name], value, rtol=0, atol=1e-12, err_msg=name)
    assert federated.metrics["ls_error"] == pytest.approx(np.mean(list(central.metrics["ls_error"].values())), 1e-9)
    assert federated.metrics["ls_error"] < federated.metrics["rounds"][0]["ls_error"] / 4  # it learned (noisy rows)


def test_each_agents_own_result_is_what_the_job_gathers():
    job = affpcl_federated_job(FederatedAffPCLConfig(steps=30), AGENTS)
    sim = job.simulate()
    gathered = job.finish(sim).arrays
    for client in sim.clients.values():
        own = job.personal(sim.state, client).arrays
        (name, value), = own.items()
        np.testing.assert_array_equal(value, gathered[name])


def test_row_ids_outside_the_pooled_rows_are_refused():
    job = affpcl_federated_job(FederatedAffPCLConfig(steps=2), AGENTS)
    state = job.algorithm.init(None)
    bad = {cid: Message({"per": np.zeros((8, 5)), "rows": np.full(8, 10**6)}) for cid in job.clients}
    with pytest.raises(ValueError, match="row ids outside"):
        job.algorithm.aggregate(state, bad, 1)
