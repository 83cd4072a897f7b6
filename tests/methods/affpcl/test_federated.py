"""AffPCL as a federated algorithm: same errors as the vectorised rule; FedAvg is the project's one FedAvg with a
one-step Gaussian LocalTrainer; communication in the ledger."""

import numpy as np
import pytest
import torch

from collabalign.federation import simulate
from collabalign.federation.protocol import ClientContext
from collabalign.methods.affpcl import AffPCL, GaussianSystems, run
from collabalign.methods.affpcl.federated import AffPCLFederated, LocalStep, agent_data, payload_bytes
from collabalign.methods.fedavg import FedAvg
from collabalign.seeding import Seeds

STEPS = 25


@pytest.fixture(scope="module")
def setup():
    system = GaussianSystems(np.random.default_rng(0), 1, 5, delta_env=0.3, delta_obj=0.3)
    return system, agent_data(system, system.draw(STEPS, np.random.default_rng(1)))


def test_affpcl_on_the_simulator_matches_the_vectorised_rule_to_float32_precision(setup):
    system, data = setup
    result = simulate(AffPCLFederated(system, 0.01), data, STEPS, seed=0, progress=False)
    expected = run(AffPCL(), system, STEPS, 0.01, np.random.default_rng(1))[0].mean(-1)[:, 0]
    np.testing.assert_allclose([m["mse0"] for m in result.metrics[1:]], expected, rtol=1e-5)
    assert len(result.ledger.rows) == 2 * 5 * STEPS  # one download and one upload per agent per step


def test_fedavg_with_the_local_step_averages_one_sgd_step_per_agent(setup):
    system, data = setup
    result = simulate(FedAvg(LocalStep(system, 0.01)), data, STEPS, seed=3, progress=False)
    assert len(result.ledger.rows) == 2 * 5 * STEPS
    mse = [m["mse0"] for m in result.metrics]
    assert mse[-1] < 0.5 * mse[0]
    # round 1 by hand: from x = 0 each agent's step is 0.01 Phi(s) theta^i on a fresh sample from the round's
    # generator; the server averages the float32 models
    local = []
    for cid, d in data.items():
        client = ClientContext(cid, d)
        client.seed_round(Seeds(3), 1)
        i = d["index"]
        s = system.means[0, i] + torch.randn(5, generator=client.torch_rng, dtype=torch.float64).numpy()
        phi = (np.eye(5) + 0.5 * np.outer(s, s)) @ system.phi_base[0]
        local.append((0.01 * phi @ system.theta[0, i]).astype(np.float32))
    x1 = np.mean(local, axis=0)
    expected = np.mean([((x1 - system.xstar[0, i]) ** 2).sum() for i in range(5)])
    assert result.metrics[1]["mse0"] == pytest.approx(expected, rel=1e-5)


def test_affpcl_payload_is_within_remark_1(setup):
    system, data = setup
    aff = payload_bytes(AffPCLFederated(system, 0.01), data)
    fed = payload_bytes(FedAvg(LocalStep(system, 0.01)), data)
    d = system.d
    assert aff == {"down": 3 * 4 * d, "up": 4 * 4 * d} and fed == {"down": 4 * d, "up": 4 * d}


def test_affpcl_needs_every_agent_each_step(setup):
    system, data = setup
    with pytest.raises(ValueError, match="every agent"):
        simulate(AffPCLFederated(system, 0.01), data, 2, seed=0, fraction=0.6, progress=False)
