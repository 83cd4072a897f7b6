"""FSLoRA's second setup (LLaMA-3.2-3B on commonsense reasoning) as a `TorchLoRAProblem`: a causal LM with LoRA
and no head, trained by next-token cross-entropy on the answer tokens only and scored by greedy generation and
answer extraction, per task. Data rows are indices into examples tokenised once (train and test in one store)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from collabalign.comm import Params
from collabalign.data.commonsense import (
    CommonsenseExample,
    commonsense_prompt,
    extract_answer,
    load_commonsense,
    load_commonsense_test,
)
from collabalign.lora.inject import inject_lora
from collabalign.methods.fslora.problems import ClassificationData, LocalSGD, TorchLoRAProblem
from collabalign.models.backbones import Backbone
from collabalign.seeding import Seeds


@dataclass(frozen=True)
class CommonsenseSetup:
    """Commonsense170K (`train_file`, a seeded `max_train` subset when given) for training, the first `max_test`
    rows of each task's test set under `test_root` for evaluation, LoRA of global rank `rank` on `targets` of every
    block, prompts + answers cut at `max_length` tokens, `max_new_tokens` generated per test prompt."""

    train_file: str | Path
    test_root: str | Path
    tasks: Sequence[str]
    rank: int
    sgd: LocalSGD
    targets: Sequence[str] = ("q_proj", "k_proj", "v_proj", "up_proj", "down_proj")
    max_train: int | None = None
    max_test: int | None = None
    max_length: int = 256
    max_new_tokens: int = 10
    device: str = "cpu"


@dataclass
class PromptAnswerTokens:
    """Right-padded token ids of prompt + answer + EOS per example, with each sequence's length and prompt length."""

    input_ids: Tensor  # (N, L)
    lengths: Tensor  # (N,)
    prompt_lengths: Tensor  # (N,)
    pad_id: int

    def training_batch(self, rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(ids, attention mask, answer mask) of `rows`, cut to their longest sequence."""
        lengths, starts = self.lengths[rows], self.prompt_lengths[rows]
        pos = torch.arange(int(lengths.max()))[None]
        mask = pos < lengths[:, None]
        return self.input_ids[rows, : pos.shape[1]], mask.long(), mask & (pos >= starts[:, None])

    def prompts(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        """Left-padded prompt ids and attention mask of `rows`: what generation continues from."""
        starts = self.prompt_lengths[rows]
        width = int(starts.max())
        src = torch.arange(width)[None] - (width - starts)[:, None]  # position in the stored row; < 0 = padding
        real = src >= 0
        ids = self.input_ids[rows].gather(1, src.clamp(min=0))
        return torch.where(real, ids, self.pad_id), real.long()


def encode(tokenizer, examples: Sequence[CommonsenseExample], max_length: int) -> PromptAnswerTokens:
    """Tokenise prompt and output separately (so training and generation see the same prompt ids), append EOS, and
    cut long prompts from the left so the answer always survives the `max_length` cutoff."""
    prompts = tokenizer([commonsense_prompt(e) for e in examples])["input_ids"]
    answers = tokenizer([e.output for e in examples], add_special_tokens=False)["input_ids"]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((len(examples), max_length), pad_id, dtype=torch.long)
    lengths, starts = [], []
    for i, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
        answer = (answer + [tokenizer.eos_token_id])[: max_length - 1]
        prompt = prompt[max(0, len(prompt) + len(answer) - max_length):]
        ids[i, : len(prompt) + len(answer)] = torch.tensor(prompt + answer)
        lengths.append(len(prompt) + len(answer))
        starts.append(len(prompt))
    width = max(lengths)
    return PromptAnswerTokens(ids[:, :width], torch.tensor(lengths), torch.tensor(starts), pad_id)


class CommonsenseProblem(TorchLoRAProblem):
    """LoRA on a causal LM, no head: loss = cross-entropy of the answer tokens given the prompt; `evaluate` generates
    `max_new_tokens` greedily per test prompt, extracts the task's answer label and reports accuracy per task and
    their plain mean (the paper's Avg.). `test.y` holds each test row's task index into `tasks`."""

    batched = False  # the loss is a mean over answer tokens: devices train one after another

    def __init__(self, model: nn.Module, tokenizer, tokens: PromptAnswerTokens, answers: list[str],
                 test: ClassificationData, setup: CommonsenseSetup, eval_batch_size: int = 64):
        super().__init__(model, [], test, setup.sgd, eval_batch_size=eval_batch_size, device=setup.device)
        self.tokenizer, self.tokens, self.answers, self.tasks = tokenizer, tokens, answers, list(setup.tasks)
        self.max_new_tokens = setup.max_new_tokens

    def _answer_logits(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        """Logits at the positions that predict answer tokens, and those tokens: the LM head runs only there."""
        ids, mask, answer = (t.to(self.device) for t in self.tokens.training_batch(rows.cpu()))
        hidden = self.model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
        keep = answer[:, 1:]  # token t + 1 is an answer token: predicted from position t
        return self.model.get_output_embeddings()(hidden[:, :-1][keep]).float(), ids[:, 1:][keep]

    def loss(self, batch: ClassificationData) -> Tensor:
        return F.cross_entropy(*self._answer_logits(batch.x))

    def generate(self, rows: Tensor) -> list[str]:
        """Greedy continuations of the rows' prompts (one left-padded batch), decoded without special tokens."""
        from transformers import GenerationConfig

        ids, mask = self.tokens.prompts(rows.cpu())
        config = GenerationConfig(max_new_tokens=self.max_new_tokens, do_sample=False, pad_token_id=self.tokens.pad_id,
                                  eos_token_id=self.tokenizer.eos_token_id)
        out = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                  generation_config=config)
        return self.tokenizer.batch_decode(out[:, ids.shape[1]:].cpu(), skip_special_tokens=True)

    @torch.no_grad()
    def evaluate(self, delta: dict[str, np.ndarray], head: Params) -> dict[str, float]:
        """Accuracy per task (`accuracy/<task>`), their mean (`accuracy`) and the answer-token loss of W0 + delta."""
        self.load(None, head, 1.0, delta)
        rows, task_of = self.test.x, self.test.y.tolist()
        order = torch.argsort(self.tokens.prompt_lengths[rows], descending=True, stable=True)  # similar lengths batch
        texts, loss_sum, n_tokens = [""] * len(rows), 0.0, 0
        for start in range(0, len(rows), self.eval_batch_size):
            chunk = order[start:start + self.eval_batch_size]
            for i, text in zip(chunk.tolist(), self.generate(rows[chunk]), strict=True):
                texts[i] = text
            logits, targets = self._answer_logits(rows[chunk])
            loss_sum += float(F.cross_entropy(logits, targets, reduction="sum"))
            n_tokens += len(targets)
        correct = np.array([extract_answer(self.tasks[t], text) == self.answers[r]
                            for r, t, text in zip(rows.tolist(), task_of, texts, strict=True)])
        task_of = np.asarray(task_of)
        per_task = {f"accuracy/{task}": float(correct[task_of == i].mean()) for i, task in enumerate(self.tasks)}
        return {"accuracy": float(np.mean(list(per_task.values()))), **per_task, "loss": loss_sum / n_tokens}


def commonsense_problem(setup: CommonsenseSetup, backbone: Backbone,
                        seeds: Seeds) -> tuple[CommonsenseProblem, ClassificationData]:
    """The setup's problem on a float32 copy of the causal LM; returns (problem, training data), training rows
    carrying task index -1 (the tasks are mixed)."""
    if not backbone.causal:
        raise ValueError("the commonsense problem needs a causal LM backbone")
    train, max_train = load_commonsense(setup.train_file), setup.max_train
    if max_train is not None and max_train < len(train):
        train = [train[i] for i in np.sort(seeds.numpy("commonsense-subset").permutation(len(train))[:max_train])]
    tests = [load_commonsense_test(setup.test_root, task)[:setup.max_test] for task in setup.tasks]
    examples = train + [e for test in tests for e in test]
    model = copy.deepcopy(backbone.model).float()  # the caller's model stays; fp32 so small SGD steps register
    inject_lora(model, list(setup.targets), setup.rank)
    task_ids = [-1] * len(train) + [i for i, test in enumerate(tests) for _ in test]
    data = ClassificationData(torch.arange(len(examples)), torch.tensor(task_ids))
    tokens = encode(backbone.tokenizer, examples, setup.max_length)
    problem = CommonsenseProblem(model, backbone.tokenizer, tokens, [e.answer for e in examples], data[len(train):],
                                 setup=setup)
    return problem, data[: len(train)]
