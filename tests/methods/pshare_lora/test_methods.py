"""P-ShareLoRA methods: routed gradients equal a per-user reference, schedules hit their step counts, Share Rep
freezes its bottom layers from the first step (its phased ablation after a global phase), Share Rep on the bilinear
problem learns one representation and a head per user, the norm projection holds."""

import pytest
import torch
import torch.nn.functional as F

from collabalign.experiments.pshare_lora.problems.synthetic import (
    ProblemConfig,
    RepresentationNet,
    TrainConfig,
    effective_delta,
    fit_model,
    generate,
    model_for,
    representation_model,
    true_reward,
)
from collabalign.lora import lora_layers, routed
from collabalign.methods.pshare_lora import configure, pair_loss, prepare, project_, schedule, train, user_deltas

SMALL = ProblemConfig(d1=6, d2=4, users=3, k=2, n_train=5, n_test=50)


def routed_setup(a_mode, b_mode, seed=0):
    truth, data, _ = generate(SMALL, seed)
    net = model_for(truth, 2).double()
    layer = lora_layers(net)["f.0"]
    configure(layer, a_mode, b_mode, SMALL.users)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # non-zero, different factors per user so every gradient path is exercised
        layer.A.copy_(torch.randn(layer.A.shape, generator=g, dtype=torch.float64))
        layer.B.copy_(torch.randn(layer.B.shape, generator=g, dtype=torch.float64))
    data.chosen, data.rejected = data.chosen.double(), data.rejected.double()
    return truth, net, layer, data


@pytest.mark.parametrize("a_mode,b_mode", [("user", "shared"), ("shared", "user"), ("user", "user")])
def test_mixed_batch_gradients_equal_a_per_user_loop_of_separate_modules(a_mode, b_mode):
    truth, net, layer, data = routed_setup(a_mode, b_mode)
    perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(1))  # users interleaved in the batch
    pair_loss(net, data[perm]).backward()
    grads = {}
    for user in range(SMALL.users):  # reference: one plain module per user, its own copies, summed by hand
        A = (layer.A[user] if layer.A.dim() == 3 else layer.A).detach().clone().requires_grad_()
        B = (layer.B[user] if layer.B.dim() == 3 else layer.B).detach().clone().requires_grad_()
        theta = truth.theta_init.double() + layer.scale * B @ A
        rows = data.users == user
        r_c = true_reward(theta[None], torch.zeros(int(rows.sum()), dtype=torch.long), data.chosen[rows])
        r_r = true_reward(theta[None], torch.zeros(int(rows.sum()), dtype=torch.long), data.rejected[rows])
        (-F.logsigmoid(r_c - r_r).sum() / len(data)).backward()
        grads[user] = (A.grad, B.grad)
    for name, i, mode in (("A", 0, a_mode), ("B", 1, b_mode)):
        got = getattr(layer, name).grad
        if mode == "shared":
            torch.testing.assert_close(got, sum(g[i] for g in grads.values()))
        else:
            torch.testing.assert_close(got, torch.stack([grads[u][i] for u in range(SMALL.users)]))


@pytest.mark.parametrize("linear", [False, True])
def test_si_g_wu_schedules_hit_their_step_counts(linear):
    lr = 0.03
    si, g, wu = (schedule(m, 1, 30, lr, linear) for m in ("pshare_si", "pshare_g", "pshare_wu"))
    assert [p.steps for p in si] == [30] and si[0].modes == (("user", "shared"),)
    assert [p.steps for p in g] == [20, 10] and g[0].modes == (("shared", "shared"),)
    assert [p.steps for p in wu] == [3, 27] and wu[1].modes == (("user", "shared"),)
    assert g[1].lr[0] == pytest.approx(lr / 3)  # spec §3.3: (G) fine-tunes at one third of the rate
    assert wu[1].lr[0] == pytest.approx(0.9 * lr if linear else lr)  # WU continues the same schedule
    assert all(p.lr[1] == pytest.approx(0.0) for p in (si[0], g[1], wu[1])) == linear
    for m in ("global", "local", "share_rep", "share_rep_same_head", "share_rep_phased", "share_a", "full"):
        assert sum(p.steps for p in schedule(m, 3, 30, lr, linear)) == 30  # the same budget for every method


@pytest.mark.parametrize("method,first", [("pshare_g", 20), ("pshare_wu", 3), ("pshare_si", 0)])
def test_training_takes_exactly_the_scheduled_steps_and_switches_factors(method, first):
    truth, data, _ = generate(SMALL, 0)
    net = model_for(truth, 2)
    g = torch.Generator().manual_seed(0)
    prepare(net, method, SMALL.users, g)
    phases = schedule(method, 1, 30, 0.02)
    layer = lora_layers(net)["f.0"]
    calls = []
    handle = layer.register_forward_hook(lambda m, i, o: calls.append((m.A.dim(), m.B.dim())))
    losses = train(net, data, phases, SMALL.users, 0, g)
    handle.remove()
    assert len(losses) == 30 and calls.count((2, 2)) == first and calls.count((3, 2)) == 30 - first
    assert not torch.allclose(layer.A[0], layer.A[1])  # personal factors moved apart


def test_share_rep_freezes_the_bottom_layers_from_the_first_step_and_personalises_the_top():
    truth, data, _ = generate(SMALL, 0)
    net = model_for(truth, 2, depth=3)  # floor(0.7 * 3) = 2 bottom layers frozen, 1 top personal
    g = torch.Generator().manual_seed(0)
    prepare(net, "share_rep", SMALL.users, g)
    layers = list(lora_layers(net).values())
    initial = [(m.A.detach().clone(), m.B.detach().clone()) for m in layers]
    phases = schedule("share_rep", 3, 30, 0.02)
    assert [p.steps for p in phases] == [30] and phases[0].lr == (0.02, 0.02)  # one phase, the whole budget
    train(net, data, phases, SMALL.users, 0, g)
    for m, (a, b) in zip(layers[:2], initial[:2], strict=True):  # never trained: the base map, the same for all
        assert m.A.dim() == 2 and not m.A.requires_grad and not m.B.requires_grad
        assert torch.equal(m.A, a) and torch.equal(m.B, b) and not b.any()
    top = layers[2]
    assert top.A.dim() == 3 and top.B.dim() == 3 and top.B.abs().sum() > 0
    assert not torch.allclose(top.A[0], top.A[1]) and not torch.allclose(top.B[0], top.B[1])


def test_phased_ablation_trains_every_layer_globally_then_freezes_the_bottom():
    truth, data, _ = generate(SMALL, 0)
    net = model_for(truth, 2, depth=3)  # floor(0.7 * 3) = 2 bottom layers shared and frozen, 1 top personal
    g = torch.Generator().manual_seed(0)
    prepare(net, "share_rep_phased", SMALL.users, g)
    phases = schedule("share_rep_phased", 3, 30, 0.02)
    assert [p.steps for p in phases] == [20, 10] and phases[1].lr[0] == pytest.approx(0.02 / 3)
    train(net, data, phases[:1], SMALL.users, 0, g)
    layers = list(lora_layers(net).values())
    before = [(m.A.detach().clone(), m.B.detach().clone()) for m in layers]
    assert all(b.abs().sum() > 0 for _, b in before)  # the shared phase trained every layer
    train(net, data, phases[1:], SMALL.users, 0, g)
    for m, (a, b) in zip(layers[:2], before[:2], strict=True):
        assert not m.A.requires_grad and not m.B.requires_grad and m.A.grad is None and m.B.grad is None
        assert torch.equal(m.A, a) and torch.equal(m.B, b)
    top = layers[2]
    assert top.A.dim() == 3 and top.B.dim() == 3 and not torch.allclose(top.B[0], top.B[1])


def test_share_rep_on_the_bilinear_problem_learns_one_representation_and_a_head_per_user():
    truth, data, test = generate(SMALL, 0)
    net, losses = fit_model(truth, data, SMALL, TrainConfig(steps=40), "share_rep", torch.Generator().manual_seed(0))
    fresh = representation_model(truth, SMALL.k)
    prepare(fresh, "share_rep", SMALL.users, torch.Generator().manual_seed(0))  # fit_model's initial factors
    layer = lora_layers(net)["score"]
    assert isinstance(net, RepresentationNet) and len(losses) == 40
    assert layer.A.shape == (SMALL.k, SMALL.d1 * SMALL.d2) and not torch.equal(layer.A, fresh.score.A)  # Psi: trained
    assert layer.B.shape == (SMALL.users, 1, SMALL.k) and not torch.allclose(layer.B[0], layer.B[1])  # omega_i
    delta = effective_delta(net, SMALL.users)
    with torch.no_grad():  # Delta Theta_i = reshape(Psi omega_i), and the model's reward is u^T Theta_i v
        torch.testing.assert_close(delta, (layer.B @ layer.A).reshape(SMALL.users, SMALL.d1, SMALL.d2))
        with routed(net, test.users):
            got = net(test.chosen)
    torch.testing.assert_close(got, true_reward(truth.theta_init + delta, test.users, test.chosen))


def test_same_head_variant_does_not_run_on_the_bilinear_problem():
    truth, data, _ = generate(SMALL, 0)
    with pytest.raises(ValueError, match="does not run on the bilinear problem"):
        fit_model(truth, data, SMALL, TrainConfig(steps=2), "share_rep_same_head", torch.Generator())


@pytest.mark.parametrize("a_mode,b_mode", [("user", "shared"), ("shared", "user"), ("shared", "shared")])
def test_projection_bounds_every_users_update(a_mode, b_mode):
    _, _, layer, _ = routed_setup(a_mode, b_mode)
    project_(layer, 0.5)
    assert user_deltas(layer).flatten(1).norm(dim=1).max() <= 0.5 + 1e-9


@pytest.mark.parametrize("batch_size", [0, 7])
def test_micro_batches_accumulate_the_same_steps(batch_size):
    truth, data, _ = generate(SMALL, 0)
    data.chosen, data.rejected = data.chosen.double(), data.rejected.double()
    states, losses = [], []
    for micro in (0, 2):
        net = model_for(truth, 2).double()
        g = torch.Generator().manual_seed(0)
        prepare(net, "pshare_si", SMALL.users, g)
        losses.append(train(net, data, schedule("pshare_si", 1, 12, 0.05), SMALL.users, batch_size, g,
                            micro_batch=micro))
        states.append({k: v.detach().clone() for k, v in net.state_dict().items()})
    assert losses[0] == pytest.approx(losses[1], rel=1e-9)
    for k in states[0]:
        torch.testing.assert_close(states[0][k], states[1][k])


def test_generator_knobs():
    exact, _, _ = generate(ProblemConfig(tail=0.0), 0)
    tailed, _, _ = generate(ProblemConfig(tail=1.0), 0)
    assert exact.diversity(2)["sigma_tail"] < 1e-8 < tailed.diversity(2)["sigma_tail"]
    agree, _, _ = generate(ProblemConfig(rho=1.0), 0)
    torch.testing.assert_close(agree.delta[0], agree.delta[1])  # rho = 1: one global reward
    decayed, _, _ = generate(ProblemConfig(spectrum_decay=0.25), 0)
    assert decayed.diversity(2)["nu"] < exact.diversity(2)["nu"]
    torch.testing.assert_close(exact.basis.T @ exact.basis, torch.eye(2))  # B° orthonormal


def test_mini_batches_cover_every_pair_once_per_epoch():
    from collabalign.methods.pshare_lora.train import batches

    stream = batches(10, 4, torch.Generator().manual_seed(0))
    epoch = [next(stream) for _ in range(3)]
    assert [len(b) for b in epoch] == [4, 4, 2] and sorted(torch.cat(epoch).tolist()) == list(range(10))
    assert next(batches(10, 0, torch.Generator())) == slice(0, 10)


def test_pairs_sorted_by_user_in_equal_blocks_route_blockwise():
    from collabalign.lora import Blocks
    from collabalign.methods.pshare_lora import Prefs

    x = torch.zeros(6, 2)
    assert Prefs(torch.tensor([0, 0, 1, 1, 2, 2]), x, x).blocks(3) == Blocks(3, repeats=2)
    assert Prefs(torch.tensor([0, 1, 0, 1, 2, 2]), x, x).blocks(3) is None  # not sorted
    assert Prefs(torch.tensor([0, 0, 1, 1, 1, 1]), x, x).blocks(2) is None  # unequal blocks
    assert Prefs(torch.tensor([0, 0, 1, 1, 1, 1]), x, x).blocks(3) is None  # a user missing
