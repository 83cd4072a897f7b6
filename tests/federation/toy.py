"""A tiny least-squares LocalTrainer for simulator tests (numpy + torch, deterministic)."""

import numpy as np
import torch

from collabalign.seeding import Seeds


class LeastSquares:
    def __init__(self, dim=3, steps=5, lr=0.1):
        self.dim, self.steps, self.lr = dim, steps, lr
        rng = np.random.default_rng(0)
        self.w_true = rng.normal(size=dim).astype(np.float32)
        self.x_test = rng.normal(size=(50, dim)).astype(np.float32)

    def client_data(self, n_clients, n=20):
        rng = np.random.default_rng(1)
        out = {}
        for i in range(n_clients):
            x = rng.normal(size=(n + i, self.dim)).astype(np.float32)
            out[f"c{i}"] = (x, x @ self.w_true + 0.1 * rng.normal(size=n + i).astype(np.float32))
        return out

    def initial_params(self, seeds: Seeds):
        return {"w": seeds.numpy("init").normal(size=self.dim).astype(np.float32)}

    def train(self, params, data, rng):
        w = torch.tensor(params["w"], requires_grad=True)
        x, y = map(torch.tensor, data)
        opt = torch.optim.SGD([w], lr=self.lr)
        for _ in range(self.steps):
            batch = torch.randperm(len(x), generator=rng)[:8]
            loss = ((x[batch] @ w - y[batch]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return {"w": w.detach().numpy()}, len(x)

    def evaluate(self, params):
        err = self.x_test @ (params["w"] - self.w_true)
        return {"mse": float(np.mean(err**2))}


class ManyAtOnce(LeastSquares):
    """The toy trainer with a `train_many` that counts its calls and trains one client after the other."""

    calls = 0

    def train_many(self, params, data, rngs):
        self.calls += 1
        return [self.train(p, d, g) for p, d, g in zip(params, data, rngs, strict=True)]
