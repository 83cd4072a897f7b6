"""Device and server cost of FSLoRA against the heterogeneous-rank LoRA baselines, from one run.

Setup: teacher-student MLP x -> head(tanh(hidden(x))), dim 512, 10 classes, LoRA on `hidden` with global rank
r = 256 (so at k = r the LoRA forward + backward is ~6k/dim = 3x the frozen base's forward); float32, 8 devices
with 512 samples each (an equal split), H = 10 local SGD steps of batch 128 per `client_update`.
Every `client_update` / server step is run on fixed inputs (the same messages, the same round seeds).

1. One device's `client_update` (H steps forward + backward on its rank-k block) and its upload bytes at
   k/r = 1/8, 1/4, 1/2, 1, relative to k = r. Goal: time ~ O(k) plus the fixed base cost (<= 0.5 at 1/8),
   upload = k/r (plus the head).
2. Per-round device time (the 8 devices' `client_update`s, summed) of FSLoRA vs HeteroLoRA with the same
   per-device ranks from `device_ranks` (paper ratios {1/8, 1/4, 1/2, 3/4}). Goal: ~1x.
3. Server time per round (configure + aggregate, round 2 so FlexLoRA does its per-layer SVD) of FlexLoRA and
   FedStackLoRA vs FSLoRA, and each method's mean per-device download bytes vs FSLoRA.

All times are medians of interleaved runs (timing.compare), so each ratio is measured side by side.
Run: OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python benchmarks/fslora_cost.py
"""

from __future__ import annotations

import time

import torch
from timing import compare

from collabalign.comm import Message
from collabalign.federation.protocol import ClientContext
from collabalign.lora import inject_lora
from collabalign.methods.fslora import FedStackLoRA, FlexLoRA, device_ranks, fslora, heterolora
from collabalign.methods.fslora.problems import TorchLoRAProblem, teacher_student
from collabalign.seeding import Seeds

DIM, CLASSES, RANK = 512, 10, 256
DEVICES, PER_DEVICE, STEPS, BATCH, LR = 8, 512, 10, 128, 0.05


def build():
    seeds = Seeds(0)
    student, train, test = teacher_student(seeds, DEVICES * PER_DEVICE, 64, dim=DIM, classes=CLASSES, update_rank=24)
    inject_lora(student, ["hidden"], rank=RANK)
    problem = TorchLoRAProblem(student, ["head.weight", "head.bias"], test, steps=STEPS, lr=LR, batch_size=BATCH)
    clients = {f"d{i}": train[i * PER_DEVICE:(i + 1) * PER_DEVICE] for i in range(DEVICES)}
    return seeds, problem, clients


class Run:
    """An algorithm driven by hand as the simulator does (tests' `one_round`), keeping client contexts."""

    def __init__(self, algorithm, clients, seeds: Seeds):
        self.algorithm, self.seeds = algorithm, seeds
        self.contexts = {cid: ClientContext(cid, data) for cid, data in clients.items()}
        self.ids = list(clients)
        self.state = algorithm.init(seeds)

    def device(self, cid: str, message: Message, round_: int) -> Message:
        ctx = self.contexts[cid]
        ctx.seed_round(self.seeds, round_)
        return self.algorithm.client_update(message, ctx)

    def round(self, round_: int) -> tuple[dict[str, Message], dict[str, Message]]:
        """Runs one round, advances the state; returns (messages, replies)."""
        messages = self.algorithm.configure(self.state, round_, self.ids)
        replies = {cid: self.device(cid, msg, round_) for cid, msg in messages.items()}
        self.state = self.algorithm.aggregate(self.state, replies, round_)
        return messages, replies


def device_step(seeds, problem, clients) -> None:
    cid = "d0"
    one = {cid: clients[cid]}
    runs, messages, uploads = {}, {}, {}
    for k in (RANK // 8, RANK // 4, RANK // 2, RANK):
        run = Run(fslora(problem, {cid: k}, RANK), one, seeds)
        messages[k] = run.algorithm.configure(run.state, 1, [cid])[cid]
        uploads[k] = run.device(cid, messages[k], 1).array_nbytes
        runs[k] = run
    times = compare({k: (lambda k=k: runs[k].device(cid, messages[k], 1)) for k in runs})
    print(f"1. one device's client_update: {STEPS} SGD steps x batch {BATCH}, FSLoRA rank-k block of r={RANK}")
    print(f"{'k/r':>8} {'ms':>8} {'time/(k=r)':>11} {'upload KiB':>11} {'upload/(k=r)':>13}")
    for k, t in times.items():
        print(f"{k / RANK:>8.3f} {t * 1e3:>8.1f} {t / times[RANK]:>11.2f} {uploads[k] / 1024:>11.1f} "
              f"{uploads[k] / uploads[RANK]:>13.3f}")


def round_device_time(seeds, problem, clients, ranks) -> None:
    algorithms = {"FSLoRA": fslora(problem, ranks, RANK), "FSLoRA (submatrix)": fslora(problem, ranks, RANK,
                                                                                     download="submatrix"),
                  "HeteroLoRA": heterolora(problem, ranks, RANK)}
    runs, messages = {}, {}
    for name, algorithm in algorithms.items():
        runs[name] = Run(algorithm, clients, seeds)
        messages[name] = runs[name].algorithm.configure(runs[name].state, 1, runs[name].ids)

    def all_devices(name: str) -> None:
        for cid, msg in messages[name].items():
            runs[name].device(cid, msg, 1)

    times = compare({name: (lambda n=name: all_devices(n)) for name in runs}, rounds=9)
    print(f"\n2. per-round device time, {DEVICES} devices summed, ranks k = {sorted(ranks.values())}")
    print(f"{'method':>20} {'ms':>8} {'/HeteroLoRA':>12}")
    for name, t in times.items():
        print(f"{name:>20} {t * 1e3:>8.1f} {t / times['HeteroLoRA']:>12.2f}")


def server_time(seeds, problem, clients, ranks) -> None:
    algorithms = {"FSLoRA": fslora(problem, ranks, RANK), "FSLoRA (submatrix)": fslora(problem, ranks, RANK,
                                                                                     download="submatrix"),
                  "FlexLoRA": FlexLoRA(problem, ranks, RANK), "FedStackLoRA": FedStackLoRA(problem, ranks, RANK)}
    runs, replies, down = {}, {}, {}
    for name, algorithm in algorithms.items():
        run = Run(algorithm, clients, seeds)
        run.round(1)
        messages = algorithm.configure(run.state, 2, run.ids)
        down[name] = sum(m.array_nbytes for m in messages.values()) / len(messages)
        replies[name] = {cid: run.device(cid, msg, 2) for cid, msg in messages.items()}
        runs[name] = run

    def configure(name: str) -> None:
        runs[name].algorithm.configure(runs[name].state, 2, runs[name].ids)

    def aggregate(name: str) -> None:
        runs[name].algorithm.aggregate(runs[name].state, replies[name], 2)

    candidates = {}
    for name in runs:
        candidates[(name, "configure")] = lambda n=name: configure(n)
        candidates[(name, "aggregate")] = lambda n=name: aggregate(n)
    times = compare(candidates, rounds=9)
    total = {name: times[(name, "configure")] + times[(name, "aggregate")] for name in runs}
    print(f"\n3. server per round (round 2), {DEVICES} devices; download = mean per device")
    print(f"{'method':>20} {'configure ms':>13} {'aggregate ms':>13} {'total/FSLoRA':>13} {'download KiB':>13} "
          f"{'/FSLoRA':>8}")
    for name in runs:
        print(f"{name:>20} {times[(name, 'configure')] * 1e3:>13.2f} {times[(name, 'aggregate')] * 1e3:>13.2f} "
              f"{total[name] / total['FSLoRA']:>13.2f} {down[name] / 1024:>13.1f} {down[name] / down['FSLoRA']:>8.2f}")


def main() -> None:
    torch.manual_seed(0)
    start = time.perf_counter()
    seeds, problem, clients = build()
    ranks = device_ranks(seeds, list(clients), RANK)
    print(f"teacher-student MLP dim {DIM}, r = {RANK}, torch threads {torch.get_num_threads()}; "
          f"medians of interleaved runs\n")
    device_step(seeds, problem, clients)
    round_device_time(seeds, problem, clients, ranks)
    server_time(seeds, problem, clients, ranks)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
