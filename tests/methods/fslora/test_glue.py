"""The GLUE problem on real MiniLM and the shared GLUE files (marked real)."""

import numpy as np
import pytest
import torch
from torch import nn

from collabalign.data import shared_data_dir
from collabalign.federation import simulate
from collabalign.methods.fslora import device_ranks, fslora
from collabalign.methods.fslora.glue import GlueSetup, glue_problem
from collabalign.methods.fslora.problems import PRECISIONS, LocalSGD, check_precision
from collabalign.models.backbones import minilm_l6
from collabalign.seeding import Seeds

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def backbone():
    if shared_data_dir() is None:
        pytest.skip("../shared/data not found")
    return minilm_l6()


@pytest.mark.parametrize("task, extra", [("SST-2", set()), ("CoLA", {"matthews"})])
def test_glue_problem_trains_lora_on_cached_top_block(backbone, task, extra):
    setup = GlueSetup(rank=8, sgd=LocalSGD(steps=2, lr=0.5), max_train=48, max_length=32, max_test=32)
    problem, train = glue_problem(task, shared_data_dir() / "glue", backbone, setup, Seeds(0))
    assert problem.shapes == {f"pooled.backbone.encoder.layer.5.attention.self.{t}": (384, 384)
                              for t in ("query", "value")}
    assert len(train) == 48 and len(problem.test) == 32
    assert not set(train.x.tolist()) & set(problem.test.x.tolist())  # rows index one store: disjoint
    clients = {f"d{i}": train[torch.arange(i, 48, 3)] for i in range(3)}
    ranks = device_ranks(Seeds(0), list(clients), 8)
    result = simulate(fslora(problem, ranks, 8), clients, rounds=1, seed=0, progress=False)
    assert set(result.metrics[-1]) == {"round", "accuracy", "loss"} | extra
    assert result.state["head/pooled.head.weight"].shape == (2, 384)
    assert any(abs(result.state[k]).sum() > 0 for k in result.state if k.endswith(".B"))


def fresh_factors(problem, rank=8):
    """LoRA factors as a run starts them: B zero, A PEFT's uniform init (seed 0)."""
    gen = torch.Generator().manual_seed(0)
    return {n: (np.zeros((m, rank), np.float32), problem.init_a(gen, rank, k)) for n, (m, k) in problem.shapes.items()}


STSB = GlueSetup(rank=8, sgd=LocalSGD(steps=30, lr=0.05), max_train=48, max_length=32, max_test=32)  # float32


@pytest.fixture(scope="module")
def stsb(backbone):
    return glue_problem("STS-B", shared_data_dir() / "glue", backbone, STSB, Seeds(0))


@pytest.fixture(scope="module")
def stsb_trained(stsb):
    """One device's local training from fresh factors and head (seed 0) on the STS-B training rows, done once."""
    problem, train = stsb
    return problem.local_train(fresh_factors(problem), problem.init_head(Seeds(0)), 1.0, None, train,
                               torch.Generator().manual_seed(0))


def test_stsb_is_a_one_output_regression_scored_by_pearson(stsb):
    problem, train = stsb
    assert problem.regression and train.y.dtype == problem.test.y.dtype == torch.float32
    assert 0 <= float(train.y.min()) and float(train.y.max()) <= 5
    clients = {f"d{i}": train[torch.arange(i, 48, 3)] for i in range(3)}
    result = simulate(fslora(problem, device_ranks(Seeds(0), list(clients), 8), 8), clients, rounds=1, seed=0,
                      progress=False)
    assert [set(m) for m in result.metrics] == [{"round", "pearson", "loss"}] * 2
    assert result.metrics[-1]["loss"] < result.metrics[0]["loss"]  # the untrained head's scores are far from 0..5
    assert result.state["head/pooled.head.weight"].shape == (1, 384)
    assert any(abs(result.state[k]).sum() > 0 for k in result.state if k.endswith(".B"))


def test_stsb_training_fits_the_training_scores(stsb, stsb_trained):
    problem, train = stsb
    shapes = problem.shapes
    head = problem.init_head(Seeds(0))
    trained, new_head = stsb_trained
    test, problem.test = problem.test, train  # score the training rows
    try:
        before = problem.evaluate({n: np.zeros(s, np.float32) for n, s in shapes.items()}, head)
        after = problem.evaluate({n: B @ A for n, (B, A) in trained.items()}, new_head)
    finally:
        problem.test = test
    assert after["loss"] < 0.5 * before["loss"]
    assert after["pearson"] > max(0.5, before["pearson"] + 0.3)


def test_bfloat16_trains_as_float32_does_up_to_rounding(backbone, stsb, stsb_trained):
    from dataclasses import replace

    scores = {}
    for precision in PRECISIONS:
        if precision == STSB.precision:  # float32: the shared STS-B problem and its training (the same setup)
            problem, (trained, head) = stsb[0], stsb_trained
        else:
            problem, train = glue_problem("STS-B", shared_data_dir() / "glue", backbone,
                                          replace(STSB, precision=precision), Seeds(0))
            trained, head = problem.local_train(fresh_factors(problem), problem.init_head(Seeds(0)), 1.0, None,
                                                train, torch.Generator().manual_seed(0))
        attention = problem.model.pooled.backbone.config._attn_implementation
        assert (attention == "eager") == (precision == "bfloat16")  # bfloat16 skips the slow CPU flash backward
        assert all(B.dtype == A.dtype == np.float32 for B, A in trained.values())  # weights stay float32
        scores[precision] = problem.evaluate({n: B @ A for n, (B, A) in trained.items()}, head)
    assert scores["bfloat16"] != scores["float32"]  # the products did run in bfloat16
    assert abs(scores["bfloat16"]["pearson"] - scores["float32"]["pearson"]) < 0.05
    assert abs(scores["bfloat16"]["loss"] / scores["float32"]["loss"] - 1) < 0.1
    with pytest.raises(ValueError, match="precision 'float16' is not one of"):
        check_precision("float16")


def test_the_frozen_head_trains_and_scores_on_features_computed_once_as_through_the_blocks(backbone):
    setup = GlueSetup(rank=8, sgd=LocalSGD(steps=20, lr=0.01, lora=False, optimizer="adamw"), max_train=48,
                      max_length=32, max_test=32)
    problem, train = glue_problem("SST-2", shared_data_dir() / "glue", backbone, setup, Seeds(0))
    factors = fresh_factors(problem)
    zero = {n: np.zeros(s, np.float32) for n, s in problem.shapes.items()}
    runs = []
    for cached in (True, False):
        if not cached:
            problem.frozen_features = lambda: None  # every step through the 3 blocks again
        _, head = problem.local_train(factors, problem.init_head(Seeds(0)), 1.0, None, train,
                                      torch.Generator().manual_seed(0))
        runs.append((head, problem.evaluate(zero, head)))
    (fast_head, fast), (slow_head, slow) = runs
    assert problem._frozen is not None and problem._frozen.shape == (48 + 32, 384)
    assert all(np.allclose(fast_head[n], slow_head[n], atol=1e-5) for n in fast_head)
    assert fast["accuracy"] == slow["accuracy"] and abs(fast["loss"] - slow["loss"]) < 1e-5
    problem.load(factors, fast_head, 1.0, None)  # LoRA on: the blocks run again
    assert not problem._at_w0


def test_glue_lora_dropout_is_seeded_by_the_device_generator(backbone):
    setup = GlueSetup(rank=4, sgd=LocalSGD(steps=2, lr=0.5), max_train=32, max_length=32, max_test=16, dropout=0.1)
    problem, train = glue_problem("SST-2", shared_data_dir() / "glue", backbone, setup, Seeds(0))
    assert all(isinstance(layer.dropout, nn.Dropout) and layer.dropout.p == 0.1 for layer in problem.layers.values())
    assert not any(m.training for m in problem.model.modules())
    gen = torch.Generator().manual_seed(0)
    factors = {n: (0.01 * torch.randn(m, 4, generator=gen).numpy(), problem.init_a(gen, 4, k))
               for n, (m, k) in problem.shapes.items()}
    head = problem.init_head(Seeds(0))

    def run(seed):
        """The trained factors and head as one vector."""
        trained, new_head = problem.local_train(factors, head, 1.0, None, train, torch.Generator().manual_seed(seed))
        return np.concatenate([x.ravel() for pair in trained.values() for x in pair]
                              + [x.ravel() for x in new_head.values()])

    state = torch.get_rng_state()
    first = run(1)
    assert torch.equal(torch.get_rng_state(), state)
    assert np.array_equal(first, run(1)) and not np.array_equal(first, run(2))
    assert not any(m.training for m in problem.model.modules())
    delta = {n: np.zeros(s, np.float32) for n, s in problem.shapes.items()}
    assert problem.evaluate(delta, head) == problem.evaluate(delta, head)
