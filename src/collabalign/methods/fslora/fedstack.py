"""FedStackLoRA (FLoRA, Wang et al. 2024) as compared in FSLoRA: devices train fresh rank-k_i LoRA each round;
the server stacks all devices' factors (A weighted 1/N) and broadcasts the stack; every device merges
s * B_stack A_stack into its own copy of the base weights. Download grows with N; needs full participation."""

from __future__ import annotations

import numpy as np

from collabalign.comm import Message, Params
from collabalign.federation.engine import ReplySpec
from collabalign.federation.protocol import ClientContext
from collabalign.methods.fslora.common import HEAD, head_arrays, head_of, lora_scale, mean_head
from collabalign.methods.fslora.local_steps import LocalSteps
from collabalign.methods.fslora.problems import Factors, LocalJob, TorchLoRAProblem
from collabalign.seeding import Seeds

State = dict[str, np.ndarray]


class FedStackLoRA(LocalSteps):
    def __init__(self, problem: TorchLoRAProblem, ranks: dict[str, int], rank: int, alpha: float = 1.0):
        self.problem, self.ranks = problem, ranks
        self.scale = lora_scale(alpha, rank)

    def init(self, seeds: Seeds) -> State:
        """The server's merged update D (for evaluation) starts at 0; no stack exists before round 1."""
        state = {f"{name}.D": np.zeros(shape, np.float32) for name, shape in self.problem.shapes.items()}
        return state | head_arrays(self.problem.init_head(seeds))

    def configure(self, state: State, round_: int, client_ids: list[str]) -> dict[str, Message]:
        if sorted(client_ids) != sorted(self.ranks):
            raise ValueError("FedStackLoRA needs every device in every round (each merges every stack)")
        stack = {k: v for k, v in state.items() if k.endswith((".B_stack", ".A_stack")) or k.startswith("head/")}
        return {cid: Message(stack, {"round": round_, "k": self.ranks[cid]}) for cid in client_ids}

    def local_job(self, message: Message, client: ClientContext) -> LocalJob:
        k = message.meta["k"]
        merged = client.state or {name: np.zeros(shape, np.float32) for name, shape in self.problem.shapes.items()}
        blocks = {}
        for name, (m, n) in self.problem.shapes.items():
            if f"{name}.B_stack" in message:
                merged[name] = merged[name] + self.scale * message[f"{name}.B_stack"] @ message[f"{name}.A_stack"]
            blocks[name] = (np.zeros((m, k), np.float32), self.problem.init_a(client.torch_rng, k, n))
        client.state = merged
        return LocalJob(blocks, head_of(message), self.scale, merged, client.data, client.torch_rng)

    def reply(self, message: Message, job: LocalJob, trained: Factors, head: Params) -> Message:
        k, arrays = message.meta["k"], {}
        for name, (B, A) in trained.items():
            arrays[f"{name}.B"], arrays[f"{name}.A"] = B, A
        return Message(arrays | head_arrays(head), {"k": k})

    def reply_spec(self, state: State, message: Message, cid: str) -> ReplySpec:
        """The device's fresh rank-k factors per layer and its trained head (measured from the sent one)."""
        k, arrays = message.meta["k"], {}
        for name, (m, n) in self.problem.shapes.items():
            arrays[f"{name}.B"], arrays[f"{name}.A"] = ((m, k), "<f4"), ((k, n), "<f4")
        head = {key: state[key] for key in state if key.startswith(HEAD)}
        return ReplySpec(arrays | {key: (v.shape, v.dtype.str) for key, v in head.items()}, head, count=False)

    def aggregate(self, state: State, replies: dict[str, Message], round_: int) -> State:
        ids = sorted(replies)
        new = dict(state)
        for name in self.problem.shapes:
            b_stack = np.concatenate([replies[c][f"{name}.B"] for c in ids], axis=1)
            a_stack = np.concatenate([replies[c][f"{name}.A"] for c in ids], axis=0) / len(ids)
            new[f"{name}.B_stack"], new[f"{name}.A_stack"] = b_stack, a_stack.astype(np.float32)
            new[f"{name}.D"] = (state[f"{name}.D"] + self.scale * b_stack @ a_stack).astype(np.float32)
        return new | mean_head([replies[c] for c in ids])

    def delta_weights(self, state: State) -> dict[str, np.ndarray]:
        """The merged update D per layer (the base is W0 + D)."""
        return {name: state[f"{name}.D"] for name in self.problem.shapes}

    def evaluate(self, state: State, clients: dict[str, ClientContext], round_: int) -> dict[str, float]:
        return self.problem.evaluate(self.delta_weights(state), head_of(state))
