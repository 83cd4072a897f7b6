"""The meta-learned reward model on an LM-head policy (methods/meta_reward/text.py) and its LM baselines, on a tiny
float64 Llama: the hypergradient through D real inner steps equals finite differences, Algorithm 1 lowers the outer
loss, A_PL counts length-normalised wins, every baseline moves the policy the way its objective says, and bad
settings are one-line errors."""

import copy

import numpy as np
import pytest
import torch

from collabalign.methods.meta_reward import baselines
from collabalign.methods.meta_reward.bilevel import finite_difference, hypergradient
from collabalign.methods.meta_reward.text import (
    Domain,
    MetaConfig,
    Pairs,
    TextTask,
    linear_reward,
    meta_train,
    pl_objective,
    preference_accuracy,
    rwr_objective,
    zero_linear,
)
from collabalign.models.backbones import Backbone, tiny_llama
from collabalign.models.text_reward import check_readable
from collabalign.policy import Policy
from collabalign.policy.head import HeadAdapter, cache_responses

GOOD = ["what a lovely and useful thing", "great value, works well", "I love it, five stars", "superb, buy it"]
BAD = ["broke after a day, awful", "terrible waste of money", "I hate it, one star", "junk, do not buy"]


@pytest.fixture(scope="module")
def task():
    base = tiny_llama(seed=1)
    model = copy.deepcopy(base.model).double()
    with torch.no_grad():
        model.model.norm.weight.mul_(4.0)
    policy = Policy(Backbone(model, base.tokenizer, True), targets=("lm_head",), rank=4, alpha=8.0, dropout=0.0,
                    generator=torch.Generator().manual_seed(0))
    prompts = ["Review:"] * 8
    cache = cache_responses(policy, prompts, GOOD + BAD, batch_size=3)
    features = torch.tensor([[1.0, 0.2]] * 4 + [[-1.0, 0.1]] * 4, dtype=torch.float64)
    features += torch.randn(8, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 0.1
    pairs = Pairs(torch.arange(4), torch.arange(4, 8))
    rows = torch.arange(8)
    return TextTask(HeadAdapter(policy, cache), features,
                    {"a": Domain("a", rows, pairs, pairs, pairs), "b": Domain("b", rows, pairs, pairs, pairs)})


def test_the_hypergradient_through_inner_steps_on_the_lm_head_equals_finite_differences(task):
    theta0 = [t + 0.05 * torch.randn(t.shape, generator=torch.Generator().manual_seed(1), dtype=t.dtype)
              for t in task.head.params()]
    objective = rwr_objective(task, linear_reward(task), beta=0.5, weight_decay=0.01)
    outer = pl_objective(task)
    batches = [torch.tensor([0, 5, 2]), torch.tensor([1, 7, 4, 3]), torch.tensor([6, 2])]
    phi = [torch.tensor([0.3, -0.2], dtype=torch.float64), torch.tensor(0.1, dtype=torch.float64)]
    pairs = Pairs(torch.tensor([0, 1, 3]), torch.tensor([4, 6, 7]))
    exact = hypergradient(objective, outer, theta0, phi, batches, pairs, alpha=0.02)
    numeric = finite_difference(objective, outer, theta0, phi, batches, pairs, alpha=0.02, eps=1e-6)
    got, want = torch.cat([g.reshape(-1) for g in exact.grad]), torch.cat([g.reshape(-1) for g in numeric])
    assert want.abs().max() > 1e-4  # the reward really moves the outer loss through the inner steps
    assert (got - want).abs().max() <= 1e-6 * want.abs().max()
    first = hypergradient(objective, outer, theta0, phi, batches, pairs, alpha=0.02, first_order=True)
    assert not torch.allclose(torch.cat([g.reshape(-1) for g in first.grad]), got)


def test_meta_training_lowers_the_outer_loss_and_keeps_the_best_validated_reward(task):
    cfg = MetaConfig(beta=1.0, alpha=0.02, inner_steps=3, outer_steps=12, inner_batch=4, outer_batch=4,
                     outer_lr=0.1, clip=1.0, select_every=3)
    result = meta_train(task, task.head.params(), ["a", "b"], cfg, torch.Generator().manual_seed(0))
    loss = result.log["loss"]
    assert np.mean(loss[-3:]) < np.mean(loss[:3])
    assert result.log["validation_step"] == [0, 3, 6, 9, 12]
    assert result.step in result.log["validation_step"]
    assert float(result.phi[0][0]) > 0  # the preferred responses' feature gets the larger reward
    again = meta_train(task, task.head.params(), ["a", "b"], cfg, torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(result.phi, again.phi, strict=True))


def test_preference_accuracy_compares_length_normalised_log_probs(task):
    theta = task.head.params()
    pairs = Pairs(torch.tensor([0, 4]), torch.tensor([4, 0]))
    with torch.no_grad():
        per_token = task.head.logprobs(theta, torch.tensor([0, 4])) / task.cache.lengths[[0, 4]]
    assert preference_accuracy(task, theta, pairs) == 0.5 and per_token[0] != per_token[1]
    first = Pairs(torch.tensor([0]), torch.tensor([4]))
    assert preference_accuracy(task, theta, first) == float(per_token[0] > per_token[1])


def test_each_baseline_moves_the_policy_the_way_its_objective_says(task):
    gen = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    theta0, pairs, rows = task.head.params(), task.domains["a"].train, torch.arange(8)
    nll = lambda th: float(-task.head.logprobs(th, rows).mean())  # noqa: E731
    sft = baselines.sft(task, theta0, rows, 20, 0.005, 4, gen())
    assert nll(sft) < nll(theta0)
    outer = pl_objective(task)
    hpl = baselines.hpl(task, sft, pairs, 20, 0.005, 4, gen())
    assert float(outer(hpl, pairs)) < float(outer(sft, pairs))
    dpo = baselines.dpo(task, sft, pairs, 0.5, 20, 0.005, 4, gen())
    assert preference_accuracy(task, dpo, pairs) >= preference_accuracy(task, sft, pairs)
    assert float(outer(dpo, pairs)) < float(outer(sft, pairs))
    _, table = baselines.bt_rewards(task, pairs)
    assert (table[:4] > table[4:].max()).all()  # the BT model ranks every preferred response above the others
    rwr = baselines.bt_rwr(task, sft, table, rows, 1.0, 0.005, 20, 4, gen(), weight_norm="batch")
    good, bad = torch.arange(4), torch.arange(4, 8)
    gain = lambda th: float(task.head.logprobs(th, good).mean() -  # noqa: E731
                            task.head.logprobs(th, bad).mean())
    assert gain(rwr) > gain(sft)
    judge = np.r_[np.full(4, 0.9), np.full(4, 0.1)]
    assert gain(baselines.oracle(task, sft, judge, rows, 1.0, 0.005, 20, 4, gen(), "batch")) > gain(sft)


def test_bad_settings_are_one_line_errors(task):
    with pytest.raises(ValueError, match="β must be > 0"):
        MetaConfig(beta=0.0, alpha=0.1, inner_steps=2, outer_steps=1, inner_batch=2, outer_batch=2, outer_lr=0.1,
                   clip=1.0)
    with pytest.raises(ValueError, match="D .* >= 1"):
        MetaConfig(beta=1.0, alpha=0.1, inner_steps=0, outer_steps=1, inner_batch=2, outer_batch=2, outer_lr=0.1,
                   clip=1.0)
    with pytest.raises(ValueError, match="DPO β"):
        baselines.dpo(task, task.head.params(), task.domains["a"].train, 0.0, 1, 0.1, 2, torch.Generator())
    with pytest.raises(ValueError, match="β must be > 0"):
        rwr_objective(task, linear_reward(task), beta=-1.0)(task.head.params(), zero_linear(task), torch.arange(2))


def test_a_reward_model_that_cannot_read_the_policys_text_is_refused():
    from transformers import BertTokenizerFast

    from collabalign.models.backbones import minilm_l6

    tokenizer = minilm_l6().tokenizer
    check_readable(tokenizer, GOOD + BAD)  # English reviews: readable
    assert isinstance(tokenizer, BertTokenizerFast)
    with pytest.raises(ValueError, match="cannot read the policy's text"):
        check_readable(tokenizer, ["ᚠᚢᚦᚨᚱᚲ ᚷᚹᚺᚾ", "ᛁᛃᛇᛈ ᛉᛊᛏ"], "minilm")
