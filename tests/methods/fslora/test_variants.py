"""The LoRA variants built for averaging (FFA-LoRA, FedSA-LoRA, FedEx-LoRA) and the server optimisers of the FSLoRA
family, each checked against what it must compute on the small teacher–student problem."""

import numpy as np
import pytest

from collabalign.federation import simulate
from collabalign.federation.protocol import ClientContext
from collabalign.federation.server_opt import ServerOptimizer
from collabalign.methods.fslora import FedExLoRA, FedSALoRA, ServerRule, fedlora, ffalora
from collabalign.seeding import Seeds

from .setup import RANK, small_problem
from .test_algorithms import one_round


@pytest.fixture(scope="module")
def setup():
    return small_problem()


def test_ffa_lora_keeps_a_at_its_start_and_sends_only_b(setup):
    problem, clients, _ = setup
    ids = list(clients)
    ffa, plain = ffalora(problem, ids, RANK), fedlora(problem, ids, RANK)
    start = ffa.init(Seeds(0))
    state, _, replies = one_round(ffa, clients)
    assert all(set(r) == {"hidden.dB", "head/head.weight", "head/head.bias"} for r in replies.values())
    assert all(np.abs(r["hidden.dB"]).max() > 0 for r in replies.values())
    new = ffa.aggregate(state, replies, 1)
    np.testing.assert_array_equal(new["hidden.A"], start["hidden.A"])
    # the averaged product is exact: s B̄ A = mean_i s B_i A, since A is the same on every device
    products = [ffa.scale * (state["hidden.B"] + r["hidden.dB"]) @ state["hidden.A"] for r in replies.values()]
    np.testing.assert_allclose(ffa.delta_weights(new)["hidden"], np.mean(products, axis=0), atol=1e-6)
    a, b = simulate(ffa, clients, 3, 0, progress=False), simulate(plain, clients, 3, 0, progress=False)
    np.testing.assert_array_equal(a.state["hidden.A"], start["hidden.A"])
    saved = (b.ledger.total("up") - a.ledger.total("up")) / (3 * len(ids))  # per reply
    a_bytes = RANK * problem.shapes["hidden"][1] * 4  # A's float32 update
    assert a_bytes <= saved < a_bytes + 128  # the array and its name and header in the message


def jobs_of(algorithm, clients, state, round_=1):
    """Each device's LocalJob for `round_`, its generators seeded as the simulator seeds them."""
    messages = algorithm.configure(state, round_, list(clients))
    jobs = []
    for cid, data in clients.items():
        context = ClientContext(cid, data)
        context.seed_round(Seeds(0), round_)
        jobs.append(algorithm.local_job(messages[cid], context))
    return jobs


@pytest.mark.parametrize("batched", [True, False])
def test_ffa_lora_trains_b_alone_in_the_batched_and_the_one_by_one_paths(setup, batched, monkeypatch):
    problem, clients, _ = setup
    ffa = ffalora(problem, list(clients), RANK)
    state = ffa.init(Seeds(0))
    jobs = jobs_of(ffa, clients, state)
    if batched:
        monkeypatch.setattr(type(problem), "local_train", None)  # the batched path must not fall back
        trained = problem.local_train_many(jobs)
    else:
        trained = [problem.local_train(*job) for job in jobs]
    for factors, _ in trained:
        np.testing.assert_array_equal(factors["hidden"][1], state["hidden.A"])
        assert np.abs(factors["hidden"][0]).max() > 0


def test_fedex_lora_merged_model_is_the_average_of_the_devices_merged_models(setup):
    problem, clients, _ = setup
    fedex = FedExLoRA(problem, list(clients), RANK)
    state = fedex.init(Seeds(0))
    for round_ in (1, 2):
        _, messages, replies = one_round(fedex, clients, round_, state)
        if round_ == 2:
            assert np.abs(state["hidden.base"]).max() > 0  # round 1 left a residual in the base
        merged = [state["hidden.base"] + fedex.scale * r["hidden.B"] @ r["hidden.A"] for r in replies.values()]
        state = fedex.aggregate(state, replies, round_)
        np.testing.assert_allclose(fedex.delta_weights(state)["hidden"], np.mean(merged, axis=0), atol=1e-6)
        np.testing.assert_allclose(state["hidden.B"], np.mean([r["hidden.B"] for r in replies.values()], 0),
                                   atol=1e-7)
        assert not any(k.endswith(".base") for r in replies.values() for k in r)  # the base is only downloaded


def test_fedex_lora_batched_devices_share_the_base_and_equal_one_by_one(setup, monkeypatch):
    problem, clients, _ = setup
    fedex = FedExLoRA(problem, list(clients), RANK)
    state, _, replies = one_round(fedex, clients)
    state = fedex.aggregate(state, replies, 1)
    assert np.abs(state["hidden.base"]).max() > 0
    sequential = [problem.local_train(*job) for job in jobs_of(fedex, clients, state, 2)]
    monkeypatch.setattr(type(problem), "local_train", None)  # one shared base: the batched path must not fall back
    batched = problem.local_train_many(jobs_of(fedex, clients, state, 2))
    for (fa, ha), (fb, hb) in zip(batched, sequential, strict=True):
        np.testing.assert_allclose(fa["hidden"][0], fb["hidden"][0], atol=1e-5)
        np.testing.assert_allclose(fa["hidden"][1], fb["hidden"][1], atol=1e-5)
        np.testing.assert_allclose(ha["head.weight"], hb["head.weight"], atol=1e-5)


def test_fedsa_lora_keeps_b_on_the_device_and_averages_a(setup):
    problem, clients, _ = setup
    fedsa = FedSALoRA(problem, list(clients), RANK)
    result = simulate(fedsa, clients, 2, 0, progress=False)
    own = {cid: c.state["hidden.B"] for cid, c in result.clients.items()}
    assert len(own) == len(clients) and not np.allclose(own["d0"], own["d1"])
    assert set(fedsa.configure(result.state, 3, list(clients))["d0"]) == {"hidden.A", "head/head.weight",
                                                                          "head/head.bias"}
    state, _, replies = one_round(fedsa, clients)
    assert all("hidden.B" not in r for r in replies.values())
    new = fedsa.aggregate(state, replies, 1)
    np.testing.assert_allclose(new["hidden.A"], np.mean([r["hidden.A"] for r in replies.values()], 0), atol=1e-7)
    last = result.metrics[-1]
    assert last["accuracy_min"] <= last["accuracy"] <= last["accuracy_max"]


def test_server_rule_steps_the_family_by_its_formula_with_moments_kept_in_the_state(setup):
    """FedAvgM at η = 0.5, β = 0.9 on Federated LoRA: x1 = x0 + η Δ1, x2 = x1 + η (β Δ1 + Δ2), Δ the plain average's
    change; the moments stay on the server."""
    problem, clients, _ = setup
    ids = list(clients)
    plain = fedlora(problem, ids, RANK)
    rule = ServerRule(ServerOptimizer(rule="fedavgm", lr=0.5, beta1=0.9))
    stepped = fedlora(problem, ids, RANK, server=rule)
    x0, _, replies = one_round(stepped, clients)
    x1 = stepped.aggregate(x0, replies, 1)
    d1 = {k: plain.aggregate(x0, replies, 1)[k].astype(np.float64) - x0[k] for k in ("hidden.B", "hidden.A")}
    for key, delta in d1.items():
        np.testing.assert_allclose(x1[key], x0[key] + 0.5 * delta, atol=1e-6)
    _, _, replies2 = one_round(stepped, clients, 2, x1)
    x2 = stepped.aggregate(x1, replies2, 2)
    for key in d1:
        d2 = plain.aggregate(x1, replies2, 2)[key].astype(np.float64) - x1[key]
        np.testing.assert_allclose(x2[key], x1[key] + 0.5 * (0.9 * d1[key] + d2), atol=1e-6)
    assert not any(k.startswith("opt/") for k in stepped.configure(x2, 3, ids)["d0"])


def test_server_rule_refuses_the_rules_that_correct_local_steps():
    with pytest.raises(ValueError, match="fedprox corrects"):
        ServerRule(ServerOptimizer(rule="fedprox"))


@pytest.mark.parametrize("make", [lambda p, ids: ffalora(p, ids, RANK), lambda p, ids: FedSALoRA(p, ids, RANK),
                                  lambda p, ids: FedExLoRA(p, ids, RANK)], ids=["ffa", "fedsa", "fedex"])
def test_variants_learn_and_repeat_exactly(setup, make):
    problem, clients, _ = setup
    a = simulate(make(problem, list(clients)), clients, 4, 1, progress=False)
    b = simulate(make(problem, list(clients)), clients, 4, 1, progress=False)
    assert a.metrics == b.metrics
    assert a.metrics[-1]["loss"] < a.metrics[0]["loss"]
