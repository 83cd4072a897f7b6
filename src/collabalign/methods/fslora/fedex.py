"""FedEx-LoRA (Singhal et al. 2025, "Exact aggregation for federated and efficient fine-tuning"): every device at rank
r trains B and A from the global factors; the server averages the factors, B̄ and Ā, and folds the residual of the
averaged product into the frozen weight, R = (1/N) sum_i s B_i A_i - s B̄ Ā, so the merged global model
W0 + base + s B̄ Ā equals the average of the devices' merged models exactly. The dense base (the sum of the residuals)
is sent to the devices with the factors each round: the download grows by one dense matrix per layer, the upload is
Federated LoRA's."""

from __future__ import annotations

import numpy as np

from collabalign.comm import Message, Params
from collabalign.federation.engine import ReplySpec
from collabalign.federation.protocol import ClientContext
from collabalign.methods.fslora.common import head_arrays, head_of, lora_scale, mean_head
from collabalign.methods.fslora.local_steps import LocalSteps
from collabalign.methods.fslora.problems import Factors, LocalJob, TorchLoRAProblem
from collabalign.seeding import Seeds

State = dict[str, np.ndarray]


class FedExLoRA(LocalSteps):
    def __init__(self, problem: TorchLoRAProblem, device_ids: list[str], rank: int, alpha: float = 1.0):
        self.problem, self.rank, self.ranks = problem, rank, {cid: rank for cid in device_ids}
        self.scale = lora_scale(alpha, rank)

    def init(self, seeds: Seeds) -> State:
        """B = 0, A ~ PEFT's uniform init (drawn once by the server), the dense base 0, a fresh head."""
        gen = seeds.torch("lora-init")
        state: State = {}
        for name, (m, n) in self.problem.shapes.items():
            state[f"{name}.B"] = np.zeros((m, self.rank), np.float32)
            state[f"{name}.A"] = self.problem.init_a(gen, self.rank, n)
            state[f"{name}.base"] = np.zeros((m, n), np.float32)
        return state | head_arrays(self.problem.init_head(seeds))

    def configure(self, state: State, round_: int, client_ids: list[str]) -> dict[str, Message]:
        message = Message({k: v for k, v in state.items()}, {"round": round_})
        return {cid: message for cid in client_ids}

    def local_job(self, message: Message, client: ClientContext) -> LocalJob:
        shapes = self.problem.shapes
        factors = {name: (message[f"{name}.B"], message[f"{name}.A"]) for name in shapes}
        base = {name: message[f"{name}.base"] for name in shapes}
        return LocalJob(factors, head_of(message), self.scale, base, client.data, client.torch_rng)

    def reply(self, message: Message, job: LocalJob, trained: Factors, head: Params) -> Message:
        arrays = {}
        for name, (B, A) in trained.items():
            arrays[f"{name}.B"], arrays[f"{name}.A"] = B, A
        return Message(arrays | head_arrays(head), {})

    def reply_spec(self, state: State, message: Message, cid: str) -> ReplySpec:
        """The trained factors and head (the base is not sent back); no sample count (uniform average)."""
        arrays = {k: (v.shape, v.dtype.str) for k, v in message.items() if not k.endswith(".base")}
        return ReplySpec(arrays, {k: v for k, v in message.items() if not k.endswith(".base")}, count=False)

    def aggregate(self, state: State, replies: dict[str, Message], round_: int) -> State:
        """B̄, Ā, and base += (s/N) [B_1 ... B_N] [A_1; ...; A_N] - s B̄ Ā (one product of the stacked factors)."""
        ids, new = sorted(replies), dict(state)
        for name in self.problem.shapes:
            b = np.stack([replies[c][f"{name}.B"] for c in ids]).astype(np.float64)
            a = np.stack([replies[c][f"{name}.A"] for c in ids]).astype(np.float64)
            b_mean, a_mean = b.mean(0), a.mean(0)
            mean_product = np.concatenate(b, axis=1) @ np.concatenate(a, axis=0) / len(ids)
            residual = self.scale * (mean_product - b_mean @ a_mean)
            new[f"{name}.B"], new[f"{name}.A"] = b_mean.astype(np.float32), a_mean.astype(np.float32)
            new[f"{name}.base"] = (state[f"{name}.base"] + residual).astype(np.float32)
        return new | mean_head([replies[c] for c in ids])

    def delta_weights(self, state: State) -> dict[str, np.ndarray]:
        """base + s B A per layer: the merged global update."""
        return {name: state[f"{name}.base"] + self.scale * state[f"{name}.B"] @ state[f"{name}.A"]
                for name in self.problem.shapes}

    def evaluate(self, state: State, clients: dict[str, ClientContext], round_: int) -> dict[str, float]:
        return self.problem.evaluate(self.delta_weights(state), head_of(state))
