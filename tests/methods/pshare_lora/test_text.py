"""The P-ShareLoRA text reward model on a tiny random 6-block BERT: cached features are exact, per-user heads are
per user and routed in one forward, Share Rep personalises only the top 30% of the blocks, HH pairs, and a toy
text_part run (claims, table, plot, determinism)."""

import gzip
import json

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel

from collabalign.data.tldr_like import generate
from collabalign.experiments.pshare_lora_text import HH_FILE, TextConfig, text_part
from collabalign.lora import lora_layers, routed
from collabalign.methods.pshare_lora import Prefs, configure, pair_loss, prepare, schedule, train
from collabalign.methods.pshare_lora.hh_pairs import HH_ATTRIBUTES, hh_pairs, hh_texts, reply_vector
from collabalign.methods.pshare_lora.text import TextRewardModel, encode, share_rep_frozen
from collabalign.models.backbones import MINILM_PACKAGE, Backbone, minilm_l6, package_dir
from collabalign.runs import RunDir


@pytest.fixture(scope="module")
def backbone():
    torch.manual_seed(0)
    model = BertModel(BertConfig(hidden_size=16, num_hidden_layers=6, num_attention_heads=2, intermediate_size=32))
    return Backbone(model.eval(), AutoTokenizer.from_pretrained(package_dir(MINILM_PACKAGE) / "model"), False)


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
    assert schedule("share_rep", 4, 30, 0.1, frozen_layers=share_rep_frozen(6, 2, 2))[1].modes == \
        (("user", "user"),) * 4
    # ... with LoRA on the top 3 blocks, block 3's query and key stay frozen (after the global phase)
    assert schedule("share_rep", 6, 30, 0.1, frozen_layers=share_rep_frozen(6, 3, 2))[1].modes == \
        (("frozen", "frozen"),) * 2 + (("user", "user"),) * 4


def test_share_rep_trains_only_the_top_blocks_per_user(backbone):
    cache3 = encode(backbone, generate(3, 6, 0, seed=1).texts, 48, lora_blocks=3)
    model = model_for(backbone, cache3, per_user_head=True)
    g = torch.Generator().manual_seed(0)
    prepare(model, "share_rep", 3, g)
    phases = schedule("share_rep", len(model.lora), 9, 0.05, frozen_layers=share_rep_frozen(6, 3, 2))
    data = Prefs(torch.arange(3).repeat_interleave(6), torch.arange(0, 36, 2), torch.arange(1, 36, 2))
    train(model, data, phases[:1], 3, 6, g)
    after_global = [(layer.A.detach().clone(), layer.B.detach().clone()) for layer in model.lora]
    train(model, data, phases[1:], 3, 6, g)
    for layer, (a, b) in zip(model.lora[:2], after_global[:2], strict=True):  # block 3: shared, frozen
        assert layer.A.dim() == 2 and torch.equal(layer.A, a) and torch.equal(layer.B, b)
    for layer, (_, b) in zip(model.lora[2:], after_global[2:], strict=True):  # blocks 4-5: per user, moved apart
        assert layer.A.dim() == 3 and layer.B.shape[0] == 3
        assert not torch.equal(layer.B[0], b) and not torch.equal(layer.B[0], layer.B[1])


HH_ROWS = [{"chosen": f"\n\nHuman: Question {i}?\n\nAssistant: Sorry, I can't help you with {i}.",
            "rejected": f"\n\nHuman: Question {i}?\n\nAssistant: Sure! Do you want more? " + "word " * (i % 5)}
           for i in range(24)]


@pytest.fixture
def hh_dir(tmp_path, monkeypatch):
    (tmp_path / "hh-rlhf").mkdir()
    with gzip.open(tmp_path / HH_FILE, "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in HH_ROWS))
    monkeypatch.setenv("COLLABALIGN_DATA", str(tmp_path))
    return tmp_path


def test_hh_reply_attributes_and_pairs(backbone, hh_dir):
    raw = dict(zip(HH_ATTRIBUTES, reply_vector("Sorry, can you tell me what you mean?", True, 9), strict=True))
    assert raw == pytest.approx({"harmless": 1, "length": np.log(10), "apology": 1, "questions": 1,
                                 "second_person": 2})
    turns, replies, attrs = hh_texts(hh_dir / HH_FILE, backbone.tokenizer)
    assert len(turns) == 48 and turns[0] == "Question 0?" and replies[1].startswith("Sure!")
    pairs = hh_pairs(turns, replies, attrs, 2, 4, 3, seed=0)
    assert pairs.users.tolist() == [0] * 7 + [1] * 7
    assert (pairs.first // 2 == pairs.other // 2).all() and (pairs.first != pairs.other).all()
    train_ids, test_ids = set(pairs.first[pairs.train] // 2), set(pairs.first[~pairs.train] // 2)
    assert not train_ids & test_ids  # labelers share pairs, but never across the train / test halves
    with pytest.raises(ValueError, match="cannot draw"):
        hh_pairs(turns, replies, attrs, 2, 13, 3, seed=0)


TOY = TextConfig(run=True, seeds=[0, 1], users=3, n_train=8, n_test=4, epochs=1, batch_size=8, max_length=40, rank=2,
                 methods=["global", "local", "share_rep", "pshare_si", "pshare_g"])


def test_text_part_writes_claims_table_plot_and_is_deterministic(backbone, hh_dir, tmp_path):
    parts = [text_part(TOY, [7], RunDir(tmp_path / f"run{k}"), False, backbone) for k in range(2)]
    assert parts[0].records == parts[1].records
    assert {r["seed"] for r in parts[0].records} == {0, 1}  # the text seeds override the experiment's
    assert len(parts[0].records) == 2 * 5 * 2  # sources x methods x seeds
    names = [c["name"] for c in parts[0].claims]
    assert "TL;DR-like: P-ShareLoRA (SI) > LoRA-global" in names and "HH-RLHF: P-ShareLoRA (SI) > LoRA-local" in names
    notes = "\n".join(parts[0].notes)
    assert "| Share Rep | " in notes and "| oracle | " in notes and "labeler 2" in notes and "formality" in notes
    for source in ("tldr_like", "hh"):
        assert (tmp_path / "run0" / "plots" / f"text_{source}_per_labeler.png").stat().st_size > 1000
    rec = parts[0].records[0]
    assert len(rec["accuracy_per_user"]) == 3 and 0 <= rec["accuracy"] <= 1 and rec["steps"] == 3


def test_real_tldr_source_trains_on_the_labelers_own_comparisons(backbone, tmp_path):
    from tests.data.helpers import jsonl, write
    from tests.data.test_tldr import TRAIN, VALID

    write(tmp_path / "train.jsonl.gz", jsonl(*TRAIN), gz=True)
    write(tmp_path / "validation.jsonl", jsonl(*VALID))
    cfg = TOY.model_copy(update={"sources": ["tldr"], "data_root": str(tmp_path), "users": 5, "n_train": 0,
                                 "n_test": 0, "methods": ["global", "pshare_si"]})
    part = text_part(cfg, [0], RunDir(tmp_path / "run"), False, backbone)
    assert len(part.records) == 2 * 2  # methods x seeds
    rec = part.records[0]
    assert rec["source"] == "tldr" and len(rec["accuracy_per_user"]) == 5 and "oracle_accuracy" not in rec
    assert rec["steps"] == 3  # 4 balanced train pairs x 5 labelers / batch 8, one epoch
    assert "Reddit TL;DR: P-ShareLoRA (SI) > LoRA-global" in [c["name"] for c in part.claims]
    assert "| oracle |" not in "\n".join(part.notes)
    assert (tmp_path / "run" / "plots" / "text_tldr_per_labeler.png").stat().st_size > 1000


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
