"""Federated P-ShareLoRA: personal factors never leave the clients, private state persists, aggregation is a
sample-weighted mean, one round equals one centralised SGD step on the pooled data, FedAvg-LoRA (the project's FedAvg
over the routed-LoRA trainer) sends both factors and trains its clients in one computation, the hand-over of G / WU,
determinism."""

from functools import partial

import numpy as np
import pytest
import torch

from collabalign.comm import Message
from collabalign.experiments.pshare_lora.problems.synthetic import ProblemConfig, evaluate, generate, model_for
from collabalign.federation import simulate
from collabalign.federation.engine import reply_spec
from collabalign.federation.protocol import ClientContext
from collabalign.lora import lora_layers
from collabalign.methods.fedavg import FedAvg
from collabalign.methods.pshare_lora import configure, pair_loss
from collabalign.methods.pshare_lora.federated import (
    FederatedPShareLoRA,
    LocalLoRA,
    personal_bytes,
    user_data,
)
from collabalign.methods.pshare_lora.local_trainer import LocalSteps, RoutedLoRA
from collabalign.methods.pshare_lora.train import Prefs
from collabalign.seeding import Seeds

SMALL = ProblemConfig(d1=6, d2=4, users=4, k=2, n_train=12, n_test=40, depth=2)
A_SHAPE = (2, 4)  # both layers' A (r, d2); their B are (4, 2) and (6, 2)


class Spy:
    """Delegates to an algorithm and records every message and every client's private state before / after."""

    def __init__(self, algorithm, batched=True):
        self.algorithm, self.down, self.up, self.before, self.after = algorithm, [], [], [], []
        if batched:
            self.client_update_many = self._many

    def init(self, seeds):
        return self.algorithm.init(seeds)

    def configure(self, state, round_, client_ids):
        messages = self.algorithm.configure(state, round_, client_ids)
        self.down.append(messages)
        return messages

    def _many(self, messages, clients):
        self.before.append({cid: dict(c.state) for cid, c in clients.items()})
        replies = self.algorithm.client_update_many(messages, clients)
        self.after.append({cid: dict(c.state) for cid, c in clients.items()})
        self.up.append(replies)
        return replies

    def client_update(self, message, client):
        self.before.append({client.cid: dict(client.state)})
        reply = self.algorithm.client_update(message, client)
        self.after.append({client.cid: dict(client.state)})
        self.up.append({client.cid: reply})
        return reply

    def reply_spec(self, state, message, cid):
        return reply_spec(self.algorithm, state, message, cid)

    def aggregate(self, state, replies, round_):
        return self.algorithm.aggregate(state, replies, round_)

    def evaluate(self, state, clients, round_):
        return self.algorithm.evaluate(state, clients, round_)


def setup(seed=0, problem=SMALL):
    truth, train, test = generate(problem, seed)
    return truth, user_data(train, test, problem.users), partial(model_for, truth, problem.k, problem.depth)


def pshare(model_fn, *args, **kw):
    return FederatedPShareLoRA(RoutedLoRA(model_fn, LocalSteps(*args)), **kw)


def fedavg_lora(model_fn, data, *args):
    return FedAvg(RoutedLoRA(model_fn, LocalSteps(*args), tests=[d["test"] for d in data.values()]))


def run(algorithm, data, rounds=4, fraction=0.5, batched=True, seed=3):
    spy = Spy(algorithm, batched)
    return spy, simulate(spy, data, rounds, seed, fraction, progress=False)


def all_messages(spy):
    return [m for batch in spy.down + spy.up for m in batch.values()]


@pytest.mark.parametrize("batched", [True, False])
def test_personal_factors_never_leave_the_clients(batched):
    truth, data, model_fn = setup()
    spy, result = run(pshare(model_fn, 3, 0.05), data, batched=batched)
    personal = [a for states in spy.after for s in states.values() for a in s.values()]
    assert len(personal) > 0 and all(a.shape == A_SHAPE for a in personal)
    for msg in all_messages(spy):
        assert not any(name.endswith(".A") for name in msg)
        assert all(a.shape != A_SHAPE for a in msg.values())
        assert not any(np.array_equal(a, p) for a in msg.values() for p in personal)
    b_only = {f"{n}.B": np.zeros(tuple(layer.B.shape), np.float32) for n, layer in lora_layers(model_fn()).items()}
    for msg in all_messages(spy):  # every message carries the B factors and nothing else
        assert set(msg) == set(b_only) and msg.array_nbytes == sum(a.nbytes for a in b_only.values())
    ups = [(c, b) for _, c, d, b in result.ledger.rows if d == "up"]
    assert len(ups) == 4 * 2  # 2 of 4 clients in each of 4 rounds
    assert all(b == Message(b_only, {"n": len(data[c]["train"])}).nbytes for c, b in ups)
    assert personal_bytes(result.clients) == sum(len(c.state) * 2 * 4 * 4 for c in result.clients.values())


def test_private_state_persists_across_rounds_and_changes():
    _, data, model_fn = setup()
    spy, result = run(pshare(model_fn, 3, 0.05), data, rounds=5, fraction=0.5)
    last = {}
    for before, after in zip(spy.before, spy.after, strict=True):
        for cid in before:
            if cid in last:  # what the client kept from its previous round, untouched in between
                assert before[cid].keys() == last[cid].keys()
                assert all(np.array_equal(before[cid][n], last[cid][n]) for n in last[cid])
                assert not all(np.array_equal(after[cid][n], before[cid][n]) for n in before[cid])
            else:
                assert before[cid] == {}
            last[cid] = after[cid]
    assert sum(len(b) for b in spy.before) > len(last)  # some client was sampled more than once
    assert all(np.array_equal(result.clients[c].state[n], last[c][n]) for c in last for n in last[c])


def test_aggregation_is_a_sample_weighted_mean():
    _, _, model_fn = setup()
    algorithm = pshare(model_fn)
    state = algorithm.init(Seeds(0))
    rng = np.random.default_rng(0)
    counts = {"u0": 1, "u1": 3, "u2": 6}
    arrays = {cid: {n: rng.normal(size=state["params"][n].shape).astype(np.float32) for n in algorithm.shared}
              for cid in counts}
    new = algorithm.aggregate(state, {cid: Message(arrays[cid], {"n": n}) for cid, n in counts.items()}, 1)
    for name in algorithm.shared:
        want = sum(counts[c] * arrays[c][name].astype(np.float64) for c in counts) / sum(counts.values())
        np.testing.assert_allclose(new["params"][name], want, rtol=1e-6)
    for name in algorithm.personal:  # the server's starting A is untouched
        np.testing.assert_array_equal(new["params"][name], state["params"][name])
    assert new["seen"] == sorted(counts)


@pytest.mark.parametrize("batched", [True, False])
def test_one_round_equals_a_centralised_sgd_step_on_the_pooled_data(batched):
    problem = ProblemConfig(d1=6, d2=4, users=3, k=2, n_train=8, n_test=10)
    truth, train, _ = generate(problem, 0)
    counts = (5, 3, 8)  # unequal counts: the average is weighted by them
    keep = torch.cat([torch.nonzero(train.users == u).flatten()[:c] for u, c in enumerate(counts)])
    train = train[keep]
    data = user_data(train, train, problem.users)
    lr = 0.3
    algorithm = pshare(partial(model_for, truth, 2), 1, lr, "sgd", 0)
    state = algorithm.init(Seeds(0))
    g = torch.Generator().manual_seed(1)
    b0 = torch.randn(6, 2, generator=g)
    a0 = torch.randn(3, 2, 4, generator=g)  # personal factors already apart, so both factors get gradients
    state["params"]["f.0.B"] = b0.numpy()
    clients = {cid: ClientContext(cid, d, {"f.0.A": a0[d["user"]].numpy().copy()}) for cid, d in data.items()}
    messages = algorithm.configure(state, 1, list(clients))
    if batched:
        replies = algorithm.client_update_many(messages, clients)
    else:
        replies = {cid: algorithm.client_update(m, clients[cid]) for cid, m in messages.items()}
    new = algorithm.aggregate(state, replies, 1)

    net = model_for(truth, 2)  # centralised: per-user A, shared B, one SGD step on the pooled mean loss
    layer = lora_layers(net)["f.0"]
    configure(layer, "user", "shared", 3)
    with torch.no_grad():
        layer.A.copy_(a0)
        layer.B.copy_(b0)
    pair_loss(net, train).backward()
    torch.testing.assert_close(torch.from_numpy(new["params"]["f.0.B"]), b0 - lr * layer.B.grad, rtol=1e-5, atol=1e-6)
    n = len(train)
    for cid, client in clients.items():  # the pooled loss weighs user u's own loss by n_u / n
        u = data[cid]["user"]
        step = torch.from_numpy(client.state["f.0.A"]) - a0[u]
        torch.testing.assert_close(step * counts[u] / n, -lr * layer.A.grad[u], rtol=1e-5, atol=1e-6)
        assert step.abs().max() > 0


def test_fedavg_lora_sends_both_factors_and_local_sends_none():
    _, data, model_fn = setup()
    spy, result = run(fedavg_lora(model_fn, data, 2, 0.05), data, rounds=2)
    names = {f"{n}.{f}" for n in lora_layers(model_fn()) for f in "AB"}
    assert all(set(m) == names for m in all_messages(spy))
    assert all(c.state == {} for c in result.clients.values())
    spy, result = run(LocalLoRA(RoutedLoRA(model_fn, LocalSteps(2, 0.05))), data, rounds=2)
    assert all(len(m) == 0 for m in all_messages(spy))
    trained = [c.state for c in result.clients.values() if c.state]
    assert trained and all(set(s) == names for s in trained)
    assert not np.array_equal(trained[0]["f.1.A"], trained[1]["f.1.A"])  # independent draws per user


def test_warm_up_rounds_are_fedavg_then_the_global_a_is_handed_over_once():
    _, data, model_fn = setup()
    spy, result = run(pshare(model_fn, 2, 0.05, global_rounds=2), data, rounds=4, fraction=1.0)
    keys = [[sorted(m) for m in batch.values()] for batch in spy.down]
    up_keys = [[sorted(m) for m in batch.values()] for batch in spy.up]
    both, b_only = sorted(["f.0.A", "f.0.B", "f.1.A", "f.1.B"]), ["f.0.B", "f.1.B"]
    assert keys == [[both] * 4, [both] * 4, [both] * 4, [b_only] * 4]  # round 3 hands the averaged A over once
    assert up_keys == [[both] * 4, [both] * 4, [b_only] * 4, [b_only] * 4]
    handed = result.state["params"]["f.1.A"]  # the server's A stopped changing after round 2
    assert all(np.array_equal(m["f.1.A"], handed) for m in spy.down[2].values())
    assert all(s == {} for s in spy.before[2].values()) and all(s for s in spy.before[3].values())
    assert all(set(c.state) == {"f.0.A", "f.1.A"} for c in result.clients.values())


def test_same_seed_identical_results_and_batched_equals_one_by_one():
    _, data, model_fn = setup()
    runs = [simulate(pshare(model_fn, 3, 0.05, "adam", 5), data, 3, 7, 0.75, progress=False) for _ in range(2)]
    looped = run(pshare(model_fn, 3, 0.05, "adam", 5), data, 3, 0.75, False, 7)[1]
    a, b = runs
    assert a.metrics == b.metrics and a.ledger.rows == b.ledger.rows == looped.ledger.rows
    for name in a.state["params"]:
        np.testing.assert_array_equal(a.state["params"][name], b.state["params"][name])
        np.testing.assert_allclose(looped.state["params"][name], a.state["params"][name], atol=1e-5)
    for cid in a.clients:
        for name, value in a.clients[cid].state.items():
            np.testing.assert_array_equal(value, b.clients[cid].state[name])
            np.testing.assert_allclose(looped.clients[cid].state[name], value, atol=1e-5)


def test_fedavg_lora_trains_its_clients_in_one_computation_like_one_by_one():
    truth, data, model_fn = setup()
    batched = simulate(fedavg_lora(model_fn, data, 3, 0.05, "adam", 5), data, 3, 7, 0.75, progress=False)
    looped = run(fedavg_lora(model_fn, data, 3, 0.05, "adam", 5), data, 3, 0.75, False, 7)[1]
    assert batched.ledger.rows == looped.ledger.rows
    for name, value in batched.state.items():
        np.testing.assert_allclose(looped.state[name], value, atol=1e-5)
    assert batched.metrics[-1]["accuracy"] == pytest.approx(looped.metrics[-1]["accuracy"], abs=0.02)
    trainer = RoutedLoRA(model_fn, LocalSteps(), tests=[d["test"] for d in data.values()])
    central = evaluate(trainer.assemble(batched.state), truth, generate(SMALL, 0)[2])
    assert trainer.evaluate(batched.state)["accuracy"] == pytest.approx(central["accuracy"], abs=1e-12)


def test_the_trainer_keeps_nothing_between_calls():
    _, data, model_fn = setup()
    trainer = RoutedLoRA(model_fn, LocalSteps(3, 0.05))
    start = trainer.initial_params(Seeds(0))
    train = data["user000"]["train"]
    first = trainer.fit(start, train, torch.Generator().manual_seed(0), 0.05)
    trainer.fit(first, data["user001"]["train"], torch.Generator().manual_seed(1), 0.05)  # in between: another job
    again = trainer.fit(start, train, torch.Generator().manual_seed(0), 0.05)
    assert all(np.array_equal(first[n], again[n]) for n in first)


def test_evaluate_equals_the_centralised_metrics_of_the_assembled_model():
    truth, data, model_fn = setup()
    algorithm = pshare(model_fn, 3, 0.05)
    result = simulate(algorithm, data, 3, 0, 0.5, progress=False)
    test = generate(SMALL, 0)[2]
    central = evaluate(algorithm.assemble(result.state, result.clients, 3), truth, test)
    assert result.metrics[-1]["accuracy"] == pytest.approx(central["accuracy"], abs=1e-12)


@pytest.mark.flower
def test_flower_runs_federated_pshare_like_the_simulator():
    pytest.importorskip("flwr")
    pytest.importorskip("ray")
    from collabalign.federation.flower import run_flower_simulation

    _, data, model_fn = setup()
    algorithm = pshare(model_fn, 3, 0.05)
    sim = simulate(algorithm, data, 3, 11, 0.5, progress=False)
    flower = run_flower_simulation(algorithm, data, 3, 11, 0.5)
    assert flower.ledger.rows == sim.ledger.rows
    for name in sim.state["params"]:  # the shared B (and the untouched starting A) agree across the two paths
        np.testing.assert_allclose(flower.state["params"][name], sim.state["params"][name], atol=1e-5)
    assert flower.state["seen"] == sim.state["seen"]
    assert all(c.state == {} for c in flower.clients.values())  # the personal factors stayed on the Flower nodes
    assert [m.keys() for m in flower.metrics] == [m.keys() for m in sim.metrics]  # every node answered
    for a, b in zip(sim.metrics, flower.metrics, strict=True):  # evaluated on the nodes, with their own A_i
        assert b == pytest.approx(a, abs=1e-6)


def test_fit_many_equals_one_client_after_another_in_float64():
    """Clients of 12, 7 and 3 pairs, Adam and plain SGD: the stacked computation against `fit` per client."""
    _, data, model_fn = setup()
    double = [d["train"] for d in data.values()][:3]
    double = [Prefs(d.users, d.chosen.double(), d.rejected.double())[:n] for d, n in zip(double, (12, 7, 3),
                                                                                      strict=True)]
    for optimizer in ("adam", "sgd"):
        trainer = RoutedLoRA(lambda: model_fn().double(), LocalSteps(steps=6, lr=0.05, batch_size=4,
                                                                     optimizer=optimizer))
        gen = torch.Generator().manual_seed(0)
        starts = [{n: v + 0.1 * torch.randn(v.shape, generator=gen, dtype=torch.float64).numpy()
                   for n, v in trainer.start(torch.Generator().manual_seed(1)).items()} for _ in double]
        gens = lambda: [torch.Generator().manual_seed(10 + i) for i in range(len(double))]  # noqa: E731
        one_by_one = [trainer.fit(s, d, g, 0.05) for s, d, g in zip(starts, double, gens(), strict=True)]
        many = trainer.fit_many(starts, double, gens(), 0.05)
        diff = max(float(np.abs(a[n] - b[n]).max()) for a, b in zip(many, one_by_one, strict=True) for n in a)
        assert diff < 1e-10
        assert max(float(np.abs(a[n] - s[n]).max()) for a, s in zip(many, starts, strict=True) for n in a) > 1e-3


def test_a_server_optimiser_steps_the_shared_parameters_only_from_their_moments():
    from collabalign.federation.server_opt import ServerOptimizer

    _, _, model_fn = setup()
    plain = pshare(model_fn)
    half = pshare(model_fn, server=ServerOptimizer(rule="fedavgm", lr=0.5, beta1=0.5))
    state = half.init(Seeds(0))
    assert "moments" not in plain.init(Seeds(0))  # plain FedAvg keeps no moments
    shared = {n: state["params"][n] for n in half.shared}
    for rnd, change in ((1, 1.0), (2, 2.0)):  # every client moves every shared parameter by `change` from the server's
        replies = {cid: Message({n: (state["params"][n] + change).astype(v.dtype) for n, v in shared.items()},
                                {"n": 3}) for cid in ("u0", "u1")}
        state = half.aggregate(state, replies, rnd)
    for n, x in shared.items():  # FedAvgM: v1 = 1, x1 = x + 0.5; v2 = 0.5 v1 + 2 = 2.5, x2 = x1 + 1.25 (by hand)
        np.testing.assert_allclose(state["params"][n], x + 0.5 + 1.25, rtol=0, atol=1e-6)
    for n in half.personal:  # never sent: never stepped, their moments untouched
        np.testing.assert_array_equal(state["moments"]["v"][n], 0)
