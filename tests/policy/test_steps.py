import pytest
import torch

from collabalign.policy import dpo_loss, dpo_step, rloo_advantages, rloo_step, rwr_weights, weighted_mle_step
from tests.policy.bandit import PROMPTS, mean_reward, token_set_reward

CHOSEN = ["Sure, here is a kind answer.", "Yes.", "The capital is Paris.", "I can help with that."]
REJECTED = ["No.", "Go away, I will not.", "The capital is Rome.", "Figure it out yourself."]


def test_dpo_loss_is_log2_at_a_zero_margin_and_falls_as_the_margin_grows():
    zero = torch.zeros(2)
    losses, margin = dpo_loss(zero, zero, zero, zero, beta=0.1)
    torch.testing.assert_close(losses, torch.full((2,), 0.6931), atol=1e-4, rtol=0)
    pi_c, pi_r, ref_c, ref_r = (torch.tensor([x]) for x in (-1.0, -5.0, -2.0, -3.0))
    losses, margin = dpo_loss(pi_c, pi_r, ref_c, ref_r, 0.5)
    assert float(margin) == pytest.approx(0.5 * (1.0 - (-2.0))) and float(losses) < 0.6931


def test_dpo_raises_the_chosen_minus_rejected_margin(make_policy):
    policy = make_policy(gain=10.0)
    opt = torch.optim.Adam(policy.adapter_params(), lr=1e-2)
    stats = [dpo_step(policy, opt, PROMPTS, CHOSEN, REJECTED, beta=0.1) for _ in range(8)]
    assert stats[0]["margin"] == 0.0  # the policy starts equal to its reference (LoRA B = 0)
    assert stats[-1]["margin"] > 0.5 and stats[-1]["accuracy"] == 1.0 and stats[-1]["loss"] < stats[0]["loss"]


def test_rloo_advantages_leave_one_out():
    adv = rloo_advantages(torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0, 6.0]), k=3)
    torch.testing.assert_close(adv, torch.tensor([1 - 2.5, 2 - 2.0, 3 - 1.5, 0 - 3.0, 0 - 3.0, 6 - 0.0]))


def test_rloo_raises_a_reward_and_needs_rows_grouped_by_prompt(make_policy):
    policy = make_policy(gain=10.0)
    reward = token_set_reward(policy)
    opt = torch.optim.Adam(policy.adapter_params(), lr=3e-3)
    gen = torch.Generator().manual_seed(1)
    grouped = [p for p in PROMPTS for _ in range(8)]
    start = mean_reward(policy, reward)
    for _ in range(15):
        rollout = policy.generate(grouped, 4, generator=gen, chat=False)
        stats = rloo_step(policy, opt, rollout, reward(rollout), k=8, kl_coef=0.01)
    assert mean_reward(policy, reward) > start + 0.2 and stats["kl"] > 0
    with pytest.raises(ValueError, match="grouped by prompt"):
        rloo_step(policy, opt, policy.generate(PROMPTS * 2, 2, generator=gen), torch.zeros(8), k=2)


def test_rwr_weights_are_a_softmax_of_rewards():
    w = rwr_weights(torch.tensor([1.0, 0.0, 2.0]), temperature=0.5)
    assert float(w.sum()) == pytest.approx(1.0) and w[2] > w[0] > w[1]
    with pytest.raises(ValueError, match="temperature"):
        rwr_weights(torch.zeros(3), 0.0)


def test_weighted_mle_raises_the_logprob_of_the_weighted_responses(make_policy):
    policy = make_policy(gain=10.0)
    rollout = policy.rollout(PROMPTS, CHOSEN)
    opt = torch.optim.Adam(policy.adapter_params(), lr=1e-2)
    weights = rwr_weights(torch.tensor([1.0, 0.0, 0.0, 0.0]), temperature=0.05)
    with torch.no_grad():
        before = policy.token_logprobs(rollout).sum(1) / rollout.mask.sum(1)
    for _ in range(8):
        stats = weighted_mle_step(policy, opt, rollout, weights)
    with torch.no_grad():
        gain = policy.token_logprobs(rollout).sum(1) / rollout.mask.sum(1) - before
    assert gain[0] > 2.0 and gain[0] > gain[1:].max() + 1.0 and stats["logprob"] > float(before.mean())
