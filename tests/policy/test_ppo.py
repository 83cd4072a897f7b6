import numpy as np
import pytest
import torch

from collabalign.policy import AdaptiveKL, PPOConfig, objective_gradients, optimizers, ppo_losses, ppo_update
from collabalign.policy import prepare as prepare_batch
from collabalign.policy.ppo import gae, whiten
from tests.policy.bandit import PROMPTS, mean_reward, token_set_reward


def test_ppo_raises_the_reward_of_a_token_set_bandit(make_policy):
    policy = make_policy(gain=10.0)
    reward = token_set_reward(policy)
    cfg = PPOConfig(actor_lr=3e-3, critic_lr=1e-2, minibatch=16, kl_init=0.0)
    actor, critic = optimizers(policy, cfg)
    gen = torch.Generator().manual_seed(1)
    start = mean_reward(policy, reward)
    for _ in range(15):
        rollout = policy.generate(PROMPTS * 8, 4, generator=gen, chat=False)
        batch = prepare_batch(policy, rollout, reward(rollout)[:, None], cfg.kl_init, cfg)
        stats = ppo_update(policy, actor, critic, batch, cfg, gen)
    assert 0.35 < start < 0.6
    assert mean_reward(policy, reward) > start + 0.25
    assert len(stats["lambdas"]) == 2 and np.allclose(stats["lambdas"], 1.0) and stats["kl"] > 0


def bandit_batch(policy, cfg, objectives: int):
    """One rollout with rewards (B, objectives): the token-set reward first, then a second, different one."""
    reward = token_set_reward(policy)
    rollout = policy.generate(PROMPTS * 4, 4, generator=torch.Generator().manual_seed(3), chat=False)
    first = reward(rollout)
    rewards = torch.stack([first, 1 - first + 0.1 * rollout.mask.sum(1)], 1)[:, :objectives]
    return prepare_batch(policy, rollout, rewards, 0.1, cfg)


def test_objective_gradients_are_the_separate_per_objective_gradients(make_policy):
    policy = make_policy(gain=10.0, objectives=2)
    cfg = PPOConfig()
    with torch.no_grad():
        for p in policy.adapter_params():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(0)))
    batch = bandit_batch(policy, cfg, 2)
    rows = torch.arange(8)
    params = policy.adapter_params()
    grads = objective_gradients(ppo_losses(policy, batch, rows, cfg)[0], params)
    assert grads.shape == (sum(p.numel() for p in params), 2) and grads.dtype == torch.float32
    for j in range(2):
        separate = torch.autograd.grad(ppo_losses(policy, batch, rows, cfg)[0][j], params)
        torch.testing.assert_close(grads[:, j], torch.cat([g.reshape(-1) for g in separate]))
    assert torch.nn.functional.cosine_similarity(grads[:, 0], grads[:, 1], 0) < 0.9


def train_once(make_policy, objectives: int, weights) -> list[torch.Tensor]:
    policy = make_policy(gain=10.0, objectives=objectives)
    cfg = PPOConfig(actor_lr=1e-2, minibatch=8, epochs=3, max_grad_norm=1.0)
    actor, critic = optimizers(policy, cfg)
    batch = bandit_batch(policy, cfg, objectives)
    stats = ppo_update(policy, actor, critic, batch, cfg, torch.Generator().manual_seed(7), weights)
    assert len(stats["lambdas"]) == 6
    return [p.detach().clone() for p in policy.adapter_params()]


def test_fixed_weights_one_zero_equal_single_objective_ppo_and_so_does_a_callable(make_policy):
    single = train_once(make_policy, 1, None)
    fixed = train_once(make_policy, 2, torch.tensor([1.0, 0.0]))
    seen = []

    def rule(grads: torch.Tensor) -> torch.Tensor:
        seen.append(grads.shape)
        return torch.tensor([1.0, 0.0])

    called = train_once(make_policy, 2, rule)
    other = train_once(make_policy, 2, torch.tensor([0.5, 0.5]))
    for a, b, c in zip(single, fixed, called, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-7)
        torch.testing.assert_close(c, a, rtol=1e-5, atol=1e-6)
    assert len(seen) == 6 and seen[0][1] == 2
    assert any(not torch.allclose(a, o) for a, o in zip(single, other, strict=True))


def test_gae_and_sequence_advantages_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.0, 0.0]])[..., None]  # second row: one token
    values = torch.tensor([[0.2, 0.4, 0.6], [0.3, 0.0, 0.0]])[..., None]
    adv = gae(rewards, values, gamma=1.0, lam=0.5)[..., 0]
    d = [0.0 + 0.4 - 0.2, 0.0 + 0.6 - 0.4, 1.0 - 0.6]
    torch.testing.assert_close(adv[0], torch.tensor([d[0] + 0.5 * d[1] + 0.25 * d[2], d[1] + 0.5 * d[2], d[2]]))
    torch.testing.assert_close(adv[1], torch.tensor([0.2, 0.0, 0.0]))
    mask = torch.tensor([[True, True, True], [True, False, False]])
    w = whiten(adv[..., None], mask)[..., 0]
    assert abs(float(w[mask].mean())) < 1e-6 and abs(float(w[mask].std()) - 1) < 1e-4 and (w[~mask] == 0).all()


def test_prepare_puts_the_score_on_the_last_token_and_the_kl_on_every_token(make_policy):
    policy = make_policy(objectives=2)
    with torch.no_grad():
        for p in policy.adapter_params():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(0)))
    rollout = policy.rollout(["a", "b"], ["one two three", "four"])
    rewards = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    for mode in ("gae", "sequence"):
        cfg = PPOConfig(whiten=False, lam=1.0, advantage=mode)
        batch = prepare_batch(policy, rollout, rewards, 0.5, cfg)
        kl = batch.old_logprobs - batch.ref_logprobs
        total = rewards - 0.5 * kl.sum(1, keepdim=True)  # undiscounted return of every objective from the start
        torch.testing.assert_close(batch.returns[:, 0], total)
        torch.testing.assert_close(batch.kl, kl.sum(1))
        if mode == "sequence":
            assert (batch.advantages == batch.advantages[:, :1] * rollout.mask[..., None]).all()
    with pytest.raises(ValueError, match=r"rewards must be \(B, M\)"):
        prepare_batch(policy, rollout, torch.ones(2), 0.5, PPOConfig())


def test_adaptive_kl_follows_its_target_and_saves_as_a_float():
    cfg = PPOConfig(kl_init=0.2, kl_target=0.03, kl_horizon=1000)
    kl = AdaptiveKL.from_state({}, cfg)
    assert kl.value == 0.2
    assert kl.update(1.0, 100) == pytest.approx(0.2 * (1 + 0.2 * 0.1))  # error clipped at +0.2
    assert kl.update(0.0, 100) == pytest.approx(0.2 * 1.02 * 0.98)
    restored = AdaptiveKL.from_state(kl.state(), cfg)
    assert restored.value == kl.value
    assert restored.update(0.03, 500) == restored.value == kl.value  # on target: unchanged
