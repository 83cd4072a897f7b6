"""FlexLoRA (Bai et al. 2024) as compared in FSLoRA: the server keeps the full update dW = (1/N) sum_i s B_i A_i,
and each round hands device i the best rank-k_i approximation of it (truncated SVD). Sigma goes all into B (the
authors' code) or, with `sigma_split="sqrt"`, sqrt(Sigma) into each factor: the same product, other SGD dynamics."""

from __future__ import annotations

from typing import Literal

import numpy as np

from collabalign.comm import Message, Params
from collabalign.federation.engine import ReplySpec
from collabalign.federation.protocol import ClientContext
from collabalign.methods.fslora.common import head_arrays, head_of, lora_scale, mean_head
from collabalign.methods.fslora.local_steps import LocalSteps
from collabalign.methods.fslora.problems import Factors, LocalJob, TorchLoRAProblem
from collabalign.seeding import Seeds

State = dict[str, np.ndarray]


class FlexLoRA(LocalSteps):
    def __init__(self, problem: TorchLoRAProblem, ranks: dict[str, int], rank: int, alpha: float = 1.0,
                 sigma_split: Literal["B", "sqrt"] = "B"):
        self.problem, self.ranks, self.rank = problem, ranks, rank
        self.scale = lora_scale(alpha, rank)
        self.sigma_split = sigma_split

    def init(self, seeds: Seeds) -> State:
        """dW = 0; A0 (r, n) is the common random init that round 1 hands out (SVD of 0 is degenerate)."""
        gen = seeds.torch("lora-init")
        state: State = {}
        for name, (m, n) in self.problem.shapes.items():
            state[f"{name}.dW"] = np.zeros((m, n), np.float32)
            state[f"{name}.A0"] = self.problem.init_a(gen, self.rank, n)
        return state | head_arrays(self.problem.init_head(seeds))

    def configure(self, state: State, round_: int, client_ids: list[str]) -> dict[str, Message]:
        factors = {}
        for name, (m, _) in self.problem.shapes.items():
            if round_ == 1:
                factors[name] = (np.zeros((m, self.rank), np.float32), state[f"{name}.A0"])
            else:  # one SVD per layer per round, truncated per device below
                u, sigma, vt = np.linalg.svd(state[f"{name}.dW"].astype(np.float64), full_matrices=False)
                r = min(self.rank, len(sigma))
                factors[name] = self._split(u[:, :r], sigma[:r], vt[:r])
        head = {k: v for k, v in state.items() if k.startswith("head/")}
        out = {}
        for cid in client_ids:
            k = self.ranks[cid]
            arrays = {}
            for name, (B, A) in factors.items():
                arrays[f"{name}.B"], arrays[f"{name}.A"] = B[:, :k], A[:k]
            out[cid] = Message(arrays | head, {"round": round_, "k": k})
        return out

    def _split(self, u: np.ndarray, sigma: np.ndarray, vt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(B, A) with s B A = U diag(sigma) Vt."""
        if self.sigma_split == "B":
            return (u * sigma / self.scale).astype(np.float32), vt.astype(np.float32)
        root = np.sqrt(sigma / self.scale)
        return (u * root).astype(np.float32), (root[:, None] * vt).astype(np.float32)

    def local_job(self, message: Message, client: ClientContext) -> LocalJob:
        blocks = {name: (message[f"{name}.B"], message[f"{name}.A"]) for name in self.problem.shapes}
        return LocalJob(blocks, head_of(message), self.scale, None, client.data, client.torch_rng)

    def reply(self, message: Message, job: LocalJob, trained: Factors, head: Params) -> Message:
        arrays = {}
        for name, (B, A) in trained.items():
            arrays[f"{name}.B"], arrays[f"{name}.A"] = B, A
        return Message(arrays | head_arrays(head), {"k": message.meta["k"]})

    def reply_spec(self, state: State, message: Message, cid: str) -> ReplySpec:
        """The sent factors and head come back trained; no sample count (devices are averaged uniformly)."""
        return ReplySpec.mirror(message, count=False)

    def aggregate(self, state: State, replies: dict[str, Message], round_: int) -> State:
        """dW = (1/N) sum_i s B_i A_i = (s/N) [B_1 ... B_N] [A_1; ...; A_N]: one product of the stacked factors."""
        ids = sorted(replies)
        new = dict(state)
        for name in self.problem.shapes:
            b = np.concatenate([replies[c][f"{name}.B"] for c in ids], axis=1).astype(np.float64)
            a = np.concatenate([replies[c][f"{name}.A"] for c in ids], axis=0).astype(np.float64)
            new[f"{name}.dW"] = (self.scale / len(ids) * b @ a).astype(np.float32)
        return new | mean_head([replies[c] for c in ids])

    def delta_weights(self, state: State) -> dict[str, np.ndarray]:
        """The full averaged update dW per layer (not truncated to rank r)."""
        return {name: state[f"{name}.dW"] for name in self.problem.shapes}

    def evaluate(self, state: State, clients: dict[str, ClientContext], round_: int) -> dict[str, float]:
        return self.problem.evaluate(self.delta_weights(state), head_of(state))
