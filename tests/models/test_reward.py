import copy

import pytest
import torch

from collabalign.lora import inject_lora, lora_layers
from collabalign.models.backbones import minilm_l6, tiny_llama
from collabalign.models.pooled import layer_stack, tokenize, top_block_targets
from collabalign.models.reward import RewardModel, bt_loss, preference_accuracy

TEXTS = ["Human: how do I bake bread? Assistant: Mix flour, water and yeast, then bake it.", "No.",
         "Human: tell me a joke Assistant: Why did the chicken cross the road?"]


def reward_model(backbone, n_blocks, targets, seed=0):
    model = RewardModel(backbone.model, backbone.causal, torch.Generator().manual_seed(seed))
    inject_lora(model.backbone, top_block_targets(model.backbone, n_blocks, targets), rank=4,
                generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.B.normal_(generator=torch.Generator().manual_seed(seed + 1))
    return model


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama(hidden_size=32, num_layers=3, num_heads=4, seed=0)


def test_bt_loss_and_accuracy_by_hand():
    chosen, rejected = torch.tensor([2.0, 0.0, 1.0]), torch.tensor([0.0, 1.0, 1.0])
    expected = -torch.log(torch.sigmoid(torch.tensor([2.0, -1.0, 0.0]))).mean()
    torch.testing.assert_close(bt_loss(chosen, rejected), expected)
    assert preference_accuracy(chosen, rejected) == pytest.approx((1 + 0 + 0.5) / 3)


def test_top_block_targets_put_lora_only_in_the_top_blocks(tiny):
    model = reward_model(copy.deepcopy(tiny), 2, ["q_proj", "v_proj"])
    assert sorted(lora_layers(model)) == [f"backbone.layers.{i}.self_attn.{p}" for i in (1, 2) for p in ("q_proj",
                                                                                                        "v_proj")]
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"{n}.{f}" for n in lora_layers(model) for f in "AB"} | {"head.weight", "head.bias"}
    with pytest.raises(ValueError, match="lora.blocks = 4: the model has 3 blocks"):
        top_block_targets(model.backbone, 4, ["q_proj"])


@pytest.mark.parametrize("text_index", [0, 1, 2])
def test_padding_does_not_change_a_reward(tiny, text_index):
    model = reward_model(copy.deepcopy(tiny), 1, ["q_proj", "v_proj"])
    batch = model(tokenize(tiny.tokenizer, TEXTS, 64))
    alone = model(tokenize(tiny.tokenizer, [TEXTS[text_index]], 64))
    torch.testing.assert_close(batch[text_index], alone[0], rtol=1e-5, atol=1e-5)


def check_cached_features_match(backbone, n_blocks, targets):
    model = reward_model(backbone, n_blocks, targets)
    tokens = tokenize(backbone.tokenizer, TEXTS, 48)
    split = len(layer_stack(model.backbone)[1]) - n_blocks
    full = model(tokens)
    grads_full = torch.autograd.grad(full.square().sum(), [p for p in model.parameters() if p.requires_grad])
    cached = model(tokens, model.lower_features(tokens, split, batch_size=2), split)
    grads_cached = torch.autograd.grad(cached.square().sum(), [p for p in model.parameters() if p.requires_grad])
    torch.testing.assert_close(cached, full, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads_cached, grads_full, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert len(layer_stack(model.backbone)[1]) == split + n_blocks  # the blocks were put back


def test_cached_lower_features_give_the_same_rewards_and_gradients_causal(tiny):
    check_cached_features_match(copy.deepcopy(tiny), 1, ["q_proj", "v_proj"])


@pytest.mark.real
def test_cached_lower_features_give_the_same_rewards_and_gradients_minilm():
    check_cached_features_match(minilm_l6(), 2, ["query", "value"])


def test_split_must_leave_blocks_on_both_sides(tiny):
    model = reward_model(copy.deepcopy(tiny), 1, ["q_proj"])
    tokens = tokenize(tiny.tokenizer, TEXTS[:1], 16)
    for split in (0, 3):
        with pytest.raises(ValueError, match="split must be in 1..2"):
            model.lower_features(tokens, split)


def test_causal_pooling_takes_the_last_real_token(tiny):
    model = RewardModel(copy.deepcopy(tiny).model, causal=True)
    hidden = torch.arange(2 * 4 * 1, dtype=torch.float32).reshape(2, 4, 1)
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 1]])  # right- and left-padded
    assert model.pool(hidden, mask).flatten().tolist() == [1.0, 7.0]


def test_text_caches_joined_keep_every_row_and_pad_with_zeros():
    """TextCache.cat: each cache's rows in turn, tokens and features right-padded with zeros to the widest; a batch
    gathers its rows and trims them to their longest real text."""
    from collabalign.models.cached import TextCache
    from collabalign.models.pooled import Tokens

    def cache(rows, width, lengths):
        mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
        ids = torch.randint(1, 50, (rows, width)) * mask
        return TextCache(Tokens(ids, mask), torch.randn(rows, width, 3) * mask[..., None], 2)

    torch.manual_seed(0)
    parts = [cache(2, 4, [4, 2]), cache(3, 6, [1, 6, 3]), cache(1, 5, [5])]
    joined = TextCache.cat(parts)
    assert joined.tokens.input_ids.shape == (6, 6) and joined.features.shape == (6, 6, 3) and joined.split == 2
    start = 0
    for part in parts:
        width, rows = part.tokens.input_ids.shape[1], slice(start, start + len(part))
        torch.testing.assert_close(joined.features[rows, :width], part.features, rtol=0, atol=0)
        assert not joined.features[rows, width:].any() and not joined.tokens.attention_mask[rows, width:].any()
        assert torch.equal(joined.tokens.input_ids[rows, :width], part.tokens.input_ids)
        start += len(part)
    tokens, features = joined.batch(torch.tensor([5, 0, 1]))
    assert tokens.input_ids.shape == (3, 5) and torch.equal(features, joined.features[[5, 0, 1], :5])


@pytest.mark.real
def test_segment_ids_mark_the_second_text_and_reach_the_encoder_cached_or_not():
    backbone = minilm_l6()
    model = reward_model(backbone, 2, ["query", "value"])
    first, second = ["The cat sat on the mat.", "It rained."], ["A cat was sitting.", "The sun shone all day long."]
    plain = tokenize(backbone.tokenizer, first, 48, second)
    marked = tokenize(backbone.tokenizer, first, 48, second, segments=True)
    assert plain.token_type_ids is None and torch.equal(marked.input_ids, plain.input_ids)
    types, mask = marked.token_type_ids, marked.attention_mask
    assert types[0, 0] == 0 and types[0][mask[0].bool()].max() == 1  # [CLS] a [SEP] is 0, b [SEP] is 1
    assert tokenize(backbone.tokenizer, first, 48, segments=True).token_type_ids is None  # single texts: none
    assert not torch.allclose(model(marked), model(plain))
    split = len(layer_stack(model.backbone)[1]) - 2
    cached = model(marked[:, :10], model.lower_features(marked[:, :10], split), split)
    torch.testing.assert_close(cached, model(marked[:, :10]), rtol=1e-5, atol=1e-5)
