"""The GLUE problem on real MiniLM and the shared GLUE files (marked real)."""

import pytest
import torch

from collabalign.data import shared_data_dir
from collabalign.federation import simulate
from collabalign.methods.fslora import device_ranks, fslora
from collabalign.methods.fslora.problems import GlueSetup, LocalSGD, glue_problem
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
