"""FedSA-LoRA (Guo et al. 2025, "Selective aggregation for low-rank adaptation in federated learning"): every device
at rank r; A, which the paper finds learns what the devices share, is sent, trained and averaged; B, which learns what
is the device's own, stays on the device (its private state, 0 until it first trains) and is never sent. The head is
averaged, as every method of the family averages it. There is no global model: the reported metrics are the mean (and
min, max) over devices of each device's own model, A and the head from the server and its own B, on the held-out
set."""

from __future__ import annotations

import numpy as np

from collabalign.comm import Message
from collabalign.federation.engine import ReplySpec
from collabalign.federation.protocol import ClientContext, evaluate_per_client, mean_min_max
from collabalign.methods.fslora.common import ServerStep, head_arrays, head_of, lora_scale, mean_head
from collabalign.methods.fslora.local_steps import LocalSteps
from collabalign.methods.fslora.problems import LocalJob, TorchLoRAProblem
from collabalign.seeding import Seeds

State = dict[str, np.ndarray]


class FedSALoRA(LocalSteps):
    def __init__(self, problem: TorchLoRAProblem, device_ids: list[str], rank: int, alpha: float = 1.0,
                 server: ServerStep | None = None):
        self.problem, self.rank, self.ranks = problem, rank, {cid: rank for cid in device_ids}
        self.scale, self.server = lora_scale(alpha, rank), server

    def init(self, seeds: Seeds) -> State:
        """A ~ PEFT's uniform init, drawn once by the server, and a fresh head."""
        gen = seeds.torch("lora-init")
        state = {f"{name}.A": self.problem.init_a(gen, self.rank, n) for name, (_, n) in self.problem.shapes.items()}
        return state | head_arrays(self.problem.init_head(seeds))

    def configure(self, state: State, round_: int, client_ids: list[str]) -> dict[str, Message]:
        message = Message({k: v for k, v in state.items() if not k.startswith("opt/")}, {"round": round_})
        return {cid: message for cid in client_ids}

    def own_b(self, client: ClientContext) -> dict[str, np.ndarray]:
        """The device's B per layer: its private state, 0 before it first trains."""
        return {name: client.state.get(f"{name}.B", np.zeros((m, self.rank), np.float32))
                for name, (m, _) in self.problem.shapes.items()}

    def local_job(self, message: Message, client: ClientContext) -> LocalJob:
        b = self.own_b(client)
        factors = {name: (b[name], message[f"{name}.A"]) for name in self.problem.shapes}
        return LocalJob(factors, head_of(message), self.scale, None, client.data, client.torch_rng)

    def client_update(self, message: Message, client: ClientContext) -> Message:
        return self.client_update_many({client.cid: message}, {client.cid: client})[client.cid]

    def client_update_many(self, messages: dict[str, Message], clients: dict[str, ClientContext]) -> dict[str, Message]:
        """Every device trains its own B and the shared A (in one computation); B stays in its state, A is sent."""
        jobs = {cid: self.local_job(message, clients[cid]) for cid, message in messages.items()}
        out = {}
        for cid, (trained, head) in zip(jobs, self.problem.local_train_many(list(jobs.values())), strict=True):
            clients[cid].state = {f"{name}.B": B for name, (B, _) in trained.items()}
            out[cid] = Message({f"{name}.A": A for name, (_, A) in trained.items()} | head_arrays(head), {})
        return out

    def reply_spec(self, state: State, message: Message, cid: str) -> ReplySpec:
        """The shared A and the head come back trained; no sample count (devices are averaged uniformly)."""
        return ReplySpec.mirror(message, count=False)

    def aggregate(self, state: State, replies: dict[str, Message], round_: int) -> State:
        ids, new = sorted(replies), dict(state)
        for name in self.problem.shapes:
            new[f"{name}.A"] = np.mean(np.stack([replies[c][f"{name}.A"] for c in ids]), axis=0).astype(np.float32)
        new |= mean_head([replies[c] for c in ids])
        return new if self.server is None else self.server.step(state, new)

    def evaluate(self, state: State, clients: dict[str, ClientContext], round_: int) -> dict[str, float]:
        return evaluate_per_client(self, state, clients, round_)

    def client_metrics(self, state: State, client: ClientContext, round_: int) -> dict[str, float]:
        """The device's own model (shared A and head, its own B) on the held-out set."""
        b = self.own_b(client)
        return self.problem.evaluate(self.delta_weights(state, b), head_of(state))

    def combine_metrics(self, state: State, per_client: dict[str, dict[str, float]], round_: int) -> dict[str, float]:
        """Mean, min and max over devices of each metric."""
        return mean_min_max(per_client)

    def delta_weights(self, state: State, b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """s B A per layer for the device whose B is `b`."""
        return {name: self.scale * b[name] @ state[f"{name}.A"] for name in self.problem.shapes}
