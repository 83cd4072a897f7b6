import pytest
import torch

from tests.policy.bandit import PROMPTS


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_generation_is_deterministic_under_a_seed_and_differs_for_another(make_policy):
    policy = make_policy()
    a = policy.generate(PROMPTS, 5, generator=seeded(0))
    b = policy.generate(PROMPTS, 5, generator=seeded(0))
    c = policy.generate(PROMPTS, 5, generator=seeded(1))
    assert torch.equal(a.input_ids, b.input_ids) and a.responses == b.responses
    assert not torch.equal(a.input_ids, c.input_ids)
    assert a.input_ids.shape == (4, a.prompt_len + 5) and a.mask.all()  # nothing stopped: exactly max_new_tokens
    assert (a.attention_mask[:, a.prompt_len:] == 1).all()


def test_rows_stop_at_eos_and_are_padded_after(make_policy):
    policy = make_policy()
    with torch.no_grad():  # a huge EOS embedding (tied to the output) makes EOS likely wherever its logit is positive
        embedding = policy.model.get_input_embeddings().weight
        embedding[policy.eos_id] = 100 * embedding[1000]
    policy.pad_id = 0  # a pad token other than EOS (SmolLM2 pads with EOS), so padding after EOS shows
    rollout = policy.generate(PROMPTS * 4, 8, generator=seeded(0), chat=False)
    response, mask = rollout.input_ids[:, rollout.prompt_len:], rollout.mask
    lengths = mask.sum(1)
    assert rollout.prompt_len + 8 >= rollout.input_ids.shape[1]
    assert (lengths < mask.shape[1]).any() and (lengths > 1).any()
    for row in range(len(rollout)):
        n = int(lengths[row])
        assert mask[row, :n].all() and not mask[row, n:].any()
        assert (response[row, n:] == policy.pad_id).all()
        assert not rollout.attention_mask[row, rollout.prompt_len + n:].any()
        if n < mask.shape[1]:  # stopped early: the last response token is EOS
            assert response[row, n - 1] == policy.eos_id
        assert (response[row, :n - 1] != policy.eos_id).all()
        assert policy.tokenizer.eos_token not in rollout.responses[row]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_tiny_top_p_is_greedy_and_greedy_is_the_argmax_of_a_forward(make_policy, make_gpt2_policy, arch):
    policy = make_policy(gain=4.0) if arch == "llama" else make_gpt2_policy()
    greedy = policy.generate(PROMPTS, 6, generator=seeded(0), temperature=0)
    nucleus = policy.generate(PROMPTS, 6, generator=seeded(1), top_p=1e-6)
    sampled = policy.generate(PROMPTS, 6, generator=seeded(1))
    assert torch.equal(greedy.input_ids, nucleus.input_ids) and not torch.equal(greedy.input_ids, sampled.input_ids)
    with torch.no_grad():
        mask = greedy.attention_mask
        logits = policy.model(input_ids=greedy.input_ids, attention_mask=mask,
                              position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    assert torch.equal(logits[:, greedy.prompt_len - 1:-1].argmax(-1), greedy.input_ids[:, greedy.prompt_len:])


def test_nucleus_sampling_only_draws_from_the_top_p_mass(make_policy):
    policy = make_policy(gain=10.0)
    rollout = policy.generate(["Hello!"] * 64, 1, generator=seeded(2), top_p=0.5, chat=False)
    with torch.no_grad():
        probs = policy.model(input_ids=policy.encode(["Hello!"], chat=False)[0]).logits[0, -1].softmax(-1)
    sorted_p, order = probs.sort(descending=True)
    allowed = order[: int((sorted_p.cumsum(0) < 0.5).sum()) + 1]
    drawn = rollout.input_ids[:, -1].unique()
    assert torch.isin(drawn, allowed).all() and len(drawn) > 1


def test_bad_sampling_arguments_are_errors(make_policy):
    policy = make_policy()
    for kwargs in ({"top_p": 0.0}, {"temperature": -1.0}):
        with pytest.raises(ValueError, match="top_p"):
            policy.generate(PROMPTS, 2, generator=seeded(0), **kwargs)


def test_per_row_temperatures_sample_each_row_as_its_own_temperature_would(make_policy):
    """A batch of two temperatures gives row by row the tokens of the same rows sampled at a scalar temperature with
    the same generator state (sampling draws one uniform per row per step, so the streams line up)."""
    policy = make_policy(gain=4.0)
    prompts = ["Hi", "Tell me a story", "Hi", "Tell me a story"]
    mixed = policy.generate(prompts, 6, generator=torch.Generator().manual_seed(3),
                            temperature=torch.tensor([0.5, 0.5, 0.5, 0.5]))
    scalar = policy.generate(prompts, 6, generator=torch.Generator().manual_seed(3), temperature=0.5)
    assert mixed.responses == scalar.responses
    low = policy.generate(prompts, 6, generator=torch.Generator().manual_seed(3),
                          temperature=torch.tensor([1e-3, 1e-3, 5.0, 5.0]))
    greedy = policy.generate(prompts[:2], 6, generator=torch.Generator().manual_seed(3), temperature=0.0)
    assert low.responses[:2] == greedy.responses
    with pytest.raises(ValueError, match="temperature"):
        policy.generate(prompts, 6, generator=torch.Generator(), temperature=torch.tensor([1.0, 0.0, 1.0, 1.0]))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_repeated_prompt_is_read_once_and_each_of_its_rows_continues_its_own_prompt(make_policy, make_gpt2_policy,
                                                                                      arch):
    """Rows of a repeated prompt share one read of it (its cache copied to each row): greedy rows equal a full forward's
    argmax over the generated text, and sampled rows of one prompt still differ from each other."""
    policy = make_policy(gain=4.0) if arch == "llama" else make_gpt2_policy()
    prompts = ["Hi", "Tell me a story", "Hi", "Hi", "Tell me a story"]
    rows_read = []
    hook = policy.model.register_forward_pre_hook(lambda _, args, kwargs: rows_read.append(len(kwargs["input_ids"])),
                                                  with_kwargs=True)
    greedy = policy.generate(prompts, 6, generator=seeded(0), temperature=0)
    hook.remove()
    assert rows_read == [2] + [5] * 5  # the prompts once each, then every row a token at a time
    alone = policy.generate(["Tell me a story", "Hi"], 6, generator=seeded(0), temperature=0)
    assert greedy.responses == [alone.responses[i] for i in (1, 0, 1, 1, 0)]
    with torch.no_grad():
        mask = greedy.attention_mask
        logits = policy.model(input_ids=greedy.input_ids, attention_mask=mask,
                              position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    assert torch.equal(logits[:, greedy.prompt_len - 1:-1].argmax(-1), greedy.input_ids[:, greedy.prompt_len:])
    sampled = policy.generate(prompts, 6, generator=seeded(1), temperature=2.0)
    assert len({sampled.responses[i] for i in (0, 2, 3)}) > 1
