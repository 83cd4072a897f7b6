"""AffPCL's entry point on a user's own per-agent arrays: personalised least-squares solutions, held-out errors beside
independent learning's and FedAvg's, estimated density ratios (the default) and exact ones (on request), saved arrays,
and malformed .npz files named by array."""

import json

import numpy as np
import pytest
from pydantic import ValidationError

from collabalign import claims
from collabalign.artifacts import read_arrays
from collabalign.data.errors import DataError
from collabalign.data.formats import file_hash
from collabalign.methods.affpcl import AffPCLConfig, train_affpcl

AGENTS = ("wren", "heron", "ibis")


def agents(shared: int, private: int = 150, d: int = 5, noise: float = 1.0, seed: int = 0) -> dict:
    """Three agents with different true weights (base + 0.1 N(0, I)), private rows, plus `shared` rows all hold."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(d)
    xs = rng.standard_normal((shared, d))
    ys = xs @ base + noise * rng.standard_normal(shared)
    out = {}
    for name in AGENTS:
        w = base + 0.1 * rng.standard_normal(d)
        x = rng.standard_normal((private, d))
        out[name] = (np.r_[x, xs], np.r_[x @ w + noise * rng.standard_normal(private), ys])
    return out


def own_least_squares(data: dict) -> dict:
    return {k: np.linalg.lstsq(x, y, rcond=None)[0] for k, (x, y) in data.items()}


def mean_gap(config: AffPCLConfig, data: dict) -> float:
    return float(np.mean(list(train_affpcl(config, data).metrics["ls_error"].values())))


def test_solutions_approach_each_agents_least_squares_and_beat_il():
    data = agents(shared=300)
    # Exact ratios over the rows the agents declare shared, every row trained on (test_fraction=0): what this test
    # measured before estimated ratios and the held-out split became the defaults (the numbers below are unchanged).
    # With the default estimated ratios the agents here (same feature distribution, weights 0.1 apart) are not told
    # apart, rho ~ 1, and AffPCL moves towards the pooled model instead of each agent's own least squares.
    exact = {"ratios": "exact", "test_fraction": 0.0}
    # 2000 steps of 8 rows at alpha 0.01 from zero: ||x_ls||^2 ~ 0.9 falls to a constant-step noise floor. Measured
    # over seeds 0-4: AffPCL 0.0013-0.0026 (mean 0.0021), IL 0.0030-0.0049 (mean 0.0038); the bound is ~2x AffPCL's,
    # and AffPCL's mean is ~0.56 IL's (the rows the agents share cut the variance: rho^i < n on them).
    affpcl = [mean_gap(AffPCLConfig(steps=2000, seed=s, **exact), data) for s in range(5)]
    il = [mean_gap(AffPCLConfig(method="il", steps=2000, seed=s, **exact), data) for s in range(5)]
    assert np.mean(affpcl) < 0.005 and max(affpcl) < 0.01
    assert np.mean(affpcl) < 0.8 * np.mean(il)
    result = train_affpcl(AffPCLConfig(steps=2000, **exact), data)
    assert "baseline" not in result.metrics and result.metrics["ratios"] == {"kind": "exact"}  # nothing held out
    for name, xstar in own_least_squares(data).items():
        np.testing.assert_allclose(result.arrays[f"solution/{name}"], xstar, atol=0.1)
        x, y = data[name]
        assert result.metrics["train_mse"][name] == pytest.approx(np.mean((x @ result.arrays[f"solution/{name}"] - y)
                                                                          ** 2))
        assert result.metrics["train_mse"][name] < result.metrics["ls_train_mse"][name] + 0.01
    pooled_a = np.mean([x.T @ x / len(x) for x, _ in data.values()], 0)
    pooled_b = np.mean([x.T @ y / len(x) for x, y in data.values()], 0)
    np.testing.assert_allclose(result.arrays["central"], np.linalg.solve(pooled_a, pooled_b), atol=0.1)
    assert result.metrics["trace"]["ls_error"][-1] < 0.01 * result.metrics["trace"]["ls_error"][0]


def test_exact_ratios_on_disjoint_rows_reduce_to_independent_learning():
    data = agents(shared=0)  # exact density ratios rho^i(s^j) = n [i = j]: the update is IL's (delta_env = 1)
    affpcl = train_affpcl(AffPCLConfig(steps=300, ratios="exact"), data)
    il = train_affpcl(AffPCLConfig(method="il", steps=300), data)
    for name in AGENTS:
        np.testing.assert_allclose(affpcl.arrays[f"solution/{name}"], il.arrays[f"solution/{name}"], atol=1e-10)
    assert "central" not in il.arrays
    # the same split and draws: AffPCL's held-out errors are IL's, so its comparison with IL is a tie at 0
    assert affpcl.metrics["test_mse"] == pytest.approx(il.metrics["test_mse"], abs=1e-10)
    assert affpcl.metrics["baseline"]["difference"] == pytest.approx(0, abs=1e-10)


def test_held_out_split_and_baseline_records():
    data = agents(shared=0, private=20)
    result = train_affpcl(AffPCLConfig(steps=200, seed=3), data)
    m = result.metrics
    assert m["rows"] == [16] * 3 and m["test_rows"] == [4] * 3  # 20% of 20 rows held out per agent
    assert m["test_mse_mean"] == pytest.approx(np.mean(list(m["test_mse"].values())))
    fields = {"metric", "baseline", "ours", "baseline_value", "difference", "interval", "items", "verdict"}
    for key, rival in (("baseline", "independent learning"), ("baseline_fedavg", "FedAvg")):
        record = m[key]
        assert set(record) == fields and record["baseline"].startswith(rival), record
        assert record["metric"] == "held-out squared error" and record["items"] == 12
        assert record["verdict"] in ("beats", "loses to", "ties with")
        assert record["ours"] == pytest.approx(m["test_mse_mean"], abs=1e-5)  # every agent weighs the same
        assert record["difference"] == pytest.approx(record["ours"] - record["baseline_value"], abs=1e-5)
    assert m["ratios"]["kind"] == "estimated" and m["ratios"]["C"] in (0.01, 0.1, 1.0, 10.0, 100.0)
    # IL's baseline is FedAvg; FedAvg's is IL alone; the baselines' own runs are the ones their methods make
    il, fedavg = (train_affpcl(AffPCLConfig(method=k, steps=200, seed=3), data).metrics for k in ("il", "fedavg"))
    assert il["baseline"]["baseline"].startswith("FedAvg") and "baseline_fedavg" not in il
    assert fedavg["baseline"]["baseline"].startswith("independent") and "baseline_fedavg" not in fedavg
    assert m["baseline"]["baseline_value"] == pytest.approx(il["test_mse_mean"], abs=1e-5)
    assert m["baseline_fedavg"]["baseline_value"] == pytest.approx(fedavg["test_mse_mean"], abs=1e-5)
    assert "baseline" not in train_affpcl(AffPCLConfig(steps=20, test_fraction=0), data).metrics
    with pytest.raises(DataError, match="^data: too few rows: agent 'solo' has 1, at least 2"):
        train_affpcl(AffPCLConfig(steps=5), {**data, "solo": (np.ones((1, 5)), np.ones(1))})


def related_agents(seed: int, n: int = 8, d: int = 5, spread: float = 0.1, noise: float = 0.5) -> dict:
    """`n` agents with 12-20 rows each, features N(0, I) for all, weights w0 + spread N(0, I), noise N(0, noise^2)."""
    rng = np.random.default_rng(seed)
    w0, out = rng.standard_normal(d), {}
    for a in range(n):
        rows = int(rng.integers(12, 21))
        w, x = w0 + spread * rng.standard_normal(d), rng.standard_normal((rows, d))
        out[f"agent{a}"] = (x, x @ w + noise * rng.standard_normal(rows))
    return out


# Declared before the run: AffPCL's held-out error below IL's, and at most 10% above FedAvg's and Ditto's.
BEATS_IL = claims.superiority("affpcl_beats_il", "few related rows per agent: AffPCL's held-out squared error is "
                              "below independent learning's", lower_is_better=True)
NEAR_POOLED = claims.non_inferiority("affpcl_near_pooled", "AffPCL's held-out squared error at most 10% above the "
                                     "rival's", margin=0.1, scale="ratio", lower_is_better=True)


def test_estimated_ratios_help_related_agents_with_few_rows():
    # 8 agents, d = 5, 12-20 rows (80% trained on), weights 0.1 apart, noise 0.5; default config (4000 steps,
    # alpha 0.01), data set and seed s for s = 0-4. Measured: mean held-out squared error per seed AffPCL
    # 0.363 0.298 0.390 0.248 0.315 (mean 0.323), IL 0.644 0.653 0.481 0.247 0.720 (0.549), FedAvg 0.356 0.289
    # 0.390 0.247 0.304 (0.317), Ditto 0.357 0.284 0.389 0.235 0.298 (0.312). The classifier cannot tell these agents
    # apart (CV picks C = 0.01, own_share ~0.13 ~ 1/8): rho ~ 1, and AffPCL moves to (about) the pooled model. So
    # it beats IL by pooling, and stays 2-4% above FedAvg and Ditto (ratio intervals [1.00, 1.04] and [1.00, 1.07]).
    affpcl, il, fedavg, ditto = [], [], [], []
    for s in range(5):
        data = related_agents(s)
        m = train_affpcl(AffPCLConfig(seed=s), data).metrics
        affpcl.append(m["test_mse_mean"])
        il.append(m["baseline"]["baseline_value"])
        fedavg.append(m["baseline_fedavg"]["baseline_value"])
        ditto.append(train_affpcl(AffPCLConfig(method="ditto", seed=s), data).metrics["test_mse_mean"])
        assert m["ratios"]["own_share"] < 0.2
    assert BEATS_IL.decide(affpcl, il)["verdict"] == "reproduced", (affpcl, il)
    for rival in (fedavg, ditto):
        assert NEAR_POOLED.decide(affpcl, rival)["verdict"] == "reproduced", (affpcl, rival)


def test_estimated_ratios_on_unrelated_agents_fall_back_to_independent_learning():
    # Each agent's features around its own centre 6 e_a (far apart), its own weights N(0, I): the classifier tells
    # them apart (own_share ~0.999), rho^i(s^j) ~ 4 [i = j] and AffPCL's solutions are IL's up to the leak (measured
    # max gap 0.008, against 3.4 between IL and the common FedAvg model).
    rng = np.random.default_rng(0)
    data = {}
    for a in range(4):
        x = 6.0 * np.eye(5)[a] + rng.standard_normal((int(rng.integers(12, 21)), 5))
        data[f"agent{a}"] = (x, x @ rng.standard_normal(5) + 0.5 * rng.standard_normal(len(x)))
    affpcl = train_affpcl(AffPCLConfig(), data)
    il = train_affpcl(AffPCLConfig(method="il"), data)
    fedavg = train_affpcl(AffPCLConfig(method="fedavg"), data)
    assert affpcl.metrics["ratios"]["own_share"] > 0.99
    gap = max(np.abs(affpcl.arrays[k] - il.arrays[k]).max() for k in il.arrays)
    far = max(np.abs(fedavg.arrays[k] - il.arrays[k]).max() for k in il.arrays)
    assert gap < 0.03 and gap < 0.01 * far, (gap, far)


@pytest.mark.parametrize("method", ["fedavg", "ditto", "pfedme", "finetune"])
def test_baselines_run_through_the_same_entry_point(method):
    result = train_affpcl(AffPCLConfig(method=method, steps=200), agents(shared=30, private=40))
    assert set(result.arrays) == {*(f"solution/{a}" for a in AGENTS), "central"}
    assert all(np.isfinite(v).all() for v in result.arrays.values())


def test_npz_file_saved_arrays_and_determinism(tmp_path):
    path = tmp_path / "mine.npz"
    np.savez(path, **{f"{p}_{k}": v[i] for k, v in agents(shared=20, private=30).items() for i, p in enumerate("Xy")})
    config = AffPCLConfig(steps=200, seed=7)
    result = train_affpcl(config, path)
    assert result.data_hash == file_hash(path) and result.kind == "arrays"
    run = result.save(tmp_path / "run")
    saved = read_arrays(run)
    assert saved.keys() == result.arrays.keys()
    for key, value in result.arrays.items():
        np.testing.assert_array_equal(saved[key], value)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["method"] == "affpcl" and manifest["config"]["seed"] == 7 and manifest["adapters"] == []
    again = train_affpcl(config, path)
    assert all(np.array_equal(again.arrays[k], v) for k, v in result.arrays.items())
    with pytest.raises(ValueError, match="model=None"):
        train_affpcl(config, path, model="smollm2-135m")
    with pytest.raises(ValidationError):
        AffPCLConfig(alpha=0)


def test_malformed_npz_names_the_array(tmp_path):
    x = np.ones((4, 2))
    cases = {"mismatch": ({"X_bob": x, "y_bob": np.ones(3)}, "array 'y_bob': 3 rows, X_bob has 4"),
             "nan": ({"X_bob": x, "y_bob": np.array([1.0, np.nan, 0, 0])}, "array 'y_bob': not finite at row 1"),
             "width": ({"X_bob": x, "y_bob": np.ones(4), "X_ann": np.ones((4, 3)), "y_ann": np.ones(4)},
                       "array 'X_ann': 3 features"),
             "unpaired": ({"X_bob": x}, "array 'X_bob' has no y_bob")}
    for label, (arrays, message) in cases.items():
        path = tmp_path / f"{label}.npz"
        np.savez(path, **arrays)
        with pytest.raises(DataError) as err:
            train_affpcl(AffPCLConfig(steps=5), path)
        assert str(err.value).startswith(f"{path}: {message}"), str(err.value)
    with pytest.raises(DataError, match="no such file"):
        train_affpcl(AffPCLConfig(steps=5), tmp_path / "absent.npz")
