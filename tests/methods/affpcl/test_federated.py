"""AffPCL and FedAvg as federated algorithms: same errors as the vectorised code, communication in the ledger."""

import numpy as np
import pytest

from collabalign.federation import simulate
from collabalign.methods.affpcl import GaussianSystems, run_affpcl, run_fedavg
from collabalign.methods.affpcl.common import draw_noise
from collabalign.methods.affpcl.federated import AffPCLFederated, FedAvgFederated, agent_data, payload_bytes

STEPS = 25


@pytest.fixture(scope="module")
def setup():
    system = GaussianSystems(np.random.default_rng(0), 1, 5, delta_env=0.3, delta_obj=0.3)
    return system, agent_data(system, draw_noise(system, STEPS, np.random.default_rng(1)))


@pytest.mark.parametrize("algorithm,vectorised", [(AffPCLFederated, run_affpcl), (FedAvgFederated, run_fedavg)])
def test_simulator_matches_vectorised_run_to_float32_precision(setup, algorithm, vectorised):
    system, data = setup
    result = simulate(algorithm(system, 0.01), data, STEPS, seed=0, progress=False)
    expected = vectorised(system, STEPS, 0.01, np.random.default_rng(1)).mean(-1)[:, 0]
    np.testing.assert_allclose([m["mse0"] for m in result.metrics[1:]], expected, rtol=1e-5)
    assert len(result.ledger.rows) == 2 * 5 * STEPS  # one download and one upload per agent per step


def test_affpcl_payload_is_within_remark_1(setup):
    system, data = setup
    aff, fed = payload_bytes(AffPCLFederated(system, 0.01), data), payload_bytes(FedAvgFederated(system, 0.01), data)
    d = system.d
    assert aff == {"down": 3 * 4 * d, "up": 4 * 4 * d} and fed == {"down": 4 * d, "up": 4 * d}


def test_affpcl_needs_every_agent_each_step(setup):
    system, data = setup
    with pytest.raises(ValueError, match="every agent"):
        simulate(AffPCLFederated(system, 0.01), data, 2, seed=0, fraction=0.6, progress=False)
