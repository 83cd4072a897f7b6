"""A small teacher–student FSLoRA problem (two adapted layers would need a deeper MLP; one is enough here)."""

import torch

from collabalign.data import dirichlet
from collabalign.experiments.fslora.teacher_student import teacher_student
from collabalign.lora import inject_lora
from collabalign.methods.fslora import device_ranks
from collabalign.methods.fslora.problems import LocalSGD, TorchLoRAProblem
from collabalign.seeding import Seeds

RANK = 8


def small_problem(n_devices=5, steps=3, lr=0.1, dim=12, classes=4, dtype=torch.float32):
    seeds = Seeds(0)
    student, train, test = teacher_student(seeds, 200, 100, dim=dim, classes=classes, update_rank=4)
    student = student.to(dtype)
    train.x, test.x = train.x.to(dtype), test.x.to(dtype)
    inject_lora(student, ["hidden"], rank=RANK)
    problem = TorchLoRAProblem(student, ["head.weight", "head.bias"], test, LocalSGD(steps, lr, batch_size=8))
    parts = dirichlet(train.y.numpy(), n_devices, 1.0, seeds.numpy("split"), min_size=8)
    clients = {f"d{i}": train[torch.as_tensor(p)] for i, p in enumerate(parts)}
    ranks = device_ranks(seeds, list(clients), RANK, (0.25, 0.5, 0.75))
    return problem, clients, ranks
