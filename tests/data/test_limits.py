"""Bounded reading: each limit of `data.limits` stops a read with one DataError naming the file and line, and
texts are cut before tokenising to what a model reads of them (the same tokens, bounded work)."""

import gzip

import pytest
import torch

from collabalign.config import ConfigError
from collabalign.data.errors import DataError
from collabalign.data.jsonl import read_jsonl
from collabalign.data.limits import CHARS_PER_TOKEN, ReadLimits, cut_texts, max_chars, read_limits
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


ROW = b'{"prompt": "q", "chosen": "a", "rejected": "b"}\n'  # 49 bytes


@pytest.mark.parametrize(("content", "limits", "message"), [
    (ROW * 3 + b"x" * 60, ReadLimits(line_bytes=50), ":4: line longer than 50 bytes"),
    (ROW * 3 + b"x" * 50 + b"\n", ReadLimits(line_bytes=50), None),  # 50 bytes and its newline: a (bad) row
    (ROW * 30, ReadLimits(data_bytes=1000), ":21: more than 1,000 bytes of data, decompressed"),
    (ROW + b"\n" * 11 + ROW, ReadLimits(blank_lines=10), ":12: more than 10 blank lines"),
    (ROW + b"\n" * 10 + ROW, ReadLimits(blank_lines=10), None),
])
def test_each_reading_limit_stops_the_read_at_the_line_past_it(content, limits, message, tmp_path):
    for path in (tmp_path / "a.jsonl", tmp_path / "a.jsonl.gz"):
        path.write_bytes(gzip.compress(content) if path.suffix == ".gz" else content)
        if message is None:
            list(read_jsonl(path, limits))
        else:
            with pytest.raises(DataError, match=message):
                list(read_jsonl(path, limits))


def test_limits_come_from_the_environment_and_a_bad_one_is_one_line(monkeypatch):
    monkeypatch.setenv("COLLABALIGN_MAX_LINE_BYTES", "2_048")
    assert read_limits() == ReadLimits(line_bytes=2048)
    monkeypatch.setenv("COLLABALIGN_MAX_DATA_BYTES", "-1")
    with pytest.raises(ConfigError, match=r"\$COLLABALIGN_MAX_DATA_BYTES = '-1': must be a positive integer"):
        read_limits()


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
