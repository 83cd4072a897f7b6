"""glue_problem on a 3-class MNLI fixture with a tiny random BERT: one logit per class, scored by accuracy."""

import torch
from transformers import AutoTokenizer, BertConfig, BertModel

from collabalign.federation import simulate
from collabalign.methods.fslora import device_ranks, fslora
from collabalign.methods.fslora.glue import GlueSetup, glue_problem
from collabalign.methods.fslora.problems import LocalSGD
from collabalign.models.backbones import MINILM_PACKAGE, Backbone, package_dir
from collabalign.seeding import Seeds
from tests.data.helpers import MNLI_HEAD, mnli_row, write

GOLD = ("entailment", "neutral", "contradiction")


def test_glue_problem_on_three_class_mnli(tmp_path):
    (tmp_path / "MNLI").mkdir()
    rows = [mnli_row(i, f"A man number {i} sleeps.", f"Claim {i}.", GOLD[i % 3], GOLD[i % 3]) for i in range(12)]
    write(tmp_path / "MNLI" / "train.tsv", MNLI_HEAD + "label1\tgold_label\n" + "".join(rows))
    dev = [mnli_row(i, "A dog barks.", f"Claim {i}.", *[GOLD[i % 3]] * 6) for i in range(6)]
    write(tmp_path / "MNLI" / "dev_matched.tsv", MNLI_HEAD + "label1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label\n"
          + "".join(dev))
    torch.manual_seed(0)
    model = BertModel(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64))
    backbone = Backbone(model, AutoTokenizer.from_pretrained(package_dir(MINILM_PACKAGE) / "model"), False)
    setup = GlueSetup(rank=4, sgd=LocalSGD(steps=2, lr=0.5), max_train=12, max_length=16)
    problem, train = glue_problem("MNLI", tmp_path, backbone, setup, Seeds(0))
    assert model.training and not any(m.training for m in problem.model.modules())  # a copy, its dropout off
    assert len(train) == 12 and len(problem.test) == 6
    assert sorted(train.y.tolist()) == [0] * 4 + [1] * 4 + [2] * 4 and problem.test.y.tolist() == [0, 1, 2] * 2
    clients = {f"d{i}": train[torch.arange(i, 12, 2)] for i in range(2)}
    result = simulate(fslora(problem, device_ranks(Seeds(0), list(clients), 4), 4), clients, rounds=1, seed=0,
                      progress=False)
    assert set(result.metrics[-1]) == {"round", "accuracy", "loss"}  # accuracy is MNLI's score: no extra metric
    assert 0.0 <= result.metrics[-1]["accuracy"] <= 1.0
    assert result.state["head/pooled.head.weight"].shape == (3, 32)
