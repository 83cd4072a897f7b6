"""The LM-head-only fast paths: cached trunk states give the same log-probs and values as full forwards, the
functional `HeadAdapter` matches the policy (with its base logits stored or computed per pass), and `set_reference`
makes another adapter state the reference."""

import pytest
import torch

from collabalign.policy.head import HeadAdapter, cache_responses
from tests.policy.test_model import randomise_adapters

PROMPTS = ["Continue this book review:", "Say something kind.", "Hi"]
RESPONSES = ["It was a wonderful read from start to end", "You are great", "Hello there, friend of mine"]


def test_head_adapter_log_probs_equal_the_policy_on_cached_trunk_states(make_policy):
    policy = make_policy(gain=4.0, targets=("lm_head",))
    cache = cache_responses(policy, PROMPTS, RESPONSES, batch_size=2)
    rows = torch.arange(3)
    with torch.no_grad():
        reference = policy.token_logprobs(policy.rollout(PROMPTS, RESPONSES)).sum(1)
    initial = policy.adapter_state()
    for full_vocab, stored in ((False, True), (True, True), (False, False)):
        policy.load_adapter_state(initial)
        head = HeadAdapter(policy, cache, full_vocab=full_vocab, base_logits_bytes=2**30 if stored else 0)
        assert (head.base is not None) == stored
        assert (len(head.vocab) == policy.model.config.vocab_size) == full_vocab
        torch.testing.assert_close(head.logprobs(head.params(), rows), reference, rtol=1e-5, atol=1e-5)
        gen = torch.Generator().manual_seed(1)
        theta = [torch.randn(t.shape, generator=gen) * 0.3 for t in head.params()]
        head.load(theta)
        full = policy.token_logprobs(policy.rollout(PROMPTS, RESPONSES)).sum(1)
        torch.testing.assert_close(head.logprobs(theta, rows), full, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(full, reference)
        assert all(torch.equal(a, b) for a, b in zip(head.params(), theta, strict=True))
    assert cache.lengths.tolist() == policy.rollout(PROMPTS, RESPONSES).mask.sum(1).tolist()


def test_stored_base_logits_give_the_same_log_probs_and_gradients_as_computing_them(make_policy):
    policy = make_policy(gain=4.0, targets=("lm_head",))
    cache = cache_responses(policy, PROMPTS, RESPONSES, batch_size=2)
    stored, computed = (HeadAdapter(policy, cache, base_logits_bytes=b) for b in (2**30, 0))
    rows = torch.tensor([2, 0, 2])  # a row twice, rows of different lengths
    theta = [torch.randn(t.shape, generator=torch.Generator().manual_seed(3)).requires_grad_(True)
             for t in stored.params()]
    a, b = stored.token_logprobs(theta, rows), computed.token_logprobs(theta, rows)
    torch.testing.assert_close(a, b)
    assert a.shape == (3, int(cache.lengths.max())) and (a[1, int(cache.lengths[0]):] == 0).all()
    for ga, gb in zip(torch.autograd.grad(a.sum(), theta), torch.autograd.grad(b.sum(), theta), strict=True):
        torch.testing.assert_close(ga, gb)


def test_a_cache_whose_mask_is_not_a_prefix_is_refused(make_policy):
    policy = make_policy(targets=("lm_head",))
    cache = cache_responses(policy, PROMPTS, RESPONSES)
    cache.mask[0, 0] = False
    with pytest.raises(ValueError, match="first tokens"):
        HeadAdapter(policy, cache)


def test_only_vocab_keeps_the_adapter_inside_the_cached_vocabulary(make_policy):
    policy = make_policy(targets=("lm_head",))  # gain 1: every token keeps some probability, so every row has a grad
    head = HeadAdapter(policy, cache_responses(policy, PROMPTS, RESPONSES))
    head.load([torch.randn(t.shape, generator=torch.Generator().manual_seed(2)) for t in head.params()])
    opt = torch.optim.Adam(policy.adapter_params(), lr=0.1)
    with head.only_vocab():
        rollout = policy.generate(PROMPTS, 4, generator=torch.Generator().manual_seed(0))
        policy.token_logprobs(rollout).sum().backward()
        opt.step()
    assert not policy.layers[0].B[head.others].any()
    head.params()  # still inside V
    policy.token_logprobs(rollout).sum().backward()
    opt.step()
    with pytest.raises(ValueError, match="outside the cached vocabulary"):
        head.params()


def test_a_rollout_with_trunk_states_gives_the_same_log_probs_values_and_reference(make_policy):
    policy = make_policy(gain=4.0, targets=("lm_head",))
    randomise_adapters(policy)
    with torch.no_grad():
        policy.value_head.weight.normal_()
    rollout = policy.rollout(PROMPTS, RESPONSES)
    fast = policy.with_trunk(rollout)
    for a, b in zip(policy(fast), policy(rollout), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    rows = torch.tensor([2, 0])
    torch.testing.assert_close(policy.token_logprobs(fast.select(rows), reference=True),
                               policy.token_logprobs(rollout.select(rows), reference=True), rtol=1e-5, atol=1e-5)


def test_head_paths_refuse_a_policy_adapted_beyond_its_head(make_policy):
    policy = make_policy(targets=("q_proj", "lm_head"))
    with pytest.raises(ValueError, match="LM head"):
        HeadAdapter(policy, None)
    with pytest.raises(ValueError, match="LM head"):
        policy.with_trunk(policy.rollout(PROMPTS, RESPONSES))


def test_set_reference_makes_an_adapter_state_the_reference_and_none_restores_the_base(make_policy):
    policy = make_policy(gain=4.0)
    rollout = policy.rollout(PROMPTS, RESPONSES)
    base = policy.token_logprobs(rollout, reference=True)
    randomise_adapters(policy, seed=1)
    sft = policy.adapter_state()
    sft_logprobs = policy.token_logprobs(rollout).detach()
    randomise_adapters(policy, seed=2)
    current = policy.token_logprobs(rollout).detach()
    policy.set_reference(sft)
    torch.testing.assert_close(policy.token_logprobs(rollout, reference=True), sft_logprobs)
    torch.testing.assert_close(policy.token_logprobs(rollout), current)  # restored after the block
    assert not torch.allclose(sft_logprobs, current)
    policy.set_reference(None)
    torch.testing.assert_close(policy.token_logprobs(rollout, reference=True), base)


def test_a_rows_log_prob_does_not_depend_on_the_other_rows_it_is_scored_with(make_policy):
    policy = make_policy(gain=4.0, targets=("lm_head",))
    words = "the quick brown fox jumps over a lazy dog while it rains and the sun sets".split()
    responses = [" ".join(words[j % len(words)] for j in range(n)) for n in (37, 90, 13)]
    head = HeadAdapter(policy, cache_responses(policy, PROMPTS, responses))
    theta = [torch.randn(t.shape, generator=torch.Generator().manual_seed(4)) for t in head.params()]
    together = head.logprobs(theta, torch.arange(3))
    alone = torch.cat([head.logprobs(theta, torch.tensor([i])) for i in range(3)])
    assert torch.equal(together, alone)  # exactly: a long list of rows can be scored in chunks
