"""AffPCL on the user's agent arrays with the agents as federated clients: one round is one step of `train_affpcl`'s
AffPCL with `ratios="exact", test_fraction=0` (oracle central objective, CDL 22-1, exact density ratios over row
identities, every row trained on), on the same draws, so the simulated run equals the centralised driver's to float64
rounding. `collabalign train affpcl-federated` / `deploy deploy/affpcl-federated`.

    from collabalign.methods.affpcl.federated_arrays import FederatedAffPCLConfig, train_affpcl_federated
    result = train_affpcl_federated(FederatedAffPCLConfig(steps=400), "agents.npz")
    result.arrays["solution/alice"]; result.arrays["central"]

Each agent keeps its rows, its personal model x^i and the step it has not finished; per step it uploads its minibatch's
central directions phi_b (phi_b . x^c - y_b) (B, d) and their row ids (B,). The server moves x^c by their mean and
returns each agent's importance-corrected average G^i = (1/(nB)) sum_j sum_b rho^i(s^j_b) phi (phi . x^c - y), with
which the agent finishes its step in the next round (as `federated.AffPCLFederated` on Gaussian systems). The exact
density ratios are the server's: it must know which pooled rows each agent holds (row ids, e.g. hashes of shared
public rows), AffPCL's known-ratio assumption. Arrays travel as float64. Every agent answers every round (fraction 1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from pydantic import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from collabalign.artifacts import Result
from collabalign.comm import Message
from collabalign.config import Strict
from collabalign.federation.engine import EngineOptions, ReplySpec, SimulationResult
from collabalign.federation.job import FederatedJob
from collabalign.federation.protocol import ClientContext, evaluate_per_client
from collabalign.methods.affpcl.entry import AgentArrays, Agents, load_agents
from collabalign.seeding import Seeds


class FederatedAffPCLConfig(Strict):
    """AffPCL over the agents' own arrays, one engine round per step (`AffPCLConfig`'s keys for AffPCL)."""

    steps: PositiveInt = 400
    alpha: PositiveFloat = 0.01  # step size at step 0; keep alpha * max ||phi||^2 below ~1 for stability
    decay: NonNegativeFloat = 0.0  # step t uses alpha / (1 + decay t); 0: constant
    batch: PositiveInt = 8  # rows each agent draws per step
    eval_every: PositiveInt = 20  # steps between evaluations (and the last)
    seed: NonNegativeInt = 0
    engine: EngineOptions = EngineOptions()


class AffPCLArrays:
    """The federated `Algorithm`; client data {"index": i, "x", "y", "rows": its rows' pooled ids, "draws": (T, B)
    uniforms picking its minibatches, "xstar": its least-squares solution}."""

    def __init__(self, rho: np.ndarray, alpha: np.ndarray, d: int, batch: int):
        self.rho, self.alpha, self.d, self.batch = rho, alpha, d, batch  # rho (n, distinct rows), alpha (T,)

    def init(self, seeds: Seeds) -> dict[str, Any]:
        return {"xc": np.zeros(self.d), "G": {}}

    def configure(self, state: dict, round_: int, client_ids: list[str]) -> dict[str, Message]:
        zero = np.zeros(self.d)
        return {cid: Message({"xc": state["xc"], "G": state["G"].get(cid, zero)}, {"step": round_ - 1})
                for cid in client_ids}

    def client_update(self, message: Message, client: ClientContext) -> Message:
        data, t = client.data, message.meta["step"]
        x = self.finished(client.state, message["G"], t)
        idx = np.minimum((data["draws"][t] * len(data["y"])).astype(int), len(data["y"]) - 1)
        phi, y = data["x"][idx], data["y"][idx]
        per = phi * (phi @ message["xc"] - y)[:, None]  # the central direction at each of its samples
        grad = (phi * (phi @ x - y)[:, None]).mean(0)
        client.state = {"x": x, "local": grad - per.mean(0)}
        return Message({"per": per, "rows": data["rows"][idx]})

    def reply_spec(self, state: dict, message: Message, cid: str) -> ReplySpec:
        return ReplySpec({"per": ((self.batch, self.d), "<f8"), "rows": ((self.batch,), "<i8")}, count=False)

    def aggregate(self, state: dict, replies: dict[str, Message], round_: int) -> dict[str, Any]:
        ids = sorted(replies)
        if len(ids) != self.rho.shape[0]:
            raise ValueError("AffPCL's importance correction needs every agent's samples each step (fraction = 1, "
                             f"min_replies = {self.rho.shape[0]}); {len(ids)} answered")
        per = np.stack([replies[c]["per"] for c in ids])  # (n, B, d)
        rows = np.stack([replies[c]["rows"] for c in ids])  # (n, B)
        if rows.min() < 0 or rows.max() >= self.rho.shape[1]:
            raise ValueError(f"row ids outside the {self.rho.shape[1]} pooled rows")
        g = np.einsum("ijb,jbd->id", self.rho[:, rows], per) / (self.batch * len(ids))
        xc = state["xc"] - self.alpha[round_ - 1] * per.mean(1).mean(0)
        return {"xc": xc, "G": dict(zip(ids, g, strict=True))}

    def evaluate(self, state: dict, clients: dict[str, ClientContext], round_: int) -> dict[str, float]:
        return evaluate_per_client(self, state, clients, round_)

    def client_metrics(self, state: dict, client: ClientContext, round_: int) -> dict[str, float]:
        """The agent's squared distance to its own least-squares solution, its step finished with the server's G."""
        x = self.finished(client.state, state["G"].get(client.cid), round_)
        return {"ls_error": float(((x - client.data["xstar"]) ** 2).sum())}

    def combine_metrics(self, state: dict, per_client: dict[str, dict[str, float]], round_: int) -> dict[str, float]:
        return {"ls_error": float(np.mean([m["ls_error"] for m in per_client.values()]))}

    def finished(self, private: dict[str, Any], g: np.ndarray | None, t: int) -> np.ndarray:
        """x^i after step t - 1 (step sizes alpha[t - 1]): its pending local part and the server's G^i applied."""
        x = private.get("x", np.zeros(self.d))
        return x - self.alpha[t - 1] * (private["local"] + g) if "local" in private else x


def train_affpcl_federated(config: FederatedAffPCLConfig, data: str | Path | Agents, model: None = None,
                           progress: bool = False) -> Result:
    """Every agent's personalised model, simulated in this process (`result.arrays`: "solution/<agent>", "central")."""
    if model is not None:
        raise ValueError("AffPCL learns linear models on the agents' arrays: pass model=None")
    return affpcl_federated_job(config, data).run(progress)


def affpcl_federated_job(config: FederatedAffPCLConfig, data: str | Path | Agents) -> FederatedJob:
    """The run `train_affpcl_federated` simulates, for any engine; client `agent<k>` is the k-th agent of the file."""
    agents, data_hash = load_agents(data)
    problem = AgentArrays(agents, config.batch)
    draws = problem.draw(config.steps, Seeds(config.seed).numpy("affpcl/draws"))  # train_affpcl's draws
    names = list(agents)
    clients = {}
    for i, name in enumerate(names):
        own = slice(problem.start[i], problem.start[i] + problem.sizes[i])
        clients[f"agent{i:03d}"] = {"index": i, "name": name, "x": problem.x[own], "y": problem.y[own],
                                    "rows": problem.row[own].astype(np.int64), "draws": draws[:, 0, i],
                                    "xstar": problem.xstar[i]}
    alpha = config.alpha / (1.0 + config.decay * np.arange(config.steps))
    algorithm = AffPCLArrays(problem.rho, alpha, problem.d, config.batch)

    def personal(state: Any, client: ClientContext) -> Result:
        """An agent's own model after the last step (where its state is: its node)."""
        x = algorithm.finished(client.state, state["G"].get(client.cid), config.steps)
        name = client.data["name"]
        return Result("affpcl-federated", "arrays", "linear", config.model_dump(), data_hash, {"agent": name},
                      arrays={f"solution/{name}": x})

    def finish(sim: SimulationResult) -> Result:
        """The central model, and the agents' models when their clients ran here (the simulator); on a deployment
        each node saved its own."""
        arrays = {"central": sim.state["xc"]}
        if all(c.state for c in sim.clients.values()):
            for client in sim.clients.values():
                arrays |= personal(sim.state, client).arrays
        metrics = {"agents": len(names), "features": problem.d, "rows": problem.sizes.tolist(),
                   "rounds": sim.metrics, "bytes": sim.ledger.total()}
        if sim.metrics:
            metrics["ls_error"] = sim.metrics[-1]["ls_error"]
        return Result("affpcl-federated", "arrays", "linear", config.model_dump(), data_hash, metrics, arrays=arrays)

    return FederatedJob("affpcl-federated", algorithm, clients, config.steps, config.seed, config.engine, finish,
                        eval_every=config.eval_every, personal=personal)
