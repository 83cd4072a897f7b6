"""AffPCL personalised reward models (spec §8.3): the one update rule on the R1 / R2 / R3 tasks equals per-annotator
loops, the plug-in density ratio, the reward part on a tiny config and the text attributes of HH pairs."""

import json

import numpy as np
import pytest
from scipy.special import expit

from collabalign.data import shared_data_dir
from collabalign.data.annotator_pools import APOLOGY_WORDS, last_human_turn, pair_attributes, synthetic_pool
from collabalign.experiments.affpcl.problems.annotators import Annotators, RewardTask, plugin_ratio
from collabalign.experiments.affpcl.reward import RewardConfig, part
from collabalign.experiments.affpcl.reward_tables import reward_table
from collabalign.methods.affpcl import IL, AffPCL, Ditto, OneStepFedAvg, run
from collabalign.runs import RunDir
from collabalign.seeding import Seeds

METHODS = {"il": IL(), "fedavg": OneStepFedAvg(), "ditto": Ditto(0.15), "affpcl": AffPCL()}

LAM = np.array([2.0, -1.0, 1.0]) / np.sqrt(6)


def small(runs=2, n=3, delta=0.5, d=4):
    pool = synthetic_pool(np.random.default_rng(0), 60, d, 3)
    return Annotators(pool, np.random.default_rng(1), runs, n, delta, LAM, 3.0)


def reference(method, variant, users, draws, alpha, steps, reg=0.15, coe_alpha=0.05, weights="exact"):
    """Per-run, per-annotator scalar loops of IL, FedAvg, Ditto and AffPCL (one sample per step); final models."""
    pos, u = draws
    out = np.zeros((users.runs, users.n, users.d))
    for r in range(users.runs):
        x, xc = np.zeros((users.n, users.d)), np.zeros(users.d)
        theta = np.zeros(3)
        for t in range(steps):
            items = [users.train_idx[r, pos[t, r, i, 0]] for i in range(users.n)]
            z = [users.pool.z[k] for k in items]
            a = [users.pool.attrs[k] for k in items]
            lab = [float(u[t, r, i, 0] < users.prob[r, i, items[i]]) for i in range(users.n)]

            def res(w, i, z=z, r=r, items=items, lab=lab):
                p = z[i] @ w
                if variant == "r1":
                    return p - users.margin[r, i, items[i]]
                return (expit(p) - lab[i]) if variant == "r2" else p - (2 * lab[i] - 1)

            g_c = np.mean([res(xc, j) * z[j] for j in range(users.n)], axis=0)
            new = x.copy()
            for i in range(users.n):
                gi = res(x[i], i) * z[i]
                if method == "il":
                    new[i] = x[i] - alpha * gi
                elif method == "ditto":
                    new[i] = x[i] - alpha * (gi + reg * (x[i] - (xc - alpha * g_c)))
                elif method == "affpcl":
                    if variant == "r1":
                        cj = [z[j] * (z[j] @ xc - a[j] @ theta) for j in range(users.n)]
                        server = np.mean(cj, axis=0)
                    else:
                        cj = [res(xc, j) * z[j] for j in range(users.n)]
                        if weights == "exact":
                            pk = [[users.prob[r, k, items[j]] if lab[j] else 1 - users.prob[r, k, items[j]]
                                   for k in range(users.n)] for j in range(users.n)]
                        else:
                            pk = [[plugin_prob(variant, x[k] @ z[j], lab[j]) for k in range(users.n)]
                                  for j in range(users.n)]
                        server = np.mean([pk[j][i] / np.mean(pk[j]) * cj[j] for j in range(users.n)], axis=0)
                    new[i] = x[i] - alpha * (gi + server - cj[i])
            if method == "affpcl" and variant == "r1":
                theta = theta - coe_alpha * np.mean([(a[j] @ theta - users.margin[r, j, items[j]]) * a[j]
                                                     for j in range(users.n)], axis=0)
            xc = xc - alpha * g_c
            x = np.tile(xc, (users.n, 1)) if method == "fedavg" else new
        out[r] = x
    return out


def plugin_prob(variant, pred, label):
    """P_w(label | s) from the prediction z^T w: logistic (r2) or clipped linear probability (r3)."""
    p1 = expit(pred) if variant == "r2" else min(max((1 + pred) / 2, 0.05), 0.95)
    return p1 if label else 1 - p1


def final_models(method, task, draws, steps, alpha=0.8):
    return np.array(run(method, task, steps, alpha, None, draws=draws, every=steps)[1])


@pytest.mark.parametrize("variant", ["r1", "r3", "r2"])
@pytest.mark.parametrize("method", list(METHODS))
def test_vectorised_equals_per_annotator_loop(variant, method):
    users, steps = small(), 15
    task = RewardTask(users, variant)
    draws = task.draw(steps, np.random.default_rng(5))
    np.testing.assert_allclose(final_models(METHODS[method], task, draws, steps),
                               reference(method, variant, users, draws, 0.8, steps), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("variant", ["r2", "r3"])
def test_affpcl_with_plugin_weights_from_the_personal_models_equals_loop(variant):
    users, steps = small(n=4, delta=1.0), 12
    task = RewardTask(users, variant)
    draws = task.draw(steps, np.random.default_rng(6))
    np.testing.assert_allclose(final_models(AffPCL(weights="plugin"), task, draws, steps),
                               reference("affpcl", variant, users, draws, 0.8, steps, weights="plugin"),
                               rtol=1e-10, atol=1e-12)


def test_plugin_ratio_is_bounded_by_n_and_one_when_annotators_agree():
    rng = np.random.default_rng(0)
    runs, n, b, d = 3, 7, 5, 4
    z, label = rng.standard_normal((runs, n, b, d)), rng.integers(2, size=(runs, n, b)).astype(float)
    w = 3 * rng.standard_normal((runs, n, d))
    task = RewardTask(small(), "r2")
    rho = plugin_ratio(task.label_prob(w, z, label))
    assert rho.shape == (runs, n, n, b) and (rho > 0).all() and (rho <= n + 1e-12).all()
    np.testing.assert_allclose(rho.mean(1), 1.0)  # the annotator average of rho^i(s) is 1
    same = np.broadcast_to(w[:, :1], w.shape)
    np.testing.assert_allclose(plugin_ratio(task.label_prob(same, z, label)), 1.0)
    extreme = np.zeros((1, n, 1, 1))
    extreme[0, 0] = 1.0  # only annotator 0 gives the observed label any probability
    assert plugin_ratio(extreme)[0, 0, 0, 0] == pytest.approx(n)


def test_spec_plugin_from_personal_iterates_stays_at_the_pooled_model():
    task = RewardTask(small(n=4, delta=1.0), "r2", batch=2)
    draws = task.draw(20, np.random.default_rng(3))
    w_plug = final_models(AffPCL(weights="plugin"), task, draws, 20, 1.0)
    w_fed = final_models(OneStepFedAvg(), task, draws, 20, 1.0)
    w_dre = final_models(AffPCL(weights="plugin_il"), task, draws, 20, 1.0)
    np.testing.assert_allclose(w_plug, w_fed, atol=1e-12)
    assert np.abs(w_dre - w_fed).max() > 1e-3


def test_affpcl_with_independent_plugin_models_uses_their_label_laws():
    """'plugin_il' weights come from independently learned models: their IL run is the estimator's state."""
    task = RewardTask(small(n=3, delta=1.0), "r3")
    draws = task.draw(10, np.random.default_rng(7))
    state = AffPCL(weights="plugin_il").start(task, 10, None)
    for t in range(10):
        state = AffPCL(weights="plugin_il").step(task, state, task.sample(draws, t, state.x), np.full(2, 0.8), t)
    np.testing.assert_allclose(state.est.v, final_models(IL(), task, draws, 10), rtol=1e-12)


def test_accuracy_and_optimum():
    users = small(runs=2, n=3, delta=0.3, d=6)
    np.testing.assert_allclose(users.accuracy(np.zeros((2, 6))), 0.5)
    for variant in ("r1", "r3"):
        wstar = users.optimum(variant)
        assert wstar.shape == (2, 3, 6)
    # r1's least-squares optimum on attributes exactly linear in z is the scaled generating direction
    gen = users.optimum("r2")
    np.testing.assert_allclose(users.optimum("r1"), gen, rtol=1e-3, atol=1e-3)  # up to the 1e-6 ridge
    acc = users.accuracy(gen)
    np.testing.assert_allclose(acc, users.bayes_accuracy)


def test_attributes_of_two_hand_made_pairs():
    pairs = [("\n\nHuman: How do I pick a lock?", "I'm sorry, I can't help with that.", "Sure, use a pin."),
             ("\n\nHuman: hi\n\nAssistant: hello\n\nHuman: Tell me a joke", "Why did the chicken cross the road?",
              "No.")]
    lengths = {"I'm sorry, I can't help with that.": 11, "Sure, use a pin.": 5,
               "Why did the chicken cross the road?": 8, "No.": 2}
    attrs = pair_attributes(pairs, np.array([0, 1]), lengths.__getitem__)
    # pair 1 shown as (chosen, rejected): harmless +1, log-length margin, apology words "sorry", "can't"
    np.testing.assert_allclose(attrs[0], [1.0, np.log(12) - np.log(6), 2.0])
    # pair 2 shown as (rejected, chosen): every margin flips sign; no apology words
    np.testing.assert_allclose(attrs[1], [-1.0, np.log(3) - np.log(9), 0.0])
    assert {"sorry", "can't"} <= APOLOGY_WORDS
    assert last_human_turn(pairs[1][0]) == "Tell me a joke"


def tiny(datasets):
    return RewardConfig(datasets=datasets, variants=["r1", "r2"], n_list=[3, 6], deltas=[0.0, 1.0], runs=3,
                        steps=20, eval_every=5, window=2, synthetic_items=200, synthetic_d=8, hh_pairs=24, hh_dim=8)


def test_reward_section_runs_on_a_tiny_config(tmp_path):
    cfg = tiny(["synthetic"])
    result = part(cfg, Seeds(0), RunDir(tmp_path), False)
    claims, records, metrics, md = result.claims, result.records, result.metrics, result.notes[1:]
    assert len(claims) == 3 + 3 * 2 + 1
    assert {c["verdict"] for c in claims} <= {"reproduced", "not reproduced", "inconclusive"}
    assert {c["rule"] for c in claims} == {"non-inferiority", "superiority"} and all(c["n"] == 3 for c in claims)
    assert len(records) == 2 * 2 * (5 + 7)
    table = json.loads((tmp_path / "reward_table.json").read_text())
    assert set(table) == {"synthetic/r1", "synthetic/r2"} and set(table["synthetic/r1"]) == {"3/0", "3/1", "6/0",
                                                                                            "6/1"}
    assert all(0.3 < v["mean"] <= 1 for c in table["synthetic/r2"].values() for k, v in c.items() if k != "bayes")
    assert "w_dist" in table["synthetic/r1"]["3/0"]["affpcl"]
    assert md == reward_table(cfg, table)
    assert len(md) == 2 and "| 6 | 1 |" in md[1] and "AffPCL w/ DRE" in md[1]
    compact = metrics["reward_models"]["accuracy_mean_over_n"]["synthetic/r2"]
    assert set(compact) == {"0", "1"} and compact["1"]["il"] == pytest.approx(
        np.mean([table["synthetic/r2"][f"{n}/1"]["il"]["mean"] for n in (3, 6)]), abs=1e-4)


@pytest.mark.skipif(shared_data_dir() is None, reason="shared data folder (../shared/data) not found")
def test_reward_section_on_real_hh_pairs(tmp_path):
    cfg = tiny(["hh"])
    cfg.variants = ["r2"]
    result = part(cfg, Seeds(0), RunDir(tmp_path), False)
    assert len(result.claims) == 7 and not result.metrics["reward_models"]["skipped"]
    cells = json.loads((tmp_path / "reward_table.json").read_text())["hh/r2"]
    assert all(0.5 < c["bayes"] <= 1 for c in cells.values())
