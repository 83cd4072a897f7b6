"""AffPCL on one Gaussian system instance as a federated `Algorithm`: one round = one step of Algorithm 1, clients =
agents, so the simulator's ledger shows AffPCL's per-step communication (Remark 1). Its FedAvg counterpart is the
project's one FedAvg (`methods.fedavg`) with `LocalStep`: one local step per round on the same system.

Algorithm 1 needs the server's importance-corrected G^i_t before agent i can finish step t. Here round t+1's download
carries G^i_t together with x^c_{t+1} and theta^c_{t+1}; the agent first completes step t (x^i_{t+1} = x^i_t - a
(local_t + G^i_t), with local_t = g^i_t(x^i_t) - g^{c->i}_t(x^c_t) kept privately), then draws its next sample. This
is Algorithm 1 exactly, with the last half-step applied at evaluation. Uplink per step: s, g^i(x^c) (CDL 22-1),
g^{i,b}(theta^c), g^{c->i}(x^c); downlink: x^c, theta^c, G^i. Arrays travel as float32.
Client data: {"index": i, "samples": (T, d) array}, from `agent_data`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from collabalign.comm import Message, Params
from collabalign.federation.engine import ReplySpec
from collabalign.federation.protocol import Algorithm, ClientContext, evaluate_per_client
from collabalign.methods.affpcl.systems import GaussianSystems
from collabalign.seeding import Seeds


def agent_data(system: GaussianSystems, noise: np.ndarray) -> dict[str, dict[str, Any]]:
    """Client id -> that agent's index and sample stream (run 0 of `system`, noise (T, R, n, d) as its `draw`)."""
    return {f"agent{i:03d}": {"index": i, "samples": system.means[0, i] + noise[:, 0, i]} for i in range(system.n)}


class _Linear:
    """Run 0 of a Gaussian system, one sample at a time."""

    def __init__(self, system: GaussianSystems, alpha: float):
        self.system, self.alpha = system, alpha

    def a_mul(self, s: np.ndarray, x: np.ndarray) -> np.ndarray:
        return self.system.a_mul(s[None, None], x[None, None])[0, 0]

    def phi_mul(self, s: np.ndarray, theta: np.ndarray) -> np.ndarray:
        return self.system.phi_mul(s[None, None], theta[None, None])[0, 0]

    def error(self, i: int, x: np.ndarray) -> float:
        """Squared distance of agent i's iterate `x` from its solution."""
        return float(((x - self.system.xstar[0, i]) ** 2).sum())

    def mse(self, errors: dict[int, float]) -> dict[str, float]:
        """Mean squared error over the agents (by index) and the first agent's own."""
        return {"mse0": float(np.mean(list(errors.values()))), "mse_agent1": errors.get(0, float("nan"))}


class AffPCLFederated(_Linear):
    """AffPCL with COE, CDL (22-1) and exact density ratios known to the server, one local step per round."""

    def init(self, seeds: Seeds) -> dict[str, Any]:
        d = self.system.d
        return {"xc": np.zeros(d), "theta": np.zeros(d), "G": {}}

    def configure(self, state: dict, round_: int, client_ids: list[str]) -> dict[str, Message]:
        zero = np.zeros(self.system.d)
        return {cid: Message({"xc": state["xc"].astype(np.float32), "theta": state["theta"].astype(np.float32),
                              "G": state["G"].get(cid, zero).astype(np.float32)}, {"step": round_ - 1})
                for cid in client_ids}

    def client_update(self, message: Message, client: ClientContext) -> Message:
        i, st = client.data["index"], client.state
        x = st.get("x", np.zeros(self.system.d))
        if "local" in st:
            x = x - self.alpha * (st["local"] + message["G"])
        s = client.data["samples"][message.meta["step"]]
        xc, theta = message["xc"].astype(float), message["theta"].astype(float)
        b = self.phi_mul(s, self.system.theta[0, i])
        corr = self.a_mul(s, xc) - self.phi_mul(s, theta)
        st["x"], st["local"] = x, self.a_mul(s, x) - b - corr
        up = {"s": s, "g_c": self.a_mul(s, xc) - b, "g_b": self.phi_mul(s, theta) - b, "corr": corr}
        return Message({k: v.astype(np.float32) for k, v in up.items()})

    def reply_spec(self, state: dict, message: Message, cid: str) -> ReplySpec:
        """The step's sample and the three d-vectors the server's updates need; agents are averaged uniformly."""
        d = self.system.d
        return ReplySpec({name: ((d,), "<f4") for name in ("s", "g_c", "g_b", "corr")}, count=False)

    def aggregate(self, state: dict, replies: dict[str, Message], round_: int) -> dict[str, Any]:
        ids = sorted(replies, key=lambda c: int(c.removeprefix("agent")))
        if len(ids) != self.system.n:
            raise ValueError("AffPCL's importance correction needs every agent's sample each step (fraction = 1)")
        get = lambda name: np.stack([replies[c][name].astype(float) for c in ids])
        corr = get("corr")
        g = self.system.tile(1).rho(get("s")[None])[0] @ corr / len(ids)
        return {"xc": state["xc"] - self.alpha * get("g_c").mean(0),
                "theta": state["theta"] - self.alpha * get("g_b").mean(0), "G": dict(zip(ids, g, strict=True))}

    def evaluate(self, state: dict, clients: dict[str, ClientContext], round_: int) -> dict[str, float]:
        return evaluate_per_client(self, state, clients, round_)

    def client_metrics(self, state: dict, client: ClientContext, round_: int) -> dict[str, float]:
        """The agent's squared error of x^i_{t+1}: its pending half-step applied with the server's current G^i."""
        i, x = client.data["index"], client.state.get("x", np.zeros(self.system.d))
        if "local" in client.state:
            x = x - self.alpha * (client.state["local"] + state["G"][client.cid])
        return {"index": float(i), "error": self.error(i, x)}

    def combine_metrics(self, state: dict, per_client: dict[str, dict[str, float]], round_: int) -> dict[str, float]:
        """MSE over the agents."""
        return self.mse({int(m["index"]): m["error"] for m in per_client.values()})


class LocalStep(_Linear):
    """FedAvg's `LocalTrainer` on the same system: one local step x <- x - alpha (A(s) x - b^i(s)) on a fresh sample s
    of the agent's environment, drawn from the round's generator; parameters travel as float32."""

    def initial_params(self, seeds: Seeds) -> Params:
        return {"x": np.zeros(self.system.d, dtype=np.float32)}

    def train(self, params: Params, data: dict[str, Any], rng: torch.Generator) -> tuple[Params, int]:
        i = data["index"]
        s = self.system.means[0, i] + torch.randn(self.system.d, generator=rng, dtype=torch.float64).numpy()
        x = params["x"].astype(float)
        x = x - self.alpha * (self.a_mul(s, x) - self.phi_mul(s, self.system.theta[0, i]))
        return {"x": x.astype(np.float32)}, 1

    def evaluate(self, params: Params) -> dict[str, float]:
        x = params["x"].astype(float)
        return self.mse({i: self.error(i, x) for i in range(self.system.n)})


def payload_bytes(algorithm: Algorithm, data: dict[str, dict[str, Any]]) -> dict[str, int]:
    """Array bytes (no wire header) of one client's download and upload in the first round."""
    cid = next(iter(data))
    down = algorithm.configure(algorithm.init(Seeds(0)), 1, [cid])[cid]
    client = ClientContext(cid, data[cid])
    client.seed_round(Seeds(0), 1)
    up = algorithm.client_update(down, client)
    return {"down": down.array_nbytes, "up": up.array_nbytes}
