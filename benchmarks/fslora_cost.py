"""Device and server cost of FSLoRA against the heterogeneous-rank LoRA baselines, from one run.

Setup: teacher-student MLP x -> head(tanh(hidden(x))), dim 512, 10 classes, LoRA on `hidden` with global rank
r = 256 (at k = r the LoRA matmuls, 5 per step forward + backward, are 5k/dim = 2.5x the frozen base's one);
float32, one torch thread, 8 devices with 512 samples each (an equal split), H = 10 SGD steps of batch 128 per
`client_update`. Every timed call reruns on fixed inputs (the same messages, state and round seeds).

0. The same on the real model (MiniLM, LoRA in all 6 blocks, SST-2): there every rank pays the backward through
   the frozen blocks below the adapters, which LoRA off (head only) skips, so that floor is out of reach. Its floor
   is the frozen base with that backward (LoRA off, the embeddings' output requiring grad: every block's input
   gradient, no LoRA matmul) plus k/r of what LoRA at k = r adds to it.
1. One device's FSLoRA `client_update` (H steps forward + backward on its rank-k block) and its upload at
   k/r = 1/8, 1/4, 1/2, 1, relative to k = r, next to a floor: the same H steps with LoRA off (frozen base
   forward + head), which no rank can go below. Goal: the time above the floor ~ k/r (<= 0.3 at 1/8: sliced,
   not masked); LoRA upload = k/r exactly (the head, 20 KiB, is sent at every k).
2. Per-round device time (the 8 devices' `client_update`s, summed) of FSLoRA (Alg. 1's full download, and the
   submatrix download) vs HeteroLoRA with the same per-device ranks from `device_ranks` (paper ratios
   {1/8, 1/4, 1/2, 3/4}). Goal: ~1x (same block sizes; FSLoRA only adds a gather of its random block).
3. Server time per round (configure + aggregate at round 2, so FlexLoRA pays its per-layer SVD) of FlexLoRA and
   FedStackLoRA vs FSLoRA, and each method's mean per-device download vs FSLoRA's (Alg. 1 sends all of B, A).
4. The GLUE main config's cheaper step: one device's FSLoRA `client_update` at k = r (H = 8 AdamW steps of batch 16,
   SST-2) with LoRA in the top 3 blocks over the cached states of the 3 below, against LoRA in all 6 blocks.
5. Part 4's top-3 step with glue.precision bfloat16 (autocast; eager attention, as the problem sets it) against
   float32: bfloat16 units (AMX) make it cheaper; a CPU without them makes it dearer.

Times are medians of interleaved runs (timing.compare), so each ratio is measured side by side.
Run: OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python benchmarks/fslora_cost.py
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from timing import compare

from collabalign.comm import Message
from collabalign.experiments.fslora.teacher_student import teacher_student
from collabalign.federation.protocol import ClientContext
from collabalign.lora import inject_lora
from collabalign.methods.fslora import FedStackLoRA, FlexLoRA, device_ranks, fslora, heterolora
from collabalign.methods.fslora.common import head_of
from collabalign.methods.fslora.problems import LocalSGD, TorchLoRAProblem
from collabalign.seeding import Seeds

DIM, CLASSES, RANK = 512, 10, 256
DEVICES, PER_DEVICE, STEPS, BATCH, LR = 8, 512, 10, 128, 0.05


def build():
    seeds = Seeds(0)
    student, train, test = teacher_student(seeds, DEVICES * PER_DEVICE, 64, dim=DIM, classes=CLASSES, update_rank=24)
    inject_lora(student, ["hidden"], rank=RANK)
    problem = TorchLoRAProblem(student, ["head.weight", "head.bias"], test, LocalSGD(STEPS, LR, BATCH))
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


def lora_bytes(message: Message) -> int:
    return sum(a.nbytes for name, a in message.items() if not name.startswith("head/"))


def device_step(seeds, problem, clients, title: str) -> None:
    cid = "d0"
    one = {cid: clients[cid]}
    runs, messages, uploads = {}, {}, {}
    rank = next(iter(problem.layers.values())).rank
    for k in (rank // 8, rank // 4, rank // 2, rank):
        run = Run(fslora(problem, {cid: k}, rank), one, seeds)
        messages[k] = run.algorithm.configure(run.state, 1, [cid])[cid]
        uploads[k] = run.device(cid, messages[k], 1)
        runs[k] = run
    ctx = ClientContext(cid, clients[cid])

    def lora_off() -> None:  # the same local_train with the LoRA layer disabled (factors=None)
        ctx.seed_round(seeds, 1)
        problem.local_train(None, head_of(messages[rank]), 1.0, None, ctx.data, ctx.torch_rng)

    candidates = {k: (lambda k=k: runs[k].device(cid, messages[k], 1)) for k in runs} | {"off": lora_off}
    backbone = getattr(getattr(problem.model, "pooled", None), "backbone", None)  # the real model's encoder
    if backbone is not None:
        candidates["backprop"] = lambda: with_backprop(backbone.embeddings, lora_off)
    times = compare(candidates, rounds=7 if title.startswith("real") else 15)
    full, floor = times[rank], times.get("backprop", times["off"])
    print(f"{title}: one device's FSLoRA client_update, {problem.sgd.steps} SGD steps x batch "
          f"{problem.sgd.batch_size} on a rank-k block of r={rank};\n"
          f"its floor = {'base with backprop' if 'backprop' in times else 'LoRA off'} + k/r x (k = r minus it)")
    print(f"{'k/r':>8} {'ms':>8} {'time/(k=r)':>11} {'above floor':>12} {'floor ms':>9} {'x floor':>8} "
          f"{'upload KiB':>11} {'LoRA upload':>12}")
    for k in runs:
        at_k = floor + k / rank * (full - floor)
        print(f"{k / rank:>8.3f} {times[k] * 1e3:>8.1f} {times[k] / full:>11.2f} "
              f"{(times[k] - floor) / (full - floor):>12.2f} {at_k * 1e3:>9.1f} {times[k] / at_k:>8.2f} "
              f"{uploads[k].array_nbytes / 1024:>11.1f} {lora_bytes(uploads[k]) / lora_bytes(uploads[rank]):>12.3f}")
    print(f"{'LoRA off':>8} {times['off'] * 1e3:>8.1f} {times['off'] / full:>11.2f}   (base forward + head, no LoRA)")
    if "backprop" in times:
        print(f"{'backprop':>8} {floor * 1e3:>8.1f} {floor / full:>11.2f}   (the same with the backward through "
              "every frozen block: the floor)")
    print("(time/(k=r) and 'above floor' = (t - floor)/(t_r - floor) are relative to k = r; upload KiB includes "
          "the head, 'LoRA upload' is dB, dA alone relative to k = r)")


def with_backprop(embeddings: torch.nn.Module, run) -> None:
    """run() with the embeddings' output requiring grad, so the backward passes through every frozen block."""
    handle = embeddings.register_forward_hook(lambda module, inputs, out: out.requires_grad_())
    try:
        run()
    finally:
        handle.remove()


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

    times = compare({name: (lambda n=name: all_devices(n)) for name in runs})
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
    times = compare(candidates)
    total = {name: times[(name, "configure")] + times[(name, "aggregate")] for name in runs}
    print(f"\n3. server per round (round 2), {DEVICES} devices; download = mean per device")
    print(f"{'method':>20} {'configure ms':>13} {'aggregate ms':>13} {'total/FSLoRA':>13} {'download KiB':>13} "
          f"{'/FSLoRA':>8}")
    for name in runs:
        print(f"{name:>20} {times[(name, 'configure')] * 1e3:>13.2f} {times[(name, 'aggregate')] * 1e3:>13.2f} "
              f"{total[name] / total['FSLoRA']:>13.2f} {down[name] / 1024:>13.1f} {down[name] / down['FSLoRA']:>8.2f}")


def real_model(blocks: int = 6, sgd: LocalSGD | None = None, precision: str = "float32"
               ) -> tuple[Seeds, TorchLoRAProblem, dict]:
    """FSLoRA's GLUE device on the real model: all-MiniLM-L6-v2 with LoRA (r = 32, no dropout) on query/value of the
    top `blocks` blocks, SST-2 sentences cut at 48 tokens, the main config's H = 8 steps of batch 16, matrix products
    in `precision`."""
    from collabalign.data.paths import shared_data_dir
    from collabalign.methods.fslora.glue import GlueSetup, glue_problem
    from collabalign.models.backbones import minilm_l6

    setup = GlueSetup(rank=32, sgd=sgd or LocalSGD(8, 0.01, 16), max_train=512, max_length=48, lora_blocks=blocks,
                      max_test=64, precision=precision)
    problem, train = glue_problem("SST-2", shared_data_dir() / "glue", minilm_l6(), setup, Seeds(0))
    return Seeds(0), problem, {"d0": train}


def top_block_steps(variants: dict) -> dict:
    """Median seconds of one device's FSLoRA `client_update` at k = r = 32 (8 AdamW steps x batch 16, lr 1e-3, as
    the main config) per variant: name -> (LoRA blocks, precision), timed side by side."""
    runs, messages = {}, {}
    for name, (blocks, precision) in variants.items():
        seeds, problem, clients = real_model(blocks, LocalSGD(8, 1e-3, 16, optimizer="adamw"), precision)
        runs[name] = Run(fslora(problem, {"d0": 32}, 32), clients, seeds)
        messages[name] = runs[name].algorithm.configure(runs[name].state, 1, ["d0"])["d0"]
    return compare({n: (lambda n=n: runs[n].device("d0", messages[n], 1)) for n in runs}, rounds=7)


def cached_trunk() -> None:
    """Part 4: LoRA in the top 3 blocks over cached trunk states against LoRA in all 6 (AdamW, as the main config)."""
    times = top_block_steps({6: (6, "float32"), 3: (3, "float32")})
    print(f"\n4. GLUE device step (SST-2, 8 AdamW steps x batch 16, k = r = 32): LoRA in all 6 blocks "
          f"{times[6] * 1e3:.0f} ms, top 3 over cached states {times[3] * 1e3:.0f} ms: {times[3] / times[6]:.2f}")


def bfloat16_step() -> None:
    """Part 5: part 4's top-3-block device step with its matrix products in bfloat16 (autocast) against float32."""
    times = top_block_steps({p: (3, p) for p in ("float32", "bfloat16")})
    print(f"\n5. Part 4's top-3 step, products in bfloat16 {times['bfloat16'] * 1e3:.0f} ms against float32 "
          f"{times['float32'] * 1e3:.0f} ms: {times['bfloat16'] / times['float32']:.2f} (CPU with AMX: "
          f"{cpu_has('amx_bf16')})")


def cpu_has(flag: str) -> bool | None:
    """Whether /proc/cpuinfo lists `flag` (None where there is no such file)."""
    info = Path("/proc/cpuinfo")
    return flag in info.read_text() if info.exists() else None


def main() -> None:
    torch.manual_seed(0)
    start = time.perf_counter()
    device_step(*real_model(), "real model (MiniLM, SST-2)")
    seeds, problem, clients = build()
    ranks = device_ranks(seeds, list(clients), RANK)
    print(f"\nteacher-student MLP dim {DIM}, r = {RANK}, torch threads {torch.get_num_threads()}; "
          f"medians of interleaved runs\n")
    device_step(seeds, problem, clients, "1. teacher-student MLP")
    round_device_time(seeds, problem, clients, ranks)
    server_time(seeds, problem, clients, ranks)
    cached_trunk()
    bfloat16_step()
    print(f"\ntotal {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
