"""Texts are cut before tokenising to what a model reads of them: the same tokens, bounded work."""

import torch

from collabalign.data.limits import CHARS_PER_TOKEN, cut_texts, max_chars
from collabalign.models.backbones import smollm2_tokenizer
from collabalign.models.pooled import tokenize

WORDS = " ".join(f"word{i % 97}" for i in range(200_000))  # about 1.4 million characters


class Recorder:
    """A tokenizer stand-in that records the lengths of the texts it is given."""

    truncation_side = padding_side = "right"

    def __init__(self):
        self.lengths: list[int] = []

    def __call__(self, texts, second=None, **kwargs):
        self.lengths += [len(t) for t in [*texts, *(second or [])]]
        return {"input_ids": torch.zeros(len(texts), 1, dtype=torch.long), "attention_mask": torch.ones(len(texts), 1)}


def test_cut_texts_keeps_the_end_that_left_truncation_keeps_or_the_start():
    text = "a" * 10 + "b" * (max_chars(4) - 5)
    assert cut_texts([text, "short"], 4) == [text[-max_chars(4):], "short"]
    assert cut_texts([text], 4, keep="start") == [text[:max_chars(4)]]
    assert cut_texts(None, 4) is None and max_chars(4) == 4 * CHARS_PER_TOKEN


def test_the_tokenizer_sees_texts_cut_and_gives_the_same_tokens():
    recorder = Recorder()
    tokenize(recorder, [WORDS, "short"], 32, [WORDS, "pair"])
    assert max(recorder.lengths) == max_chars(32)
    tokenizer = smollm2_tokenizer()
    for side in ("left", "right"):
        tokenizer.truncation_side = side
        whole = tokenizer([WORDS], truncation=True, max_length=32)["input_ids"]
        assert tokenize(tokenizer, [WORDS], 32, truncation_side=side).input_ids.tolist() == whole
