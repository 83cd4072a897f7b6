"""FSLoRA (Fang et al. 2025, Alg. 1): the server keeps rank-r factors; each round it draws a random-k_i sketch per
device and layer, the device trains only those k_i columns of B / rows of A (with the r/k_i factor: sliced
compute), uploads their change, and the server adds the mean over all N devices (eq. 5). Federated LoRA
(fedlora.py) is the same algorithm with k_i = r; HeteroLoRA (heterolora.py) is the same data flow with a fixed
prefix and no rescaling. Optional top-k compression of the upload (App. C.2) and the authors' code's server Adam
in place of eq. 5's plain averaged step. The seed the sketches are drawn from lives in the server state."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from collabalign.comm import Message, Params
from collabalign.federation.engine import ReplySpec
from collabalign.federation.protocol import ClientContext
from collabalign.methods.fslora.common import (
    HEAD,
    ServerStep,
    head_arrays,
    head_of,
    lora_scale,
    mean_head,
    scatter_mean,
)
from collabalign.methods.fslora.local_steps import LocalSteps
from collabalign.methods.fslora.problems import Factors, LocalJob, TorchLoRAProblem
from collabalign.seeding import Seeds

State = dict[str, np.ndarray]
SKETCH_SEED = "sketch/seed"  # server state only: the run's seed, from which every round's sketches are drawn


def sketch_indices(seeds: Seeds, round_: int, device: str, layer: str, rank: int, k: int) -> np.ndarray:
    """The k sorted column/row indices of S_i^t for one device and layer: uniform over k-subsets of [r],
    reproducible from (seed, round, device, layer); shared by that layer's B and A."""
    if k >= rank:
        return np.arange(rank, dtype=np.int32)
    rng = seeds.numpy("sketch", f"{round_}/{device}/{layer}")
    return np.sort(rng.choice(rank, size=k, replace=False)).astype(np.int32)


def top_k(matrix: np.ndarray, ratio: float) -> tuple[np.ndarray, np.ndarray]:
    """The ceil(ratio * size) entries of largest magnitude: (values float32, flat int32 indices)."""
    flat = matrix.ravel()
    keep = math.ceil(ratio * flat.size)
    idx = np.sort(np.argpartition(-np.abs(flat), keep - 1)[:keep]).astype(np.int32)
    return flat[idx].astype(np.float32), idx


def densify(values: np.ndarray, index: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    out = np.zeros(int(np.prod(shape)), dtype=np.float32)
    out[index] = values
    return out.reshape(shape)


class SubspaceLoRA(LocalSteps):
    """Global rank-r LoRA; device i trains the rank-k_i block at `indices(...)`; the server adds the mean block
    update over all participants. `random_blocks` + `rescale` = FSLoRA; prefix blocks, no rescale = HeteroLoRA;
    without `train_a` A stays at its random start and only B's update is sent (FFA-LoRA, `ffalora.py`). `server`
    steps from the averaged proposal instead of taking it (the authors' server Adam or a `federation.server_opt`
    rule)."""

    def __init__(self, problem: TorchLoRAProblem, ranks: dict[str, int], rank: int, alpha: float = 1.0,
                 random_blocks: bool = True, rescale: bool = True,
                 download: Literal["full", "submatrix"] = "full", upload_top_k: float | None = None,
                 server: ServerStep | None = None, train_a: bool = True):
        if any(not 1 <= k <= rank for k in ranks.values()):
            raise ValueError(f"every device rank must be in 1..{rank}, got {sorted(set(ranks.values()))}")
        self.problem, self.ranks, self.rank = problem, ranks, rank
        self.scale = lora_scale(alpha, rank)
        self.random_blocks, self.rescale = random_blocks, rescale
        self.download, self.upload_top_k = download, upload_top_k
        self.server, self.train_a = server, train_a

    def init(self, seeds: Seeds) -> State:
        """B = 0, A ~ PEFT's uniform init, drawn once by the server; a fresh head; the seed of the sketches."""
        gen = seeds.torch("lora-init")
        state: State = {SKETCH_SEED: np.array([seeds.seed], np.int64)}
        for name, (m, n) in self.problem.shapes.items():
            state[f"{name}.B"] = np.zeros((m, self.rank), np.float32)
            state[f"{name}.A"] = self.problem.init_a(gen, self.rank, n)
        return state | head_arrays(self.problem.init_head(seeds))

    def indices(self, seeds: Seeds, round_: int, device: str, layer: str) -> np.ndarray:
        """The block device `device` trains in layer `layer` this round: its sketch, or its first k_i ranks."""
        k = self.ranks[device]
        if self.random_blocks:
            return sketch_indices(seeds, round_, device, layer, self.rank, k)
        return np.arange(k, dtype=np.int32)

    def configure(self, state: State, round_: int, client_ids: list[str]) -> dict[str, Message]:
        out, seeds = {}, Seeds(int(state[SKETCH_SEED][0]))
        for cid in client_ids:
            arrays = {}
            for name in self.problem.shapes:
                B, A = state[f"{name}.B"], state[f"{name}.A"]
                idx = self.indices(seeds, round_, cid, name)
                arrays[f"{name}.B"], arrays[f"{name}.A"] = (B, A) if self.download == "full" else (B[:, idx], A[idx])
                if self.random_blocks and len(idx) < self.rank:
                    arrays[f"{name}.idx"] = idx
            out[cid] = Message(arrays | {k: v for k, v in state.items() if k.startswith("head/")},
                               {"round": round_, "k": self.ranks[cid]})
        return out

    def local_job(self, message: Message, client: ClientContext) -> LocalJob:
        k = message.meta["k"]
        blocks = {}
        for name in self.problem.shapes:
            B, A = message[f"{name}.B"], message[f"{name}.A"]
            if B.shape[1] != k:  # full download: take the block
                idx = message[f"{name}.idx"] if f"{name}.idx" in message else np.arange(k)
                B, A = B[:, idx], A[idx]
            blocks[name] = (B, A)
        scale = self.scale * (self.rank / k if self.rescale else 1.0)
        return LocalJob(blocks, head_of(message), scale, None, client.data, client.torch_rng, self.train_a)

    def reply(self, message: Message, job: LocalJob, trained: Factors, head: Params) -> Message:
        upload, k = {}, message.meta["k"]
        for name, (B, A) in job.factors.items():
            for key, delta in ((f"{name}.dB", trained[name][0] - B), (f"{name}.dA", trained[name][1] - A))[
                    :2 if self.train_a else 1]:
                if self.upload_top_k is None:
                    upload[key] = delta
                else:
                    upload[f"{key}.values"], upload[f"{key}.index"] = top_k(delta, self.upload_top_k)
        return Message(upload | head_arrays(head), {"k": k})

    def reply_spec(self, state: State, message: Message, cid: str) -> ReplySpec:
        """Per layer the updates of the device's k-block (dense, or top-k values and flat indices) and the trained
        head, measured from the sent one."""
        k, arrays = message.meta["k"], {}
        for name, (m, n) in self.problem.shapes.items():
            for key, shape in ((f"{name}.dB", (m, k)), (f"{name}.dA", (k, n)))[:2 if self.train_a else 1]:
                if self.upload_top_k is None:
                    arrays[key] = (shape, "<f4")
                else:
                    keep = (math.ceil(self.upload_top_k * shape[0] * shape[1]),)
                    arrays[f"{key}.values"], arrays[f"{key}.index"] = (keep, "<f4"), (keep, "<i4")
        head = {key: v for key, v in message.items() if key.startswith(HEAD)}
        return ReplySpec(arrays | {key: (v.shape, v.dtype.str) for key, v in head.items()}, head, count=False)

    def _delta(self, reply: Message, key: str, shape: tuple[int, int]) -> np.ndarray:
        if key in reply:
            return reply[key]
        return densify(reply[f"{key}.values"], reply[f"{key}.index"], shape)

    def aggregate(self, state: State, replies: dict[str, Message], round_: int) -> State:
        ids, new, seeds = sorted(replies), dict(state), Seeds(int(state[SKETCH_SEED][0]))
        for name, (m, n) in self.problem.shapes.items():
            idx = [self.indices(seeds, round_, cid, name) for cid in ids]
            d_b = [self._delta(replies[c], f"{name}.dB", (m, len(i))) for c, i in zip(ids, idx, strict=True)]
            new[f"{name}.B"] = (state[f"{name}.B"] + scatter_mean((m, self.rank), 1, d_b, idx, len(ids))).astype(
                np.float32)
            if self.train_a:
                d_a = [self._delta(replies[c], f"{name}.dA", (len(i), n)) for c, i in zip(ids, idx, strict=True)]
                new[f"{name}.A"] = (state[f"{name}.A"] + scatter_mean((self.rank, n), 0, d_a, idx, len(ids))).astype(
                    np.float32)
        new |= mean_head([replies[c] for c in ids])
        return new if self.server is None else self.server.step(state, new)

    def delta_weights(self, state: State) -> dict[str, np.ndarray]:
        """s * B A per layer: the unsketched global update that is evaluated."""
        return {name: self.scale * state[f"{name}.B"] @ state[f"{name}.A"] for name in self.problem.shapes}

    def evaluate(self, state: State, clients: dict[str, ClientContext], round_: int) -> dict[str, float]:
        return self.problem.evaluate(self.delta_weights(state), head_of(state))


def fslora(problem: TorchLoRAProblem, ranks: dict[str, int], rank: int, alpha: float = 1.0,
           download: Literal["full", "submatrix"] = "full", upload_top_k: float | None = None,
           server: ServerStep | None = None) -> SubspaceLoRA:
    """FSLoRA: random-k_i sketches with the r/k_i factor; download as in Alg. 1 ("full") or only the block."""
    return SubspaceLoRA(problem, ranks, rank, alpha, download=download, upload_top_k=upload_top_k,
                        server=server)
