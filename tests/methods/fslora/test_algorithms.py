import copy
import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from collabalign.federation import simulate
from collabalign.federation.protocol import ClientContext
from collabalign.methods.fslora import FedStackLoRA, FlexLoRA, ServerAdam, fedlora, fslora, heterolora, sketch_indices
from collabalign.seeding import Seeds

from .setup import RANK, small_problem

HEAD_BYTES = 4 * (4 * 12 + 4)  # head.weight (classes x dim) + head.bias, float32


@pytest.fixture(scope="module")
def setup():
    return small_problem()


def one_round(algorithm, clients, round_=1, state=None):
    """(state, messages, replies) of one round run by hand, with clients seeded as the simulator does."""
    seeds = Seeds(0)
    state = algorithm.init(seeds) if state is None else state
    messages = algorithm.configure(state, round_, list(clients))
    contexts = {cid: ClientContext(cid, data) for cid, data in clients.items()}
    replies = {}
    for cid, msg in messages.items():
        contexts[cid].seed_round(seeds, round_)
        replies[cid] = algorithm.client_update(msg, contexts[cid])
    return state, messages, replies


def test_random_k_sketch_is_unbiased_by_exact_enumeration():
    r, k = 6, 2
    subsets = list(itertools.combinations(range(r), k))
    mats = [np.diag(np.isin(np.arange(r), s) * (r / k)) for s in subsets]
    np.testing.assert_allclose(np.mean(mats, axis=0), np.eye(r), atol=1e-12)
    np.testing.assert_allclose(np.mean([m @ m for m in mats], axis=0), (r / k) * np.eye(r), atol=1e-12)
    x = np.random.default_rng(0).normal(size=(5, r))
    assert np.mean([np.linalg.norm(x @ m) ** 2 for m in mats]) == pytest.approx((r / k) * np.linalg.norm(x) ** 2)


def test_sketch_draws_are_uniform_and_reproducible():
    seeds = Seeds(3)
    draws = np.stack([sketch_indices(seeds, t, "d0", "hidden", 8, 2) for t in range(4000)])
    assert all(len(set(row)) == 2 for row in draws[:50])
    freq = np.bincount(draws.ravel(), minlength=8) / len(draws)
    np.testing.assert_allclose(freq, 2 / 8, atol=0.02)  # each index is chosen with probability k/r
    assert np.array_equal(sketch_indices(seeds, 7, "d0", "hidden", 8, 2), sketch_indices(Seeds(3), 7, "d0",
                                                                                              "hidden", 8, 2))
    assert len({tuple(sketch_indices(seeds, 7, f"d{i}", "hidden", 8, 2)) for i in range(10)}) > 1


def test_one_fslora_round_equals_dense_masked_sgd_and_eq5():
    """Sub-block training (sliced) gives the same iterates as SGD on the full factors with S in the forward."""
    problem, clients, ranks = small_problem(dtype=torch.float64)
    algorithm = fslora(problem, ranks, RANK)
    state, messages, replies = one_round(algorithm, clients)
    layer = problem.layers["hidden"]
    expected_b, expected_a = np.zeros_like(state["hidden.B"], np.float64), np.zeros_like(state["hidden.A"], np.float64)
    seeds = Seeds(0)
    for cid, data in clients.items():
        idx = messages[cid]["hidden.idx"]
        mask = torch.zeros(RANK, dtype=torch.float64)
        mask[idx] = RANK / len(idx)
        B = torch.tensor(state["hidden.B"], dtype=torch.float64, requires_grad=True)
        A = torch.tensor(state["hidden.A"], dtype=torch.float64, requires_grad=True)
        head = {k[5:]: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in state.items()
                if k.startswith("head/")}
        ctx = ClientContext(cid, data)
        ctx.seed_round(seeds, 1)
        for _ in range(problem.sgd.steps):
            rows = torch.randint(len(data), (8,), generator=ctx.torch_rng)
            w = layer.base.weight.detach().clone()
            w = problem.w0["hidden"] + algorithm.scale * (B * mask) @ A
            h = torch.tanh(data.x[rows] @ w.T + layer.base.bias)
            loss = torch.nn.functional.cross_entropy(h @ head["head.weight"].T + head["head.bias"], data.y[rows])
            grads = torch.autograd.grad(loss, [B, A, *head.values()])
            outside = np.setdiff1d(np.arange(RANK), idx)
            assert not grads[0][:, outside].any() and not grads[1][outside].any()
            with torch.no_grad():
                for p, g in zip([B, A, *head.values()], grads, strict=True):
                    p -= problem.sgd.lr * g
        expected_b += B.detach().numpy() - state["hidden.B"]
        expected_a += A.detach().numpy() - state["hidden.A"]
    new = algorithm.aggregate(state, replies, 1)
    np.testing.assert_allclose(new["hidden.B"], state["hidden.B"] + expected_b / len(clients), atol=1e-6)
    np.testing.assert_allclose(new["hidden.A"], state["hidden.A"] + expected_a / len(clients), atol=1e-6)


def test_fedlora_is_fslora_with_full_rank_devices(setup):
    problem, clients, _ = setup
    full = {cid: RANK for cid in clients}
    a = simulate(fedlora(problem, list(clients), RANK), clients, rounds=2, seed=1, progress=False)
    b = simulate(fslora(problem, full, RANK, download="submatrix"), clients, rounds=2, seed=1, progress=False)
    assert a.metrics == b.metrics
    assert all(np.array_equal(a.state[k], b.state[k]) for k in a.state)


def test_heterolora_pads_updates_with_zeros_and_averages_over_all_devices(setup):
    problem, clients, ranks = setup
    algorithm = heterolora(problem, ranks, RANK)
    state, messages, replies = one_round(algorithm, clients)
    for cid, msg in messages.items():
        assert msg["hidden.B"].shape[1] == ranks[cid] and "hidden.idx" not in msg
        np.testing.assert_array_equal(msg["hidden.A"], state["hidden.A"][: ranks[cid]])
    new = algorithm.aggregate(state, replies, 1)
    for j in range(RANK):
        owners = [c for c in clients if ranks[c] > j]
        expected = sum(replies[c]["hidden.dB"][:, j] for c in owners) / len(clients) if owners else 0
        np.testing.assert_allclose(new["hidden.B"][:, j] - state["hidden.B"][:, j], expected, atol=1e-7)
    assert max(ranks.values()) < RANK and np.array_equal(new["hidden.A"][-1], state["hidden.A"][-1])


@pytest.mark.parametrize("sigma_split", ["B", "sqrt"])
def test_flexlora_hands_out_the_exact_update_when_device_rank_is_r(setup, sigma_split):
    problem, clients, _ = setup
    algorithm = FlexLoRA(problem, {cid: RANK for cid in clients}, RANK, sigma_split=sigma_split)
    state = algorithm.init(Seeds(0))
    rng = np.random.default_rng(0)
    state["hidden.dW"] = (rng.normal(size=(12, 5)) @ rng.normal(size=(5, 12))).astype(np.float32)  # rank 5 <= r
    msg = algorithm.configure(state, 2, ["d0"])["d0"]
    np.testing.assert_allclose(algorithm.scale * msg["hidden.B"] @ msg["hidden.A"], state["hidden.dW"], atol=1e-4)
    if sigma_split == "sqrt":  # balanced: both factors carry sqrt(Sigma / s), so their column/row norms agree
        np.testing.assert_allclose(np.linalg.norm(msg["hidden.B"], axis=0), np.linalg.norm(msg["hidden.A"], axis=1),
                                   rtol=1e-4)
    small = FlexLoRA(problem, {"d0": 2}, RANK, sigma_split=sigma_split).configure(state, 2, ["d0"])["d0"]
    u, s, vt = np.linalg.svd(state["hidden.dW"].astype(np.float64))
    np.testing.assert_allclose(algorithm.scale * small["hidden.B"] @ small["hidden.A"],
                               (u[:, :2] * s[:2]) @ vt[:2], atol=1e-4)  # best rank-2 approximation


def test_fedstack_merge_equals_the_mean_of_device_products_on_every_device(setup):
    problem, clients, ranks = setup
    algorithm = FedStackLoRA(problem, ranks, RANK)
    result = simulate(algorithm, clients, rounds=2, seed=0, progress=False)
    state = result.state
    s = algorithm.scale
    stacked = s * state["hidden.B_stack"] @ state["hidden.A_stack"]
    assert state["hidden.B_stack"].shape[1] == sum(ranks.values())
    # the devices have merged the round-1 stack; the server's D also holds round 2's
    for ctx in result.clients.values():
        np.testing.assert_allclose(ctx.state["hidden"] + stacked, state["hidden.D"], atol=1e-6)
    with pytest.raises(ValueError, match="every device"):
        algorithm.configure(state, 3, list(clients)[:2])


def expected_bytes(method, k, ks, m=12, n=12, r=RANK, rho=0.5):
    """§8.5: floats (and int32 indices) per device per round, times 4 bytes, plus the head both ways."""
    lora = {"fedlora": (r * (m + n), r * (m + n)),
            "fslora": (r * (m + n) + k, k * (m + n)),
            "fslora-submatrix": (k * (m + n) + k, k * (m + n)),
            "heterolora": (k * (m + n), k * (m + n)),
            "flexlora": (k * (m + n), k * (m + n)),
            "fedstack": (sum(ks) * (m + n), k * (m + n)),
            "fslora-topk": (r * (m + n) + k, 2 * (math.ceil(rho * k * m) + math.ceil(rho * k * n)))}[method]
    return 4 * lora[0] + HEAD_BYTES, 4 * lora[1] + HEAD_BYTES


@pytest.mark.parametrize("method", ["fedlora", "fslora", "fslora-submatrix", "heterolora", "flexlora", "fedstack",
                                    "fslora-topk"])
def test_message_bytes_follow_the_paper_formulas(setup, method):
    problem, clients, ranks = setup
    ids = list(clients)
    algorithm = {"fedlora": lambda: fedlora(problem, ids, RANK),
                 "fslora": lambda: fslora(problem, ranks, RANK),
                 "fslora-submatrix": lambda: fslora(problem, ranks, RANK, download="submatrix"),
                 "heterolora": lambda: heterolora(problem, ranks, RANK),
                 "flexlora": lambda: FlexLoRA(problem, ranks, RANK),
                 "fedstack": lambda: FedStackLoRA(problem, ranks, RANK),
                 "fslora-topk": lambda: fslora(problem, ranks, RANK, upload_top_k=0.5)}[method]()
    state, _, replies = one_round(algorithm, clients)
    state = algorithm.aggregate(state, replies, 1)
    _, messages, replies = one_round(algorithm, clients, round_=2, state=state)
    for cid in ids:
        k = RANK if method == "fedlora" else ranks[cid]
        down, up = expected_bytes(method, k, list(ranks.values()))
        assert (messages[cid].array_nbytes, replies[cid].array_nbytes) == (down, up)
        assert messages[cid].nbytes > messages[cid].array_nbytes  # + the safetensors header the ledger counts


def test_runs_are_deterministic(setup):
    problem, clients, ranks = setup
    a, b = (simulate(fslora(problem, ranks, RANK), clients, rounds=3, seed=4, progress=False) for _ in range(2))
    assert a.metrics == b.metrics and a.ledger.rows == b.ledger.rows


def test_server_adam_takes_a_bias_corrected_adam_step_on_the_averaged_update(setup):
    """The first Adam step moves every entry by lr * u / (|u| + eps) for the averaged update u (m / sqrt(v) at
    t = 1, bias-corrected: the sign, up to eps); the
    second uses the moments carried in the server state; nothing under opt/ is sent to devices."""
    problem, clients, ranks = setup
    adam = ServerAdam(lr=0.01)
    plain, with_adam = fslora(problem, ranks, RANK), fslora(problem, ranks, RANK, server=adam)
    ids = sorted(clients)
    state, _, replies = one_round(plain, clients)
    eq5, stepped = plain.aggregate(state, replies, 1), with_adam.aggregate(state, replies, 1)
    for key in ("hidden.B", "hidden.A", "head/head.weight"):
        update = (eq5[key] - state[key]).astype(np.float64)
        assert (np.abs(update) > 1e-4).any()
        np.testing.assert_allclose(stepped[key] - state[key], 0.01 * update / (np.abs(update) + 1e-8), atol=1e-6)
    assert stepped["opt/t"][0] == 1
    second = with_adam.aggregate(stepped, replies, 2)
    assert second["opt/t"][0] == 2 and not np.allclose(second["hidden.B"], stepped["hidden.B"])
    assert not any(k.startswith("opt/") for k in with_adam.configure(second, 3, ids)["d0"])


def test_momentum_changes_local_training_and_plain_sgd_is_momentum_zero(setup):
    problem, clients, ranks = setup
    algorithm = fslora(problem, ranks, RANK)

    plain_sgd = problem.sgd

    def upload(momentum):
        problem.sgd = replace(plain_sgd, momentum=momentum)
        return one_round(algorithm, clients)[2]["d0"]["hidden.dB"]
    plain, zero, heavy = upload(0.0), upload(0.0), upload(0.9)
    problem.sgd = plain_sgd
    np.testing.assert_array_equal(plain, zero)
    assert not np.allclose(plain, heavy)


def test_the_sketch_seed_lives_in_the_server_state_and_is_never_sent(setup):
    """configure reads the seed of the sketches from the state: an object that never ran `init` (as after a resume,
    or in another server process) draws the run's sketches; no message carries the seed."""
    problem, clients, ranks = setup
    ids = list(clients)
    state = fslora(problem, ranks, RANK).init(Seeds(7))
    messages = fslora(problem, ranks, RANK).configure(state, 3, ids)
    for cid in ids:
        expected = sketch_indices(Seeds(7), 3, cid, "hidden", RANK, ranks[cid])
        np.testing.assert_array_equal(messages[cid]["hidden.idx"], expected)
        assert not any(name.startswith("sketch/") for name in messages[cid])
    other = fslora(problem, ranks, RANK).configure(fslora(problem, ranks, RANK).init(Seeds(8)), 3, ids)
    assert any(not np.array_equal(messages[c]["hidden.idx"], other[c]["hidden.idx"]) for c in ids)


@pytest.mark.parametrize("method", ["fslora-adam", "heterolora", "flexlora", "fedstack"])
def test_no_algorithm_keeps_state_of_its_own_between_hook_calls(setup, method):
    """A run leaves every attribute of the algorithm object as it was (the shared problem is a workspace)."""
    problem, clients, ranks = setup
    algorithm = {"fslora-adam": lambda: fslora(problem, ranks, RANK, server=ServerAdam(0.01)),
                 "heterolora": lambda: heterolora(problem, ranks, RANK),
                 "flexlora": lambda: FlexLoRA(problem, ranks, RANK),
                 "fedstack": lambda: FedStackLoRA(problem, ranks, RANK)}[method]()

    def attributes():
        return {k: dict(vars(v)) if hasattr(v, "__dict__") else copy.deepcopy(v) for k, v in vars(algorithm).items()
                if k != "problem"}
    before = attributes()
    simulate(algorithm, clients, rounds=2, seed=3, progress=False)  # seed 3: not the seed of any default
    assert attributes() == before
