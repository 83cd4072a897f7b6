"""The P-ShareLoRA text reward model on a tiny random 6-block BERT: cached features are exact, per-user heads are
per user and routed in one forward, Share Rep keeps the bottom 70% of the blocks frozen and personalises only the top
30% (with a head per user, or one head in its same-head variant; its phased ablation after a global phase), LoRA in
every block runs without a cache, checkpointing and micro-batches train the same model."""

import pytest
import torch

from collabalign.data.tldr_like import generate
from collabalign.lora import lora_layers, routed
from collabalign.methods.pshare_lora import Prefs, configure, pair_loss, prepare, schedule, train
from collabalign.methods.pshare_lora.text import PER_USER_HEAD, TextRewardModel, encode, share_rep_frozen
from collabalign.models.backbones import minilm_l6

from .text_setup import tiny_bert


@pytest.fixture(scope="module")
def backbone():
    return tiny_bert()


@pytest.fixture(scope="module")
def cache(backbone):
    return encode(backbone, generate(3, 4, 2, seed=0).texts, 48, lora_blocks=2)


def model_for(backbone, cache, per_user_head, users=3, seed=0):
    return TextRewardModel(backbone, cache, 4, 2.0, 0.0, users, per_user_head, torch.Generator().manual_seed(seed))


def nonzero_lora(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.lora:
            layer.B.copy_(torch.randn(layer.B.shape, generator=g))


def test_cached_lower_blocks_give_the_full_forward(backbone, cache):
    model = model_for(backbone, cache, per_user_head=False)
    nonzero_lora(model)
    rows = torch.tensor([5, 0, 17, 3])
    with routed(model, 0):
        full = model.pooled(cache.tokens[rows].trimmed()).squeeze(-1)
        torch.testing.assert_close(model(rows), full, atol=1e-5, rtol=1e-5)
    assert cache.split == 4
    assert len(model.lora) == 4  # query and key of blocks 4 and 5, bottom to top


@pytest.mark.real
def test_real_minilm_gets_lora_on_query_and_key_of_its_top_two_blocks_and_caches_exactly():
    real = minilm_l6()
    texts = generate(1, 2, 0, seed=0).texts
    real_cache = encode(real, texts, 96, lora_blocks=2)
    model = TextRewardModel(real, real_cache, 8, 4.0, 0.05, 1, False, torch.Generator().manual_seed(0))
    assert sorted(lora_layers(model.pooled.backbone)) == [f"encoder.layer.{b}.attention.self.{t}" for b in (4, 5)
                                                         for t in ("key", "query")]
    assert real_cache.features.shape[:2] == real_cache.tokens.input_ids.shape and real_cache.split == 4
    nonzero_lora(model)
    model.lora_dropout(False)
    rows = torch.arange(len(texts))
    with routed(model, 0):
        torch.testing.assert_close(model(rows), model.pooled(real_cache.tokens).squeeze(-1), atol=1e-4, rtol=1e-4)


def test_per_user_head_is_routed_per_sample_in_one_forward(backbone, cache):
    model = model_for(backbone, cache, per_user_head=True)
    assert model.pooled.head.weight.shape == (3, 16)
    rows, users = torch.tensor([1, 2, 3, 4, 5, 6]), torch.tensor([2, 0, 1, 1, 0, 2])
    with routed(model, users):
        mixed = model(rows)
    one_by_one = torch.stack([model_scores(model, rows[k:k + 1], int(users[k]))[0] for k in range(len(rows))])
    torch.testing.assert_close(mixed, one_by_one)
    with routed(model, torch.tensor([0, 1])):
        same_text = model(torch.tensor([7, 7]))
    assert same_text[0] != same_text[1]  # each user its own head


def test_per_user_head_follows_the_blockwise_layout_of_full_batch_training(backbone, cache):
    model = model_for(backbone, cache, per_user_head=True)
    nonzero_lora(model)
    for layer in model.lora:
        configure(layer, "user", "shared", 3)
    data = Prefs(torch.arange(3).repeat_interleave(2), torch.arange(0, 12, 2), torch.arange(1, 12, 2))
    torch.testing.assert_close(pair_loss(model, data, data.blocks(3)), pair_loss(model, data))


def model_scores(model, rows, user):
    with routed(model, user):
        return model(rows)


def test_per_user_head_gradient_touches_only_that_users_row(backbone, cache):
    model = model_for(backbone, cache, per_user_head=True)
    batch = Prefs(torch.tensor([0, 0]), torch.tensor([0, 2]), torch.tensor([1, 3]))
    pair_loss(model, batch).backward()
    grad = model.pooled.head.weight.grad
    assert grad[0].abs().sum() > 0 and grad[1:].abs().sum() == 0
    assert model.pooled.head.bias.grad[1:].abs().sum() == 0


def test_shared_head_is_one_head_for_every_user(backbone, cache):
    model = model_for(backbone, cache, per_user_head=False)
    assert model.pooled.head.weight.shape == (1, 16)
    with routed(model, torch.tensor([0, 1, 2])):
        scores = model(torch.tensor([7, 7, 7]))
    assert scores[0] == scores[1] == scores[2]
    pair_loss(model, Prefs(torch.tensor([0, 2]), torch.tensor([0, 2]), torch.tensor([1, 3]))).backward()
    assert model.pooled.head.weight.grad.abs().sum() > 0


def test_missing_route_for_a_per_user_head_is_an_error(backbone, cache):
    with pytest.raises(ValueError, match="no user was routed"):
        model_for(backbone, cache, per_user_head=True).pooled.head(torch.zeros(2, 16))


def test_share_rep_frozen_maps_blocks_to_lora_layers():
    # 6 blocks, floor(0.7 * 6) = 4 frozen: with LoRA on the top 2 blocks (4 layers) all are personal ...
    assert schedule("share_rep", 4, 30, 0.1, frozen_layers=share_rep_frozen(6, 2, 2))[0].modes == \
        (("user", "user"),) * 4
    # ... with LoRA on the top 3 blocks, block 3's query and key stay frozen from the first step
    split = (("frozen", "frozen"),) * 2 + (("user", "user"),) * 4
    for method in ("share_rep", "share_rep_same_head"):
        assert [p.modes for p in schedule(method, 6, 30, 0.1, frozen_layers=share_rep_frozen(6, 3, 2))] == [split]
    assert schedule("share_rep_phased", 6, 30, 0.1, frozen_layers=share_rep_frozen(6, 3, 2))[1].modes == split


def train_share_rep(backbone, method):
    """`method` on a model with LoRA on the top 3 blocks (block 3 frozen by Share Rep), its head as `fit` builds it;
    returns the model, the initial LoRA factors and head, and the phases."""
    cache3 = encode(backbone, generate(3, 6, 0, seed=1).texts, 48, lora_blocks=3)
    model = model_for(backbone, cache3, per_user_head=method in PER_USER_HEAD)
    g = torch.Generator().manual_seed(0)
    prepare(model, method, 3, g)
    initial = [(layer.A.detach().clone(), layer.B.detach().clone()) for layer in model.lora]
    head = model.pooled.head.weight.detach().clone()
    phases = schedule(method, len(model.lora), 9, 0.05, frozen_layers=share_rep_frozen(6, 3, 2))
    data = Prefs(torch.arange(3).repeat_interleave(6), torch.arange(0, 36, 2), torch.arange(1, 36, 2))
    train(model, data, phases, 3, 6, g)
    return model, initial, head, phases


@pytest.mark.parametrize("method,heads", [("share_rep", 3), ("share_rep_same_head", 1)])
def test_share_rep_trains_only_the_top_blocks_per_user_from_the_first_step(backbone, method, heads):
    model, initial, head, phases = train_share_rep(backbone, method)
    assert len(phases) == 1
    for layer, (a, b) in zip(model.lora[:2], initial[:2], strict=True):  # block 3: frozen, the pre-trained block
        assert layer.A.dim() == 2 and torch.equal(layer.A, a) and torch.equal(layer.B, b) and not b.any()
    for layer in model.lora[2:]:  # blocks 4-5: per user, moved apart
        assert layer.A.dim() == 3 and layer.B.shape[0] == 3
        assert layer.B.abs().sum() > 0 and not torch.equal(layer.B[0], layer.B[1])
    weight = model.pooled.head.weight
    assert weight.shape[0] == heads and not torch.equal(weight, head)  # a trained head per user, or one for all
    if heads > 1:
        assert not torch.allclose(weight[0] - head[0], weight[1] - head[1])


@pytest.mark.parametrize("method,heads", [("frozen", 1), ("frozen_per_user", 3)])
def test_frozen_backbone_trains_only_its_score_heads(backbone, method, heads):
    model, initial, head, phases = train_share_rep(backbone, method)
    assert len(phases) == 1 and model.pooled.head.weight.shape[0] == heads
    for layer, (a, b) in zip(model.lora, initial, strict=True):  # every LoRA layer: untouched, a zero update
        assert not layer.A.requires_grad and torch.equal(layer.A, a) and torch.equal(layer.B, b) and not b.any()
    assert not torch.equal(model.pooled.head.weight, head)


def test_phased_ablation_trains_globally_then_only_the_top_blocks_per_user(backbone):
    cache3 = encode(backbone, generate(3, 6, 0, seed=1).texts, 48, lora_blocks=3)
    model = model_for(backbone, cache3, per_user_head="share_rep_phased" in PER_USER_HEAD)
    g = torch.Generator().manual_seed(0)
    prepare(model, "share_rep_phased", 3, g)
    phases = schedule("share_rep_phased", len(model.lora), 9, 0.05, frozen_layers=share_rep_frozen(6, 3, 2))
    data = Prefs(torch.arange(3).repeat_interleave(6), torch.arange(0, 36, 2), torch.arange(1, 36, 2))
    train(model, data, phases[:1], 3, 6, g)
    after_global = [(layer.A.detach().clone(), layer.B.detach().clone()) for layer in model.lora]
    assert all(b.abs().sum() > 0 for _, b in after_global)  # the global phase trained block 3 too
    train(model, data, phases[1:], 3, 6, g)
    for layer, (a, b) in zip(model.lora[:2], after_global[:2], strict=True):  # block 3: shared, then frozen
        assert layer.A.dim() == 2 and torch.equal(layer.A, a) and torch.equal(layer.B, b)
    for layer, (_, b) in zip(model.lora[2:], after_global[2:], strict=True):  # blocks 4-5: per user, moved apart
        assert layer.A.dim() == 3 and layer.B.shape[0] == 3
        assert not torch.equal(layer.B[0], b) and not torch.equal(layer.B[0], layer.B[1])


def test_lora_in_every_block_runs_the_whole_backbone_without_a_cache(backbone):
    texts = generate(3, 4, 2, seed=0).texts
    full = encode(backbone, texts, 48, lora_blocks=6)
    assert full.split == 0 and full.features is None
    cached = encode(backbone, texts, 48, lora_blocks=2)
    rows = torch.arange(6)  # shared factors and head: no routing needed; B = 0, so both are the frozen backbone
    torch.testing.assert_close(model_for(backbone, full, False)(rows), model_for(backbone, cached, False)(rows))


def test_checkpointing_and_micro_batches_train_the_same_model(backbone):
    from collabalign.methods.pshare_lora.text import TextTraining, fit

    pairs = generate(3, 6, 4, seed=0)
    cache = encode(backbone, pairs.texts, 48, lora_blocks=2)
    prefs = Prefs(*(torch.from_numpy(a) for a in (pairs.users, pairs.first, pairs.other)))
    train_mask = torch.from_numpy(pairs.train)
    data, test = prefs[train_mask.nonzero()[:, 0]], prefs[(~train_mask).nonzero()[:, 0]]
    settings = {"rank": 2, "batch_size": 6, "epochs": 2, "dropout": 0.0}
    plain = fit(backbone, cache, data, test, "pshare_si", 3, TextTraining(**settings), 0)
    lean_training = TextTraining(**settings, micro_batch=2, checkpointing=True)
    lean = fit(backbone, cache, data, test, "pshare_si", 3, lean_training, 0)
    assert lean["accuracy"] == plain["accuracy"] and lean["train_loss"] == pytest.approx(plain["train_loss"], abs=1e-4)
