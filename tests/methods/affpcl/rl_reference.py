"""Per-run, per-agent loop implementations of the RL algorithms (spec §3.13 pseudo-code, agent by agent), consuming the
same uniforms as the vectorised driver on the TD and SARSA problems; tests check that both agree on small cases."""

from __future__ import annotations

import numpy as np

from collabalign.experiments.affpcl.problems.sarsa import TabularMDPs
from collabalign.experiments.affpcl.problems.td import TabularChains


def _draw(cum: np.ndarray, u: float) -> int:
    return min(int(np.searchsorted(cum, u, side="left")), len(cum) - 1)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def reference_td(method: str, chains: TabularChains, steps: int, alpha: float, rng: np.random.Generator,
                 central: str = "coe") -> np.ndarray:
    """TD(0) variants as loops over runs, agents and samples; errors (T, R, n)."""
    runs, n, d, size = chains.runs, chains.n, chains.d, chains.states
    u = rng.uniform(size=(steps, runs, n))
    err = np.empty((steps, runs, n))
    for r in range(runs):
        phi, rew = chains.phi[r], chains.r[r]
        x, xc = np.zeros((n, d)), np.zeros(d)
        th = chains.theta_c[r].copy() if central == "oracle" else np.zeros(size * size)
        visits = np.zeros(size * size)
        for t in range(steps):
            ks = [_draw(chains.cum[r, i], u[t, r, i]) for i in range(n)]
            pairs = [divmod(k, size) for k in ks]

            def a_mul(j: int, v: np.ndarray, pairs=pairs, phi=phi) -> np.ndarray:
                o, o2 = pairs[j]
                return phi[o] * ((phi[o] - chains.gamma * phi[o2]) @ v)

            def b(j: int, pairs=pairs, phi=phi, rew=rew) -> np.ndarray:
                o, o2 = pairs[j]
                return phi[o] * rew[j, o, o2]

            if method == "il":
                x = np.stack([x[i] - alpha * (a_mul(i, x[i]) - b(i)) for i in range(n)])
            elif method == "fedavg":
                xc = xc - alpha * np.mean([a_mul(j, xc) - b(j) for j in range(n)], axis=0)
                x = np.stack([xc] * n)
            else:
                corr = [a_mul(j, xc) - phi[pairs[j][0]] * th[ks[j]] for j in range(n)]
                new = []
                for i in range(n):
                    server = sum(chains.rho[r, i, ks[j]] * corr[j] for j in range(n)) / n
                    new.append(x[i] - alpha * (a_mul(i, x[i]) - b(i) + server - corr[i]))
                x = np.stack(new)
                xc = xc - alpha * np.mean([a_mul(j, xc) - b(j) for j in range(n)], axis=0)
                if central == "coe":
                    for j in range(n):
                        visits[ks[j]] += 1
                        th[ks[j]] += (rew[j].ravel()[ks[j]] - th[ks[j]]) / visits[ks[j]]
            err[t, r] = ((x - chains.xstar[r]) ** 2).sum(-1)
    return err


def reference_sarsa(method: str, mdps: TabularMDPs, steps: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """SARSA variants as loops over runs, agents and steps, as in the reference scripts; errors (T, R, n)."""
    runs, n, d, size, acts = mdps.runs, mdps.n, mdps.d, mdps.states, mdps.actions
    u = rng.uniform(size=(steps + 1, runs, n, 4))
    uniform = np.linspace(1 / size, 1, size)
    err = np.empty((steps, runs, n))
    for r in range(runs):
        phi = mdps.phi[r]

        def act(theta: np.ndarray, s: int, v: float, phi=phi) -> int:
            return _draw(np.cumsum(_softmax(phi[s] @ theta / mdps.temp)), v)

        theta, thc = np.zeros((n, d)), np.zeros(d)
        r_c, n_c = np.zeros((size, acts)), np.full((size, acts), 1e-9)
        counts = np.ones((n, size))
        s = [_draw(uniform, u[-1, r, i, 0]) for i in range(n)]
        for t in range(steps):
            a = [act(theta[i], s[i], u[t, r, i, 0]) for i in range(n)]
            rew = [mdps.r[r, i, s[i], a[i]] for i in range(n)]
            s2 = [_draw(mdps.cum_p[r, i, s[i], a[i]], u[t, r, i, 1]) for i in range(n)]
            corrected = method in ("affpcl", "affpcl_dre")
            if corrected:
                for i in range(n):
                    n_c[s[i], a[i]] += 1
                    r_c[s[i], a[i]] += (rew[i] - r_c[s[i], a[i]]) / n_c[s[i], a[i]]
                gc = []
                for j in range(n):
                    a_c = act(thc, s2[j], u[t, r, j, 2])
                    dc = r_c[s[j], a[j]] + mdps.gamma * phi[s2[j], a_c] @ thc - phi[s[j], a[j]] @ thc
                    gc.append(dc * phi[s[j], a[j]])
                if method == "affpcl":
                    rho = mdps.rho_true[r]
                else:
                    dsa = np.stack([counts[k][:, None] / counts[k].sum()
                                    * np.stack([_softmax(phi[q] @ theta[k] / mdps.temp) for q in range(size)])
                                    for k in range(n)])
                    rho = dsa / (dsa.mean(0) + 1e-9)
                thc = thc + alpha * np.mean(gc, axis=0)
            new = []
            for i in range(n):
                a2 = act(theta[i], s2[i], u[t, r, i, 3])
                delta = rew[i] + mdps.gamma * phi[s2[i], a2] @ theta[i] - phi[s[i], a[i]] @ theta[i]
                step = delta * phi[s[i], a[i]]
                if corrected:
                    step = step + sum(rho[i, s[j], a[j]] * gc[j] for j in range(n)) / n - gc[i]
                new.append(theta[i] + alpha * step)
            theta = np.stack(new)
            if method == "fedavg":
                theta = np.stack([theta.mean(0)] * n)
            for i in range(n):
                counts[i, s2[i]] += 1
            s = s2
            err[t, r] = ((theta - mdps.theta_star[r]) ** 2).sum(-1)
    return err
