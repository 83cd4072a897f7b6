"""Text-level rewards in [0, 1] for FIRM's objectives: r(prompt, reply) = sigmoid(logit), per sample and stateless.

- `FeatureReward`: features of (prompt, reply) (a frozen MiniLM's mean-pooled embeddings, text statistics, length)
  into a linear head fitted by `fit_logistic` (P(safe | prompt, reply)) or `fit_bradley_terry` (pairs).
- `HFRewardModel`: any Hugging Face sequence-classification reward model by name or path (the paper's Ray2333
  GPT-2 reward models), reading "\\n\\nHuman: {prompt}\\n\\nAssistant: {response}".
- `check_tokenizers`: the one-line error for a reward model that reads the policy's token ids but was built with
  another tokeniser. Text-level rewards re-tokenise and need no such check.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression

from collabalign.data.words import WORD
from collabalign.models.backbones import Backbone, minilm_l6
from collabalign.models.pooled import tokenize

HH_TEMPLATE = "\n\nHuman: {prompt}\n\nAssistant: {response}"
TOKENIZER_PROBES = ("Hello, world!", "\n\nHuman: How do I bake bread?\n\nAssistant: Sure.", "naïve café 1234 ü")


@runtime_checkable
class TextReward(Protocol):
    """A reward of (prompt, reply) texts: shape (B,), values in [0, 1], each sample scored on its own."""

    name: str

    def __call__(self, prompts: Sequence[str], responses: Sequence[str]) -> np.ndarray: ...


def sigmoid(x: np.ndarray) -> np.ndarray:
    """The logistic function, overflow-free, as float64."""
    x = np.asarray(x, dtype=np.float64)
    return np.exp(-np.logaddexp(0.0, -x))


class SentenceEncoder:
    """A frozen encoder (all-MiniLM-L6-v2 by default): L2-normalised mean-pooled embeddings, float32, batched over
    texts sorted by length (so a batch pays for little padding); identical texts are encoded once per call.
    Texts encoded with `remember=True` (training texts, the fixed prompt set) are kept and never encoded again."""

    def __init__(self, backbone: Backbone | None = None, max_length: int = 256, batch_size: int = 32):
        self.backbone = backbone or minilm_l6()
        self.max_length = max_length
        self.batch_size = batch_size
        self.memo: dict[str, np.ndarray] = {}

    def __call__(self, texts: Sequence[str], remember: bool = False) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self.memo]
        fresh = dict(zip(missing, self._encode(missing), strict=True))
        if remember:
            self.memo.update(fresh)
        dim = self.backbone.model.config.hidden_size
        return np.stack([self.memo[t] if t in self.memo else fresh[t] for t in texts]) if texts else np.zeros(
            (0, dim), dtype=np.float32)

    @torch.no_grad()
    def _encode(self, texts: list[str]) -> list[np.ndarray]:
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: list[np.ndarray] = [np.empty(0)] * len(texts)
        for start in range(0, len(order), self.batch_size):
            rows = order[start:start + self.batch_size]
            tokens = tokenize(self.backbone.tokenizer, [texts[i] for i in rows], self.max_length,
                              truncation_side="right").trimmed()
            hidden = self.backbone.model(input_ids=tokens.input_ids,
                                         attention_mask=tokens.attention_mask).last_hidden_state
            mask = tokens.attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1), dim=-1)
            for i, vector in zip(rows, pooled.numpy(), strict=True):
                out[i] = vector
        return out


_LIST_ITEM = re.compile(r"(?m)^\s*(?:\d+\.|-|\*)\s")
_SENTENCE_END = re.compile(r"[.!?](?:\s|$)")
REFUSAL_WORDS = frozenset("sorry cannot can't unable illegal unethical inappropriate advise against shouldn't".split())
STYLE_FEATURES = ("log_words", "log_chars", "log_lines", "log_list_items", "refusal_share", "questions",
                  "distinct_word_share", "mean_word_length", "prompt_word_recall", "log_sentences")


def style_features(prompts: Sequence[str], responses: Sequence[str]) -> np.ndarray:
    """Text statistics of each reply (STYLE_FEATURES, in order): length, layout, refusal words, lexical variety and
    how many of the prompt's words the reply reuses."""
    rows = []
    for prompt, reply in zip(prompts, responses, strict=True):
        words = WORD.findall(reply.lower())
        asked = set(WORD.findall(prompt.lower()))
        n = max(len(words), 1)
        rows.append([np.log1p(len(words)), np.log1p(len(reply)), np.log1p(reply.count("\n")),
                     np.log1p(len(_LIST_ITEM.findall(reply))), sum(w in REFUSAL_WORDS for w in words) / n,
                     reply.count("?"), len(set(words)) / n, sum(map(len, words)) / n,
                     len(asked & set(words)) / max(len(asked), 1), np.log1p(len(_SENTENCE_END.findall(reply)))])
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), len(STYLE_FEATURES))


def log_length(responses: Sequence[str]) -> np.ndarray:
    """log(1 + characters) of each reply, shape (B, 1)."""
    return np.log1p(np.array([len(r) for r in responses], dtype=np.float64))[:, None]


# Feature sets by name: (needs the encoder, builder(encoder, prompts, responses) -> (B, d) float64).
FEATURE_SETS = {
    "length": (False, lambda enc, p, r: log_length(r)),
    "style": (False, lambda enc, p, r: style_features(p, r)),
    "reply": (True, lambda enc, p, r: enc(r).astype(np.float64)),
    "reply_prompt": (True, lambda enc, p, r: _reply_prompt(enc, p, r)),
    "length_reply_prompt": (True, lambda enc, p, r: np.hstack([log_length(r), _reply_prompt(enc, p, r)])),
}


def _reply_prompt(encoder: SentenceEncoder, prompts: Sequence[str], responses: Sequence[str]) -> np.ndarray:
    """[e(reply), e(prompt) * e(reply)]: what the reply says, and how it lines up with what was asked. Prompts (a
    fixed set during training) are remembered by the encoder."""
    er = encoder(responses).astype(np.float64)
    return np.hstack([er, encoder(prompts, remember=True).astype(np.float64) * er])


def features(name: str, prompts: Sequence[str], responses: Sequence[str],
             encoder: SentenceEncoder | None = None) -> np.ndarray:
    """The feature set `name` (a FEATURE_SETS key) of each (prompt, reply)."""
    if name not in FEATURE_SETS:
        raise ValueError(f"unknown feature set {name!r}; choose from {sorted(FEATURE_SETS)}")
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    needs_encoder, build = FEATURE_SETS[name]
    if needs_encoder and encoder is None:
        raise ValueError(f"feature set {name!r} needs a sentence encoder")
    return build(encoder, prompts, responses)


@dataclass(frozen=True)
class LinearHead:
    """logit(x) = ((x - mean) / scale) . weight + bias."""

    mean: np.ndarray
    scale: np.ndarray
    weight: np.ndarray
    bias: float

    def logit(self, x: np.ndarray) -> np.ndarray:
        return ((x - self.mean) / self.scale) @ self.weight + self.bias


def standardiser(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature mean and scale (std, 1 where a feature is constant), to standardise x as (x - mean) / scale."""
    scale = x.std(0)
    return x.mean(0), np.where(scale > 1e-8, scale, 1.0)


def fit_logistic(x: np.ndarray, y: np.ndarray, c: float) -> LinearHead:
    """P(y = 1 | x) by L2-regularised logistic regression (inverse strength `c`) on standardised features;
    deterministic (lbfgs)."""
    mean, scale = standardiser(x)
    model = LogisticRegression(C=c, max_iter=5000).fit((x - mean) / scale, np.asarray(y, dtype=int))
    return LinearHead(mean, scale, model.coef_[0].astype(np.float64), float(model.intercept_[0]))


def fit_bradley_terry(x_chosen: np.ndarray, x_rejected: np.ndarray, c: float) -> LinearHead:
    """A linear Bradley–Terry reward from pairs: P(chosen > rejected) = sigmoid(r(chosen) - r(rejected)), fitted as
    L2-regularised logistic regression without intercept on both orders of each difference. The reward's level
    is free under BT; it is set so the training replies' mean logit is 0 (their rewards centre on 0.5)."""
    mean, scale = standardiser(np.vstack([x_chosen, x_rejected]))
    diff = (x_chosen - x_rejected) / scale
    y = np.r_[np.ones(len(diff)), np.zeros(len(diff))].astype(int)
    model = LogisticRegression(C=c, fit_intercept=False, max_iter=5000).fit(np.vstack([diff, -diff]), y)
    return LinearHead(mean, scale, model.coef_[0].astype(np.float64), 0.0)


@dataclass
class FeatureReward:
    """sigmoid(head.logit(features(prompt, reply))): a frozen feature map and a fitted linear head."""

    name: str
    feature_set: str
    head: LinearHead
    encoder: SentenceEncoder | None = None

    def logits(self, prompts: Sequence[str], responses: Sequence[str]) -> np.ndarray:
        return self.head.logit(features(self.feature_set, list(prompts), list(responses), self.encoder))

    def __call__(self, prompts: Sequence[str], responses: Sequence[str]) -> np.ndarray:
        return sigmoid(self.logits(prompts, responses))


def _vocab_name(tokenizer) -> str:
    return getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__


def check_tokenizers(policy_tokenizer, reward_tokenizer, policy_name: str | None = None,
                     reward_name: str | None = None) -> None:
    """For a reward model that reads the policy's token ids: raises a one-line ValueError unless both tokenisers
    have the same vocabulary size and give the same ids for TOKENIZER_PROBES."""
    policy = policy_name or _vocab_name(policy_tokenizer)
    reward = reward_name or _vocab_name(reward_tokenizer)
    head = f"reward model {reward} and policy {policy} have different tokenisers"
    if len(reward_tokenizer) != len(policy_tokenizer):
        raise ValueError(f"{head}: vocab sizes {len(reward_tokenizer)} vs {len(policy_tokenizer)}")
    for probe in TOKENIZER_PROBES:
        a = reward_tokenizer(probe, add_special_tokens=False)["input_ids"]
        b = policy_tokenizer(probe, add_special_tokens=False)["input_ids"]
        if a != b:
            raise ValueError(f"{head}: {probe!r} is {a[:6]} vs {b[:6]}")


def check_readable(reward_tokenizer, texts: Sequence[str], reward_name: str | None = None,
                   max_unknown: float = 0.05) -> None:
    """For a reward model that re-tokenises the policy's decoded text: raises a one-line ValueError when its
    tokeniser maps more than `max_unknown` of the tokens of `texts` (e.g. the policy's outputs or responses) to its
    unknown token, i.e. it cannot read them."""
    unk = getattr(reward_tokenizer, "unk_token_id", None)
    rows = reward_tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []
    total = sum(len(r) for r in rows)
    if unk is None or total == 0:
        return
    unknown = sum(t == unk for r in rows for t in r) / total
    if unknown > max_unknown:
        worst = max(texts, key=lambda t: sum(i == unk for i in reward_tokenizer(t, add_special_tokens=False)
                                             ["input_ids"]))
        raise ValueError(f"reward model {reward_name or _vocab_name(reward_tokenizer)} cannot read the policy's "
                         f"text: {unknown:.0%} of its tokens are unknown (over {max_unknown:.0%}), e.g. "
                         f"{worst[:60]!r}")


class HFRewardModel:
    """Any Hugging Face sequence-classification reward model (name or local path), scored on
    template.format(prompt=, response=) and normalised by a sigmoid of its first logit. With
    `shares_policy_tokens`, the model also scores the policy's token ids directly (`token_rewards`), which needs
    the same tokeniser: checked at construction against `policy_tokenizer`."""

    def __init__(self, name_or_path: str, template: str = HH_TEMPLATE, name: str | None = None,
                 max_length: int = 512, batch_size: int = 8, device: str | torch.device = "cpu",
                 policy_tokenizer=None, shares_policy_tokens: bool = False):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.name = name or str(name_or_path)
        self.template = template
        self.max_length = max_length
        self.batch_size = batch_size
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        if self.tokenizer.pad_token is None:  # GPT-2 has none; the classifier finds the last real token by pad id
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(name_or_path).to(self.device).eval()
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.shares_policy_tokens = shares_policy_tokens
        if shares_policy_tokens:
            if policy_tokenizer is None:
                raise ValueError(f"reward model {self.name}: shares_policy_tokens=True needs the policy_tokenizer")
            check_tokenizers(policy_tokenizer, self.tokenizer, reward_name=self.name)

    @torch.no_grad()
    def _scores(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> np.ndarray:
        out = self.model(input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device))
        return out.logits[:, 0].float().cpu().numpy().astype(np.float64)

    def logits(self, prompts: Sequence[str], responses: Sequence[str]) -> np.ndarray:
        """Raw scores of the formatted texts (left-truncated to max_length, so the reply's end is kept)."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        texts = [self.template.format(prompt=p, response=r) for p, r in zip(prompts, responses, strict=True)]
        scores = []
        for start in range(0, len(texts), self.batch_size):
            tokens = tokenize(self.tokenizer, texts[start:start + self.batch_size], self.max_length).trimmed()
            scores.append(self._scores(tokens.input_ids, tokens.attention_mask))
        return np.concatenate(scores) if scores else np.zeros(0)

    def __call__(self, prompts: Sequence[str], responses: Sequence[str]) -> np.ndarray:
        return sigmoid(self.logits(prompts, responses))

    def token_rewards(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> np.ndarray:
        """Rewards of sequences already tokenised by the policy (right-padded); only for shares_policy_tokens."""
        if not self.shares_policy_tokens:
            raise ValueError(f"reward model {self.name} re-tokenises text; build it with shares_policy_tokens=True "
                             "and the policy_tokenizer to score token ids")
        pad = self.model.config.pad_token_id  # the classifier reads the last non-pad token, so pads must be its own
        return sigmoid(self._scores(input_ids.masked_fill(attention_mask == 0, pad), attention_mask))
