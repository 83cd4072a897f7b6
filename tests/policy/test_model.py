import numpy as np
import pytest
import torch

from collabalign.comm import Message
from collabalign.federation.aggregation import weighted_average
from collabalign.policy import Rollout

PROMPTS = ["Hi", "Write one long sentence about the sea and its many moods.", "Why?"]
RESPONSES = ["Hello there, friend.", "Waves.", "Because the sky is blue and the grass is green."]


def randomise_adapters(policy, seed: int = 0, scale: float = 0.3) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.adapter_params():
            p.copy_(torch.randn(p.shape, generator=gen) * scale)


def plain_logprobs(policy, rollout: Rollout, row: int) -> torch.Tensor:
    """log_softmax of an unpadded forward of one row, gathered at its response tokens."""
    ids = rollout.input_ids[row][rollout.attention_mask[row].bool()][None]
    n = int(rollout.mask[row].sum())
    logits = policy.model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].log_softmax(-1)
    return logits[-n - 1:-1].gather(-1, ids[0, -n:, None]).squeeze(-1)


def test_encode_uses_the_chat_template_and_pads_left(make_policy):
    policy = make_policy()
    ids, mask = policy.encode(PROMPTS)
    text = policy.tokenizer.decode(ids[1][mask[1].bool()])
    assert "<|im_start|>user\n" + PROMPTS[1] in text and text.endswith("<|im_start|>assistant\n")
    assert mask[:, -1].all() and not mask[0, 0] and (ids[0][~mask[0].bool()] == policy.pad_id).all()
    raw, raw_mask = policy.encode(PROMPTS, chat=False)
    assert policy.tokenizer.decode(raw[2][raw_mask[2].bool()]) == "Why?"


def test_a_prompt_over_the_limit_is_an_error_naming_its_index(make_policy):
    policy = make_policy()
    with pytest.raises(ValueError, match=r"prompt 1 is \d+ tokens long, over max_prompt_tokens=8"):
        policy.encode(["Hi", "one two three four five six seven eight nine ten"], chat=False, max_prompt_tokens=8)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_logprobs_of_a_left_padded_batch_equal_plain_per_row_forwards(make_policy, make_gpt2_policy, arch):
    policy = make_policy() if arch == "llama" else make_gpt2_policy()
    randomise_adapters(policy, scale=0.3 if arch == "llama" else 0.05)
    rollouts = [policy.rollout(PROMPTS, RESPONSES),
                policy.generate(PROMPTS, 6, generator=torch.Generator().manual_seed(0))]
    for rollout in rollouts:
        logprobs = policy.token_logprobs(rollout)
        assert (logprobs[~rollout.mask] == 0).all()
        for row in range(len(PROMPTS)):
            n = int(rollout.mask[row].sum())
            torch.testing.assert_close(logprobs[row, :n], plain_logprobs(policy, rollout, row), atol=1e-5, rtol=0)



def test_value_heads_read_the_detached_hidden_state(make_policy):
    policy = make_policy(objectives=2)
    randomise_adapters(policy)
    rollout = policy.rollout(PROMPTS, RESPONSES)
    logprobs, values = policy(rollout)
    assert values.shape == (3, rollout.mask.shape[1], 2) and (values == 0).all()  # zero-initialised heads
    torch.testing.assert_close(logprobs, policy.token_logprobs(rollout))
    values.sum().backward()
    assert all(p.grad is None for p in policy.adapter_params())  # no critic gradient reaches the adapters
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.value_params())


def test_kl_is_zero_at_init_and_with_adapters_off_and_not_after_training(make_policy):
    policy = make_policy()
    rollout = policy.rollout(PROMPTS, RESPONSES)
    per_token, per_seq = policy.kl(rollout)
    assert per_token.shape == rollout.mask.shape and (per_seq == 0).all()  # LoRA B = 0 at init
    randomise_adapters(policy)
    per_token, per_seq = policy.kl(rollout)
    assert (per_seq.abs() > 1e-3).all() and (per_token[~rollout.mask] == 0).all()
    with policy.reference():
        assert (policy.kl(rollout)[1] == 0).all()


def test_reference_switches_adapters_off_and_restores_them_even_after_an_error(make_policy):
    policy = make_policy()
    randomise_adapters(policy)
    rollout = policy.rollout(PROMPTS[:1], RESPONSES[:1])
    with torch.no_grad():
        before = policy.token_logprobs(rollout)
        with policy.reference():
            assert not any(layer.enabled for layer in policy.layers)
            ref = policy.token_logprobs(rollout)
        with pytest.raises(RuntimeError), policy.reference():
            raise RuntimeError("boom")
        assert all(layer.enabled for layer in policy.layers)
        torch.testing.assert_close(policy.token_logprobs(rollout), before)
        torch.testing.assert_close(policy.token_logprobs(rollout, reference=True), ref)
    assert not torch.equal(before, ref)


def test_adapter_state_round_trips_and_averages_with_fedavg(make_policy):
    policy = make_policy()
    assert [p.shape for p in policy.adapter_params()] == [v.shape for v in policy.adapter_state().values()]
    randomise_adapters(policy, seed=1)
    a = policy.adapter_state()
    randomise_adapters(policy, seed=2)
    b = policy.adapter_state()
    assert all(v.dtype == np.float32 for v in a.values())
    policy.load_adapter_state(weighted_average([Message(a), Message(b)], np.array([1.0, 1.0])))
    for name, value in policy.adapter_state().items():
        np.testing.assert_allclose(value, (a[name] + b[name]) / 2, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="missing"):
        policy.load_adapter_state({k: v for k, v in a.items() if not k.endswith(".A")})
    policy.reset_adapters(torch.Generator().manual_seed(0))
    assert all((policy.adapter_state()[n] == 0).all() for n in a if n.endswith(".B"))
