"""The digits users (Fig. 2 substitute): sampling and exact test MSE, the one AffPCL update rule on them against a
per-run, per-user loop, and the paper's local-steps AffPCL and FedAvg against their own loop."""

import numpy as np
import pytest

from collabalign.data.digit_features import DigitFeatures
from collabalign.experiments.affpcl.problems.digits import DigitsUsers
from collabalign.methods.affpcl import IL, AffPCL, LocalAffPCL, LocalFedAvg, OneStepFedAvg, run


@pytest.fixture(scope="module")
def feats():
    return DigitFeatures(0, max_iter=60)


def test_digits_users_sample_their_class_mixtures_and_test_mse_is_exact(feats):
    users = DigitsUsers(feats, np.random.default_rng(0), 2, 4, delta_obj=0.6)
    cls, phi = users.classes_and_features(np.random.default_rng(1).uniform(size=(2, 4, 20000, 2)))
    freq = np.stack([(cls == c).mean(-1) for c in range(10)], -1)
    assert np.abs(freq - users.p).max() < 0.015
    rows = [np.flatnonzero((feats.phi == row).all(-1)) for row in phi[1, 2, :50]]
    assert all(feats.labels[r[0]] == c for r, c in zip(rows, cls[1, 2, :50], strict=True))
    assert np.allclose(np.einsum("rc,rnc->rn", users.p.mean(1), users.rho), 1.0)  # E_{mu^0} rho^i = 1
    x = np.random.default_rng(2).standard_normal((2, 4, feats.d)) * 0.1
    weights = users.p[..., feats.test_labels] / np.bincount(feats.test_labels, minlength=10)[feats.test_labels]
    pred = np.einsum("kd,rnd->rnk", feats.test_phi, x)
    brute = (weights * (pred - users.y[..., feats.test_labels]) ** 2).sum(-1)
    assert np.allclose(users.test_mse(x), brute)


def reference_affpcl(users: DigitsUsers, steps: int, alpha: float, u: np.ndarray, correct: bool) -> np.ndarray:
    """AffPCL with the oracle central label, one run and one user at a time; final personal models (R, n, d)."""
    out = np.zeros((users.runs, users.n, users.d))
    for r in range(users.runs):
        x, xc = np.zeros((users.n, users.d)), np.zeros(users.d)
        for t in range(steps):
            cls, phi = users.classes_and_features(u[t])
            y = [[users.y[r, i, c] for c in cls[r, i]] for i in range(users.n)]
            yc = [[users.y_central[c] for c in cls[r, j]] for j in range(users.n)]

            def direction(w, j, target, cls=cls, phi=phi, r=r):
                return np.mean([f * (f @ w - target[j][b]) for b, f in enumerate(phi[r, j])], axis=0)

            def corrected(i, cls=cls, phi=phi, r=r, yc=yc, xc=xc):
                terms = [users.rho[r, i, c] * f * (f @ xc - yc[j][b]) if correct else f * (f @ xc - yc[j][b])
                         for j in range(users.n) for b, (f, c) in enumerate(zip(phi[r, j], cls[r, j], strict=True))]
                return np.sum(terms, axis=0) / (users.n * users.batch)

            new = [x[i] - alpha * (direction(x[i], i, y) + corrected(i) - direction(xc, i, yc)) for i in range(users.n)]
            xc = xc - alpha * np.mean([direction(xc, j, y) for j in range(users.n)], axis=0)
            x = np.array(new)
        out[r] = x
    return out


@pytest.mark.parametrize("weights", ["exact", "none"])
def test_vectorised_affpcl_equals_per_user_loop(feats, weights):
    users = DigitsUsers(feats, np.random.default_rng(4), 2, 3, delta_obj=0.6, batch=4)
    u = users.draw(12, np.random.default_rng(5))
    _, final = run(AffPCL(central="oracle", weights=weights), users, 12, 1.0, None, draws=u, every=4)
    np.testing.assert_allclose(final, reference_affpcl(users, 12, 1.0, u, weights == "exact"), rtol=1e-10, atol=1e-12)


def test_digits_affpcl_with_one_user_is_independent_learning(feats):
    one = DigitsUsers(feats, np.random.default_rng(0), 2, 1, delta_obj=0.0, batch=4)
    il = run(IL(), one, 30, 1.0, np.random.default_rng(3), every=10)[0]
    for weights in ("exact", "none"):
        affpcl = run(AffPCL(central="oracle", weights=weights), one, 30, 1.0, np.random.default_rng(3), every=10)[0]
        assert np.allclose(affpcl, il)
    with pytest.raises(ValueError, match="oracle"):
        run(AffPCL(), one, 1, 1.0, np.random.default_rng(0))


def reference_local(users: DigitsUsers, steps: int, alpha: float, u: np.ndarray, local: int) -> tuple:
    """AffPCL with `local` local steps per round and no importance correction, and FedAvg's local SGD (its CDL), one
    run and one user at a time: the final personal models (R, n, d) and server models (R, d)."""
    xs, servers = np.zeros((users.runs, users.n, users.d)), np.zeros((users.runs, users.d))
    for r in range(users.runs):
        x, xc, copies = np.zeros((users.n, users.d)), np.zeros(users.d), np.zeros((users.n, users.d))
        for t in range(steps):
            cls, phi = users.classes_and_features(u[t])

            def direction(w, j, central, cls=cls, phi=phi, r=r):
                target = users.y_central[cls[r, j]] if central else users.y[r, j, cls[r, j]]
                return np.mean([f * (f @ w - target[b]) for b, f in enumerate(phi[r, j])], axis=0)

            if t % local == 0:  # the server's direction, frozen for the round
                server = np.mean([direction(xc, j, True) for j in range(users.n)], axis=0)
            x = np.array([x[i] - alpha * (direction(x[i], i, False) + server - direction(xc, i, True))
                          for i in range(users.n)])
            copies = np.array([copies[i] - alpha * direction(copies[i], i, False) for i in range(users.n)])
            if (t + 1) % local == 0:
                xc = copies.mean(0)
                copies = np.tile(xc, (users.n, 1))
        xs[r], servers[r] = x, xc
    return xs, servers


def test_local_steps_affpcl_and_fedavg_equal_per_user_loop(feats):
    users = DigitsUsers(feats, np.random.default_rng(6), 2, 3, delta_obj=0.6, batch=4)
    u = users.draw(9, np.random.default_rng(7))
    x, xc = reference_local(users, 9, 0.5, u, local=3)
    np.testing.assert_allclose(run(LocalAffPCL(3), users, 9, 0.5, None, draws=u, every=3)[1], x, rtol=1e-10,
                               atol=1e-12)
    held = run(LocalFedAvg(3), users, 9, 0.5, None, draws=u, every=3)[1]
    np.testing.assert_allclose(held, np.broadcast_to(xc[:, None], held.shape), rtol=1e-10, atol=1e-12)
    # the frozen server direction matters: a different round length gives different personal models
    assert not np.allclose(run(LocalAffPCL(1), users, 9, 0.5, None, draws=u)[1], x)


def test_one_local_step_per_round_is_per_step_communication(feats):
    users = DigitsUsers(feats, np.random.default_rng(8), 2, 3, delta_obj=1.0, batch=4)
    u = users.draw(20, np.random.default_rng(9))
    pairs = ((LocalAffPCL(1), AffPCL(central="oracle", weights="none")), (LocalFedAvg(1), OneStepFedAvg()))
    for local, per_step in pairs:
        np.testing.assert_allclose(run(local, users, 20, 0.5, None, draws=u, every=5)[0],
                                   run(per_step, users, 20, 0.5, None, draws=u, every=5)[0], rtol=1e-9)
