"""Many devices in one batched computation (`TorchLoRAProblem.local_train_many`, the algorithms'
`client_update_many`) against one device after another: equal in float64 to 1e-10, for different ranks, data
sizes, LoRA off (the frozen head) and the algorithms that use it."""

import numpy as np
import pytest
import torch

from collabalign.federation import simulate
from collabalign.federation.engine import EngineOptions
from collabalign.methods.fslora import FlexLoRA, fedlora, fslora, heterolora
from collabalign.methods.fslora.problems import LocalJob, LocalSGD
from collabalign.seeding import Seeds

from .setup import small_problem


def jobs(problem, clients, ranks, seed=0):
    """One job per device: its own rank-k_i block (B != 0, so every factor's gradient is live), head and generator."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, (cid, data) in enumerate(clients.items()):
        k = ranks[cid]
        factors = {name: (0.1 * torch.randn(m, k, generator=gen, dtype=torch.float64).numpy(),
                          problem.init_a(gen, k, n).astype(np.float64)) for name, (m, n) in problem.shapes.items()}
        head = {n: v.astype(np.float64) for n, v in problem.init_head(Seeds(seed + i)).items()}
        out.append(LocalJob(factors, head, 0.5 + 0.25 * i, None, data, torch.Generator().manual_seed(100 + i)))
    return out


def fresh(job_list):
    """The same jobs with fresh generators (each run consumes them)."""
    return [job._replace(rng=torch.Generator().manual_seed(100 + i)) for i, job in enumerate(job_list)]


def max_diff(a, b):
    return max(float(np.abs(x - y).max()) for (fa, ha), (fb, hb) in zip(a, b, strict=True)
               for x, y in [*[(fa[n][j], fb[n][j]) for n in fa for j in (0, 1)], *[(ha[n], hb[n]) for n in ha]])


@pytest.mark.parametrize("lora", [True, False])
@pytest.mark.parametrize("sizes", ["equal", "unequal"])
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_batched_local_training_equals_one_device_after_another_in_float64(lora, sizes, optimizer, monkeypatch):
    problem, clients, ranks = small_problem(dtype=torch.float64)
    problem.sgd = LocalSGD(5, 0.1 if optimizer == "sgd" else 0.01, batch_size=8, momentum=0.9, lora=lora,
                           optimizer=optimizer, weight_decay=0.01)
    if sizes == "unequal":  # a device with fewer rows than the batch: its batches are smaller, rows routed by index
        clients["d0"] = clients["d0"][:5]
    assert len(set(ranks.values())) > 1  # different ranks: zero-padded blocks
    work = jobs(problem, clients, ranks)
    sequential = [problem.local_train(*job) for job in fresh(work)]
    monkeypatch.setattr(type(problem), "local_train", None)  # the batched path never falls back
    batched = problem.local_train_many(fresh(work))
    assert max_diff(batched, sequential) < 1e-10
    moved = max(float(np.abs(h["head.weight"] - job.head["head.weight"]).max()) for (_, h), job in
                zip(batched, work, strict=True))
    assert moved > 1e-3  # the steps did train
    for (trained, _), job in zip(batched, work, strict=True):
        for name, (B, A) in job.factors.items():
            assert trained[name][0].shape == B.shape and trained[name][1].shape == A.shape
            assert lora or (np.array_equal(trained[name][0], B) and np.array_equal(trained[name][1], A))


def test_the_model_comes_back_unchanged_and_a_dropout_problem_runs_devices_one_by_one(monkeypatch):
    problem, clients, ranks = small_problem(dtype=torch.float64)
    before = {n: p.detach().clone() for n, p in problem.model.named_parameters()}
    modules = [type(m) for m in problem.model.modules()]
    problem.local_train_many(jobs(problem, clients, ranks))
    assert [type(m) for m in problem.model.modules()] == modules
    assert {n for n, _ in problem.model.named_parameters()} == set(before)
    for layer in problem.layers.values():
        assert layer.party is None and layer.party_scale is None
    calls = []
    monkeypatch.setattr(type(problem), "local_train", lambda self, *job: calls.append(job) or ({}, {}))
    layer = next(iter(problem.layers.values()))
    monkeypatch.setattr(layer, "dropout", torch.nn.Dropout(0.1))
    problem.local_train_many(jobs(problem, clients, ranks))
    assert len(calls) == len(clients)


@pytest.mark.parametrize("make", [
    lambda p, ranks: fslora(p, ranks, 8, alpha=2.0),
    lambda p, ranks: fedlora(p, list(ranks), 8),
    lambda p, ranks: heterolora(p, ranks, 8),
    lambda p, ranks: FlexLoRA(p, ranks, 8),
], ids=["fslora", "fedlora", "heterolora", "flexlora"])
def test_an_algorithm_run_with_the_batched_hook_equals_the_sequential_one(make, monkeypatch):
    """The engine calls client_update_many when the algorithm has it; the same run one device after another."""
    problem, clients, ranks = small_problem()
    problem.sgd = LocalSGD(3, 0.1, batch_size=8, momentum=0.9)
    one_by_one, calls = problem.local_train, []
    monkeypatch.setattr(problem, "local_train", lambda *job: calls.append(1) or one_by_one(*job))
    a, b = (simulate(make(problem, ranks), clients, 3, seed=0, eval_every=1, options=EngineOptions(batched=batched))
            for batched in (True, False))
    assert len(calls) == 3 * len(clients)  # only the sequential run trains device by device
    assert [m["accuracy"] for m in a.metrics] == pytest.approx([m["accuracy"] for m in b.metrics], abs=1e-9)
    for key, value in a.state.items():
        assert np.allclose(value, b.state[key], atol=1e-5), key
