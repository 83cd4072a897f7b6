"""TorchLoRAProblem on the small teacher–student model: seeded LoRA dropout, head-only training, regression."""

import numpy as np
import pytest
import torch
from torch import nn

from collabalign.experiments.fslora.teacher_student import teacher_student
from collabalign.lora import inject_lora
from collabalign.methods.fslora.problems import ClassificationData, LocalSGD, TorchLoRAProblem
from collabalign.seeding import Seeds

HEAD = ["head.weight", "head.bias"]


def problem(dropout=0.0, lora=True, steps=3):
    student, train, test = teacher_student(Seeds(0), 64, 32, dim=12, classes=4, update_rank=4)
    inject_lora(student, ["hidden"], rank=4, dropout=dropout)
    return TorchLoRAProblem(student, HEAD, test, LocalSGD(steps, 0.1, batch_size=8, lora=lora)), train


def start(p, seed=0):
    """Rank-4 factors with B != 0 (so dropout on the LoRA input changes the gradients of A too) and a fresh head."""
    gen = torch.Generator().manual_seed(seed)
    factors = {"hidden": (0.1 * torch.randn(12, 4, generator=gen).numpy(), p.init_a(gen, 4, 12))}
    return factors, p.init_head(Seeds(seed))


def train(p, data, seed, factors, head, base=None):
    return p.local_train(factors, head, 1.0, base, data, torch.Generator().manual_seed(seed))


def same(x, y):
    """Equal trained (factors, head) pairs."""
    (fx, hx), (fy, hy) = x, y
    return (all(np.array_equal(a, b) for n in fx for a, b in zip(fx[n], fy[n], strict=True))
            and all(np.array_equal(hx[n], hy[n]) for n in hx))


def test_lora_dropout_masks_come_from_rng_and_leave_the_global_rng_alone():
    p, data = problem(dropout=0.1)
    layer = p.layers["hidden"]
    assert isinstance(layer.dropout, nn.Dropout) and not layer.dropout.training and not p.model.training
    factors, head = start(p)
    before = torch.get_rng_state()
    first = train(p, data, 5, factors, head)
    assert torch.equal(torch.get_rng_state(), before)
    assert same(first, train(p, data, 5, factors, head))
    assert not same(first, train(p, data, 6, factors, head))
    assert not layer.dropout.training  # back in eval mode
    delta = {"hidden": np.ones((12, 12), np.float32) / 12}
    assert p.evaluate(delta, first[1]) == p.evaluate(delta, first[1])  # no masks drawn


def test_dropout_is_on_during_the_steps():
    p, data = problem(dropout=0.5, steps=1)
    factors, head = start(p)
    p.sgd = LocalSGD(1, 0.1, batch_size=64)
    with_dropout = train(p, data, 0, factors, head)
    p.layers["hidden"].dropout.p = 0.0  # still an nn.Dropout: the same seed and minibatch are drawn
    assert not same(with_dropout, train(p, data, 0, factors, head))


def test_without_dropout_the_rng_only_draws_the_minibatches():
    p, data = problem(dropout=0.0, steps=3)
    factors, head = start(p)
    rng, reference = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    p.local_train(factors, head, 1.0, None, data, rng)
    for _ in range(3):
        torch.randint(len(data), (8,), generator=reference)
    assert torch.equal(rng.get_state(), reference.get_state())


def test_a_failing_step_restores_eval_mode_and_requires_grad():
    p, data = problem(dropout=0.1, lora=False)
    p.loss = lambda batch: (_ for _ in ()).throw(RuntimeError("boom"))
    with pytest.raises(RuntimeError, match="boom"):
        train(p, data, 0, *start(p))
    layer = p.layers["hidden"]
    assert not layer.dropout.training and layer.A.requires_grad and layer.B.requires_grad


def test_head_only_training_keeps_the_factors_and_applies_base():
    p, data = problem(lora=False)
    factors, head = start(p)
    trained, new_head = train(p, data, 0, factors, head)
    for name, (B, A) in factors.items():
        assert np.array_equal(trained[name][0], B) and np.array_equal(trained[name][1], A)
        assert trained[name][0] is not B and trained[name][1] is not A
    assert not np.array_equal(new_head["head.weight"], head["head.weight"])
    layer = p.layers["hidden"]
    assert layer.A.requires_grad and layer.B.requires_grad
    other, _ = start(p, seed=1)  # LoRA is off: other factors train the same head
    assert same((trained, new_head), (trained, train(p, data, 0, other, head)[1]))
    base = {"hidden": np.eye(12, dtype=np.float32)}  # the base delta still counts
    assert not np.array_equal(train(p, data, 0, factors, head, base)[1]["head.weight"], new_head["head.weight"])


def test_float_labels_make_a_regression_scored_by_pearson_and_mse():
    gen = torch.Generator().manual_seed(0)
    model, _, _ = teacher_student(Seeds(0), 1, 1, dim=8, classes=1)  # a seeded one-output model
    inject_lora(model, ["hidden"], rank=2)
    x = torch.randn(96, 8, generator=gen)
    y = (x[:, 0] + 0.1 * torch.randn(96, generator=gen)).float()
    data = ClassificationData(x, y)
    p = TorchLoRAProblem(model, HEAD, data[64:], LocalSGD(40, 0.1, batch_size=16))
    assert p.regression
    head = p.init_head(Seeds(0))
    before = p.evaluate({"hidden": np.zeros((8, 8), np.float32)}, head)
    assert set(before) == {"pearson", "loss"}
    with torch.no_grad():
        p.load(None, head, 1.0, None)
        assert before["loss"] == pytest.approx(float(((p.model(data[64:].x)[:, 0] - data[64:].y) ** 2).mean()))
    factors = {"hidden": (np.zeros((8, 2), np.float32), p.init_a(gen, 2, 8))}
    _, trained = p.local_train(factors, head, 1.0, None, data[:64], torch.Generator().manual_seed(0))
    after = p.evaluate({"hidden": np.zeros((8, 8), np.float32)}, trained)
    assert after["loss"] < 0.5 * before["loss"] and after["pearson"] > before["pearson"]
