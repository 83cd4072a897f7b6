"""Variant A's bandit (spec §8.1): the world's shapes, labels and determinism per seed, every baseline moving
held-out A_PL the way its construction says, meta-training lowering the outer loss, the hypergradient check, and
bad input."""

import numpy as np
import pytest
import torch

from collabalign.experiments.meta_reward.problems.bandit import (
    BanditSettings,
    BanditWorld,
    Rows,
    check_hypergradient,
    heldout_metrics,
    joint_eff,
    meta_train,
    minibatch_counts,
    rwr,
    sft,
    split_eff,
    validation,
)
from collabalign.experiments.meta_reward.problems.bandit.baselines import dpo, fit_bt, hpl, ppo

ST = BanditSettings(test_prompts=200, sft_steps=200, baseline_steps=150, test_steps=100, inner_steps=10)
F64 = torch.float64


def rngs(seeds, offset=0):
    return [np.random.default_rng(100 + offset + s) for s in range(seeds)]


@pytest.fixture(scope="module")
def world():
    return BanditWorld.generate(rngs(3), ST)


@pytest.fixture(scope="module")
def theta_sft(world):
    return sft(world, ST)


def held_out_apl(world, eff, rows):
    return heldout_metrics(world, eff, rows, [1.0])["apl"]


def sft_apl(world, theta_sft, rows):
    return held_out_apl(world, joint_eff(theta_sft[:, rows.sh.long()], rows.sh), rows)


def test_world_shapes_labels_and_features(world):
    S, N, V = 3, 4, 8
    assert world.fine.F.shape == (S, N, 60, V, 12) and world.fine.response.shape == (S, N, 180)
    assert torch.all(world.fine.counts.sum(-1) == 3)
    assert world.pairs.F.shape == (S, N, 80, V, 12) and world.test.F.shape == (S, N, 200, V, 12)
    assert world.val.valid.shape == (S, N, 40)
    assert torch.allclose(world.u_star[:, :4].norm(dim=-1), torch.full((S,), 2.0, dtype=F64))
    assert torch.all(world.u_star[:, 4:] == 0)
    for p in (world.pairs, world.val, world.test):
        assert torch.all(p.valid[p.chosen == p.rejected] == 0) and torch.all(p.valid[p.chosen != p.rejected] == 1)
        chosen, rejected = (torch.take_along_dim(p.F, y[..., None, None], -2)[..., 0, :]
                            for y in (p.chosen, p.rejected))
        assert torch.allclose(p.dF, chosen - rejected)
        assert torch.allclose(p.rstar, torch.einsum("snpvk,sk->snpv", p.F, world.u_star))
    ex = world.fine.fex[0, 1, 7]  # example 7 = prompt 2's second response
    assert torch.equal(ex, world.fine.F[0, 1, 2, world.fine.response[0, 1, 7]])
    # Bradley-Terry labels from r*: the preferred response has the higher true reward most of the time
    r = world.test.rstar
    higher = (torch.take_along_dim(r, world.test.chosen[..., None], -1) >
              torch.take_along_dim(r, world.test.rejected[..., None], -1))[..., 0].to(F64)
    assert (higher * world.test.valid).sum() / world.test.valid.sum() > 0.65


def test_world_is_deterministic_per_seed(world):
    again = BanditWorld.generate(rngs(3), ST)
    assert torch.equal(again.fine.F, world.fine.F) and torch.equal(again.test.chosen, world.test.chosen)
    alone = BanditWorld.generate([np.random.default_rng(101)], ST)  # seed 1 alone = seed 1 of the stack
    assert torch.equal(alone.pairs.F[0], world.pairs.F[1]) and torch.equal(alone.u_star[0], world.u_star[1])
    assert not torch.equal(world.fine.F[0], world.fine.F[1])


def test_the_block_size_sets_the_feature_length_of_every_stage():
    st = BanditSettings(block=2, sft_prompts=12, pl_prompts=10, val_prompts=6, test_prompts=10, sft_steps=5,
                        inner_batch=8, inner_steps=2, outer_steps=2, eval_every=1, outer_batch=4)
    small = BanditWorld.generate(rngs(1), st)
    assert small.features == 6 and small.fine.F.shape[-1] == 6 and small.u_star[0, 2:].abs().sum() == 0
    theta = sft(small, st)
    assert theta.shape == (1, 2, 5, 6)
    rows = Rows.grid([0], [0, 1], [1.0], st.n_dom)
    meta = meta_train(small, theta, rows, st, torch.Generator().manual_seed(0))
    assert meta.phi.shape == (1, 2, 6) and torch.isfinite(meta.phi).all()
    assert fit_bt(small, torch.tensor([0]), st).shape == (1, 1, 6)


def test_sft_data_lean_to_worse_responses_so_sft_is_below_chance(world, theta_sft):
    rows = Rows.grid([0, 1, 2, 3], [0], [1.0], 4)
    assert sft_apl(world, theta_sft, rows).mean() < 0.5


def test_rwr_with_the_true_or_the_bt_reward_beats_sft(world, theta_sft):
    rows = Rows.grid([0, 1], [0], [1.0], 4)
    phi_bt = fit_bt(world, torch.tensor([0, 1]), ST)
    cos = torch.nn.functional.cosine_similarity(phi_bt, world.u_star[:, None].expand_as(phi_bt), dim=-1)
    assert cos.min() > 0.7  # the BT reward recovers the preference direction
    phis = torch.cat([world.u_star[:, None].expand(-1, 2, -1), phi_bt], 1)
    both = rows.repeat(2)
    counts = minibatch_counts(torch.Generator().manual_seed(0), (3, 4, ST.test_steps), 180, ST.inner_batch)
    best, kept = rwr(world, theta_sft[:, both.sh.long()], phis, both, ST, counts, keep=(ST.inner_steps,))
    apl = held_out_apl(world, split_eff(best, both.sh), both)
    base = sft_apl(world, theta_sft, both)
    assert (apl - base).mean() > 0.15  # oracle and BT+RWR both well above SFT
    assert (apl[:, :2] - base[:, :2]).mean() > 0.15
    matched = held_out_apl(world, split_eff(kept[ST.inner_steps], both.sh), both)
    assert (matched - base).mean() > 0.15
    # a zero reward (w = 1) is plain fine-tuning on the domain's own data: it does not learn the preferences
    best0, _ = rwr(world, theta_sft[:, rows.sh.long()], torch.zeros(3, 2, 12, dtype=F64), rows, ST, counts)
    assert (held_out_apl(world, split_eff(best0, rows.sh), rows) - sft_apl(world, theta_sft, rows)).abs().mean() < 0.05


def test_policy_baselines_move_only_what_their_parameters_reach(world, theta_sft):
    phi_bt = fit_bt(world, torch.tensor([0, 1]), ST)
    for sh in (0, 1):
        rows = Rows.grid([0, 1], [sh], [1.0], 4)
        base = sft_apl(world, theta_sft, rows)
        tr = ppo(world, theta_sft, phi_bt, rows, rows.train_mask(4), ST)
        tr_te = ppo(world, theta_sft, phi_bt, rows, torch.ones(2, 4, dtype=F64), ST)
        direct = {"DPO": dpo(world, theta_sft, rows, ST), "HPL": hpl(world, theta_sft, rows, ST)}
        apl = {name: held_out_apl(world, joint_eff(t, rows.sh), rows)
               for name, t in {"PPO(TR)": tr, "PPO(TR+TE)": tr_te, **direct}.items()}
        assert (apl["PPO(TR+TE)"] - base).mean() > 0.15  # acts on the held-out prompts
        for name, theta in {"PPO(TR)": tr, **direct}.items():
            if sh == 0:  # no shared parameters: the held-out block stays at θ_SFT exactly
                for m, h in enumerate(rows.fold.tolist()):
                    assert torch.equal(theta[:, m, 1 + h], theta_sft[:, 0, 1 + h]), name
                assert torch.equal(apl[name], base), name
            else:  # the shared block carries training-domain preferences to the held-out domain
                assert (apl[name] - base).mean() > 0.1, name
        if sh == 0:  # on the training domains DPO and HPL do learn (validation pairs were not trained on)
            for name, theta in direct.items():
                val, _ = validation(world, joint_eff(theta, rows.sh), rows)
                sft_val, _ = validation(world, joint_eff(theta_sft[:, rows.sh.long()], rows.sh), rows)
                assert (val - sft_val).mean() > 0.1, name


def test_meta_training_lowers_the_outer_loss_and_is_deterministic(world, theta_sft):
    st = ST.model_copy(update={"outer_steps": 60, "eval_every": 20})
    rows = Rows.grid([0], [0], [1.0], 4)
    run = meta_train(world, theta_sft, rows, st, torch.Generator().manual_seed(0))
    assert run.outer_loss.shape == (60, 3, 1) and run.eval_steps == [0, 20, 40, 60]
    assert run.outer_loss[-20:].mean() < run.outer_loss[:20].mean() - 0.05
    assert run.val_apl[-1].mean() > run.val_apl[0].mean()
    assert torch.all(run.skipped == 0)
    cos = torch.nn.functional.cosine_similarity(run.phi_last[:, 0], world.u_star, dim=-1)
    assert cos.mean() > 0.5  # the meta-RM turns towards the preference direction without seeing a label directly
    again = meta_train(world, theta_sft, rows, st, torch.Generator().manual_seed(0))
    assert torch.equal(again.phi, run.phi) and torch.equal(again.outer_loss, run.outer_loss)
    other = meta_train(world, theta_sft, rows, st, torch.Generator().manual_seed(1))
    assert not torch.equal(other.phi_last, run.phi_last)


def test_hypergradient_check_on_the_bandit(world, theta_sft):
    check = check_hypergradient(world, theta_sft, 2, ST, torch.Generator().manual_seed(0))
    assert check["relative_error"] <= 1e-6 and check["max_abs_gradient"] > 1e-3
    assert check["first_order_relative_difference"] > 1e-2
    assert check["paper_eq13_relative_error"] > 0.5


@pytest.mark.parametrize("kwargs, message", [
    ({"folds": [4], "sh_values": [0], "betas": [1.0]}, "held-out domain 4"),
    ({"folds": [-1], "sh_values": [0], "betas": [1.0]}, "held-out domain -1"),
    ({"folds": [0], "sh_values": [2], "betas": [1.0]}, "s_h must be 0 or 1"),
    ({"folds": [0], "sh_values": [0], "betas": [0.0]}, "β must be > 0"),
    ({"folds": [0], "sh_values": [0], "betas": [-2.0]}, "β must be > 0"),
])
def test_bad_rows_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Rows.grid(kwargs["folds"], kwargs["sh_values"], kwargs["betas"], 4)


def test_bad_settings_are_rejected(world, theta_sft):
    for bad in ({"inner_steps": 0}, {"alpha": 0.0}, {"inner_batch": 181}, {"n_dom": 1}):
        with pytest.raises(ValueError):
            BanditSettings(**bad)
    with pytest.raises(ValueError, match="held-out domain 7"):
        check_hypergradient(world, theta_sft, 7, ST, torch.Generator())
