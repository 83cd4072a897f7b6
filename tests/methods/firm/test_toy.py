"""R3's toy federated alignment (spec §8 R3): analytic PPO gradients against finite differences, the exact held-out
evaluation against direct enumeration (at the spec's sizes and others), the λ rules at small sizes, FedAvg and the
prompt split."""

import itertools

import numpy as np
import pytest

from collabalign.experiments.firm.problems.toy import Arm, Setting, Toy, log_softmax, prompt_mix, simulate
from collabalign.experiments.firm.problems.toy_world import ToySizes, World, response_rewards, rewards
from collabalign.methods.firm.rules import Rule

SMALL = Setting(clients=2, rounds=2, local_batches=2, batch=8, minibatch=4, epochs=2, kl="fixed", kl_coef=0.05)
SIZES = ToySizes()


@pytest.fixture(scope="module")
def world():
    return World(np.random.default_rng(0), 2, SIZES)


def test_analytic_ppo_gradients_match_finite_differences(world):
    toy = Toy(world, [Arm("a", Rule("firm"))], SMALL, np.random.default_rng(1))
    b = slice(SIZES.rank * SIZES.hidden, None)  # the B factor, zero at the start
    toy.theta[:, b] = 0.3 * np.random.default_rng(2).standard_normal(toy.theta[:, b].shape)
    batch = toy.rollout()
    toy.theta = toy.theta + 0.05 * np.random.default_rng(3).standard_normal(toy.theta.shape)  # ratios != 1
    idx = np.tile(np.arange(4), (toy.n, 1))
    rows = np.arange(toy.n)[:, None]

    def loss(theta):
        old, toy.theta = toy.theta, theta
        z, _, _ = toy._logits(batch["x"][rows, idx])
        toy.theta = old
        y = batch["y"][rows, idx].reshape(toy.n, -1)
        ratio = np.exp(np.take_along_axis(log_softmax(z), y[..., None], -1)[..., 0]
                       - batch["logp_old"][rows, idx].reshape(toy.n, -1))[..., None]
        adv = np.repeat(batch["adv"][rows, idx], SIZES.length, 1)
        return np.maximum(-adv * ratio, -adv * np.clip(ratio, 0.8, 1.2)).mean(1)

    g = toy.gradients(batch, idx)
    for i in range(0, toy.d, 7):
        step = np.zeros_like(toy.theta)
        step[:, i] = 1e-6
        fd = (loss(toy.theta + step) - loss(toy.theta - step)) / 2e-6
        assert np.allclose(fd, g[:, i], atol=1e-8)


@pytest.mark.parametrize("sizes", [SIZES, ToySizes(vocab=5, length=3, prompts=3, hidden=6, rank=2)])
def test_exact_evaluation_equals_direct_enumeration(sizes):
    world = World(np.random.default_rng(0), 2, sizes)
    V, L, P = sizes.vocab, sizes.length, sizes.prompts
    arms = [Arm("a", Rule("ls")), Arm("b", Rule("ls"), correlated=True)]
    toy = Toy(world, arms, SMALL, np.random.default_rng(4))
    toy.theta = toy.theta + 0.3 * np.random.default_rng(5).standard_normal(toy.theta.shape)
    toy.theta = np.repeat(toy.theta[::2], 2, 0)  # clients of an (arm, replicate) share the global model
    table = response_rewards(world)
    got = toy.evaluate(table)
    combos = np.array(list(itertools.product(range(V), repeat=L)))
    for a, r in ((0, 1), (1, 0)):
        n = (a * 2 + r) * 2
        x = np.repeat(np.arange(P), len(combos))
        z, _, _ = toy._logits(np.arange(P)[None].repeat(toy.n, 0))
        logp = log_softmax(z)[n].reshape(P, L, V)
        seq = np.exp(sum(logp[:, pos, combos[:, pos]] for pos in range(L)))  # (P, V^L)
        sums = [t[r][combos].sum(-1) for t in (world.help, world.harm, world.qual)]
        rew = rewards(*(np.tile(s, P) for s in sums), world.risk[x], np.array(a == 1))
        expected = (seq.ravel()[:, None] * rew).sum(0) / P
        assert np.allclose(got[a, r], expected, atol=1e-12)


def test_rules_at_small_sizes(world):
    arms = [Arm("ls", Rule("ls")), Arm("big-beta", Rule("firm", beta=1e8)), Arm("fed", Rule("fedcmoo")),
            Arm("help", Rule("firm", p=(1.9, 0.1))), Arm("harm", Rule("firm", p=(0.1, 1.9)))]
    out = simulate(world, arms, SMALL, np.random.default_rng(6))
    lam = out["lambda"]  # (steps, A, R, C, M)
    assert lam.shape == (2 * 2 * 2 * 2, 5, 2, 2, 2)
    assert np.allclose(lam[:, 0], 0.5) and np.abs(lam[:, 1] - 0.5).max() < 1e-6
    assert out["dispersion"][:, [0, 1, 2]].max() < 1e-12  # LS, β → ∞ and the server's λ: identical across clients
    assert lam[:, 3, ..., 0].mean() > 0.6 > 0.4 > lam[:, 4, ..., 0].mean()
    assert out["held_out"].shape == (3, 5, 2, 2) and np.allclose(out["held_out"][0], out["held_out"][0, :1])
    assert out["train_rewards"].shape == (4, 5, 2, 2) and out["kl"].shape == (4, 5, 2)


def test_fedcmoo_weights_are_constant_within_a_round(world):
    out = simulate(world, [Arm("fed", Rule("fedcmoo"))], SMALL, np.random.default_rng(7))
    per_round = out["lambda"][:, 0].reshape(2, -1, 2, 2, 2)  # (rounds, steps, R, C, M)
    assert np.allclose(per_round, per_round[:, :1])


def test_fedavg_makes_clients_equal_and_adam_state_stays_private(world):
    toy = Toy(world, [Arm("a", Rule("firm", beta=0.01))], SMALL, np.random.default_rng(8))
    toy.run(response_rewards(world))
    assert np.allclose(toy.theta[0], toy.theta[1]) and not np.allclose(toy.adam_m[0], toy.adam_m[1])
    assert not np.allclose(toy.theta[0], toy.theta[2])  # replicates differ


def test_prompt_mix_iid_and_dirichlet():
    setting = Setting(clients=8, prompts_per_type=32, dirichlet_alpha=0.3)
    arms = [Arm("iid", Rule("ls")), Arm("dir", Rule("ls"), split="dirichlet")]
    mix = prompt_mix(arms, setting, World(np.random.default_rng(0), 3, SIZES), np.random.default_rng(9))
    assert mix.shape == (2, 3, 8, SIZES.prompts) and np.allclose(mix.sum(-1), 1)
    assert mix[1].max(-1).mean() > 2 * mix[0].max(-1).mean()  # Dirichlet(0.3) clients concentrate on few types


def test_heterogeneous_clients_score_with_the_alternative_model(world):
    toy = Toy(world, [Arm("h", Rule("ls"), hetero=True)], Setting(clients=4), np.random.default_rng(10))
    assert np.allclose(toy.help[:2], world.help[0]) and np.allclose(toy.help[2:4], world.help_alt[0])


def test_bad_arms():
    with pytest.raises(ValueError, match="split must be iid or dirichlet"):
        Arm("x", Rule("ls"), split="label")
    with pytest.raises(ValueError, match="FMOL is a synthetic-problem reference"):
        Arm("x", Rule("fmol"))


def test_sizes_whose_responses_cannot_be_enumerated_are_refused():
    with pytest.raises(ValueError, match="vocab \\*\\* length = 12 \\*\\* 5 responses"):
        ToySizes(length=5)
