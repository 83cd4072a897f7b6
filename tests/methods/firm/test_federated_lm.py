"""FIRM and its baselines on a tiny language-model policy: the messages each method sends (bytes exactly), λ per
step, the server's λ for FedCMOO-A, determinism, and private client state across rounds."""

import numpy as np
import pytest
import torch

from collabalign.comm import Message
from collabalign.federation import simulate
from collabalign.methods.firm.federated import ClientData, FederatedPPO, FederatedRLOO, LambdaRule, Rollouts
from collabalign.models.backbones import tiny_llama
from collabalign.policy import Policy, PPOConfig

ROLLOUTS = Rollouts(batches=2, batch_size=4, max_new_tokens=4)
PPO = PPOConfig(minibatch=2, actor_lr=1e-3)


def long_reward(prompts, responses):
    return np.array([min(len(r), 20) / 20 for r in responses])


def short_reward(prompts, responses):
    return 1 - long_reward(prompts, responses)


@pytest.fixture(scope="module")
def policy():
    return Policy(tiny_llama(seed=0), rank=4, alpha=8.0, dropout=0.0, objectives=2,
                  generator=torch.Generator().manual_seed(0))


def clients(n=2):
    prompts = [f"Question number {i}: what is {i} plus {i}?" for i in range(12)]
    return {f"c{c}": ClientData(prompts[c::n], (long_reward, short_reward)) for c in range(n)}


def run(policy, rule, rounds=2, seed=0, step="ppo"):
    algorithm = (FederatedPPO(policy, rule, PPO, ROLLOUTS) if step == "ppo"
                 else FederatedRLOO(policy, rule, PPO, ROLLOUTS, samples=2))
    per = algorithm.engine_rounds_per_round
    return simulate(algorithm, clients(), rounds * per, seed=seed, eval_every=per, progress=False)


def test_firm_uploads_the_adapter_only_and_logs_lambda_per_step(policy):
    result = run(policy, LambdaRule("firm", beta=0.01))
    adapter = Message(policy.adapter_state(), {"n": ROLLOUTS.batches * ROLLOUTS.batch_size})
    assert result.ledger.total("up") == 2 * 2 * adapter.nbytes  # rounds x clients x one adapter
    steps = ROLLOUTS.batches * ROLLOUTS.batch_size // PPO.minibatch
    lam = result.clients["c0"].state["lambda_log"]
    assert lam.shape == (steps, 2) and np.allclose(lam.sum(1), 1) and (lam >= 0).all()
    last = result.metrics[-1]
    assert {"lambda_0", "lambda_dispersion", "train_reward_0", "train_reward_1"} <= set(last)
    assert "kl_coef" in result.clients["c0"].state and "actor.0.exp_avg" in result.clients["c0"].state


@pytest.mark.parametrize("step, replies", [("ppo", 1), ("rloo", 2)])
def test_fedcmoo_uploads_m_gradients_and_every_client_uses_the_server_lambda(policy, step, replies):
    result = run(policy, LambdaRule("server", beta=0.0), step=step)
    n = ROLLOUTS.batches * ROLLOUTS.batch_size * replies
    adapter = Message(policy.adapter_state(), {"n": n})
    d = sum(a.size for a in adapter.values())
    grads = Message({"grads": np.zeros((d, 2), np.float32)}, {"n": ROLLOUTS.batch_size * replies})
    assert result.ledger.total("up") == 2 * 2 * (adapter.nbytes + grads.nbytes)
    assert grads.array_nbytes == 2 * adapter.array_nbytes
    logs = [c.state["lambda_log"] for c in result.clients.values()]
    assert np.allclose(logs[0], logs[1]) and np.allclose(logs[0], logs[0][0])  # one λ per round, all clients
    assert [m["round"] for m in result.metrics] == [0, 2, 4]


def test_fixed_weights_and_determinism(policy):
    a = run(policy, LambdaRule("fixed", w=(0.3, 0.7)), rounds=1)
    b = run(policy, LambdaRule("fixed", w=(0.3, 0.7)), rounds=1)
    assert np.allclose(a.clients["c1"].state["lambda_log"], [0.3, 0.7])
    assert a.metrics == b.metrics
    for name, value in a.state["params"].items():
        np.testing.assert_array_equal(value, b.state["params"][name])
    c = run(policy, LambdaRule("fixed", w=(0.3, 0.7)), rounds=1, seed=1)
    assert any(not np.array_equal(v, c.state["params"][k]) for k, v in a.state["params"].items())


def test_bad_rules_are_refused():
    with pytest.raises(ValueError, match="firm, fixed or server"):
        LambdaRule("mgda")
    with pytest.raises(ValueError, match="weights w"):
        LambdaRule("fixed")


def test_rloo_logs_its_sequence_kl_and_a_coefficient_that_moves(policy):
    result = run(policy, LambdaRule("firm", beta=0.01), step="rloo")
    state = result.clients["c0"].state
    assert state["kl_log"].shape == (ROLLOUTS.batches,) and state["lambda_log"].shape == (ROLLOUTS.batches, 2)
    last = result.metrics[-1]
    assert last["kl_coef"] != PPO.kl_init and last["train_kl"] == pytest.approx(
        np.mean([c.state["kl_log"].mean() for c in result.clients.values()]))
    with pytest.raises(ValueError, match="at least 2 samples"):
        FederatedRLOO(policy, LambdaRule("firm"), PPO, ROLLOUTS, samples=1)
