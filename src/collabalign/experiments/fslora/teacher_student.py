"""The synthetic teacher-student problem of docs/methods/fslora.md §8.2: a 'pretrained' MLP student and labels from
a teacher that differs from it by a low-rank update of its hidden layer."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from collabalign.methods.fslora.problems import ClassificationData
from collabalign.seeding import Seeds


class TeacherStudentMLP(nn.Module):
    """x -> head(tanh(hidden(x))): the §8.2 synthetic problem, with LoRA on `hidden`."""

    def __init__(self, dim: int, classes: int):
        super().__init__()
        self.hidden = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.tanh(self.hidden(x)))


def teacher_student(seeds: Seeds, n_train: int, n_test: int, dim: int = 64, classes: int = 10,
                    update_rank: int = 24, gumbel: float = 0.5) -> tuple[TeacherStudentMLP, ClassificationData,
                                                                          ClassificationData]:
    """A 'pretrained' student (W0, head) and labels from a teacher with W0 + a rank-`update_rank` update.

    Labels are argmax(teacher logits + gumbel * Gumbel noise); x ~ N(0, I). Returns (student, train, test).
    """
    gen = seeds.torch("teacher-student")
    student = TeacherStudentMLP(dim, classes)
    with torch.no_grad():
        student.hidden.weight.copy_(torch.randn(dim, dim, generator=gen) / math.sqrt(dim))
        student.hidden.bias.zero_()
        student.head.weight.copy_(torch.randn(classes, dim, generator=gen))  # logits ~ N(0, ~dim/3) >> Gumbel
        student.head.bias.zero_()
        teacher = TeacherStudentMLP(dim, classes)
        teacher.load_state_dict(student.state_dict())
        update = torch.randn(dim, update_rank, generator=gen) @ torch.randn(update_rank, dim, generator=gen)
        teacher.hidden.weight += update / math.sqrt(dim * update_rank)  # entries ~ N(0, 1/dim), like W0
        x = torch.randn(n_train + n_test, dim, generator=gen)
        noise = -torch.log(-torch.log(torch.rand(len(x), classes, generator=gen).clamp_min(1e-12)))
        y = (teacher(x) + gumbel * noise).argmax(-1)
    data = ClassificationData(x, y)
    return student, data[:n_train], data[n_train:]
