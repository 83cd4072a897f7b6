import json

import numpy as np
import pytest

from collabalign.comm import Ledger, Message, MessageError
from collabalign.runs import RunDir


def test_nbytes_is_length_of_serialisation_and_round_trips():
    msg = Message(
        {"B": np.arange(12, dtype=np.float32).reshape(3, 4), "idx": np.array([0, 5, 7], dtype=np.int64)},
        meta={"round": 3, "note": "héllo"},
    )
    wire = msg.serialise()
    assert msg.nbytes == len(wire)
    # arrays' raw bytes are a lower bound; the header is small
    raw = 12 * 4 + 3 * 8
    assert raw < msg.nbytes < raw + 256
    back = Message.deserialise(wire)
    assert back.meta == {"round": 3, "note": "héllo"}
    np.testing.assert_array_equal(back["B"], msg["B"])
    assert back["idx"].dtype == np.int64


def test_nbytes_grows_exactly_with_array_bytes():
    a = Message({"x": np.zeros(10, np.float32)})
    b = Message({"x": np.zeros(1010, np.float32)})
    # safetensors header only changes in the digits of the offsets
    assert 4000 <= b.nbytes - a.nbytes <= 4008


def test_empty_message():
    msg = Message()
    assert msg.nbytes == len(msg.serialise()) > 0
    assert Message.deserialise(msg.serialise()).meta == {}


def test_ledger_totals_and_csv(tmp_path):
    led = Ledger()
    led.record(0, "c0", "down", 100)
    led.record(0, "c0", "up", 10)
    led.record(1, "c1", "up", 7)
    assert led.total() == 117 and led.total("up") == 17 and led.total(round_=0) == 110
    assert led.per_round() == {0: {"down": 100, "up": 10}, 1: {"down": 0, "up": 7}}
    run = RunDir(tmp_path)
    run.write_ledgers({"m": led})
    assert run.read_ledgers()["m"].rows == led.rows
    with pytest.raises(ValueError, match="direction"):
        led.record(0, "c0", "sideways", 1)


def _wire(header: dict, body: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + body


VALID = Message({"B": np.arange(6, dtype=np.float32).reshape(2, 3), "idx": np.array([1, 2], np.int64)},
                meta={"round": 1}).serialise()
CORRUPT = {
    "empty": b"",
    "truncated": VALID[:-3],
    "header_only_half": VALID[:20],
    "random": bytes(range(256)) * 4,
    "bad_header_json": (5).to_bytes(8, "little") + b"{bad}",
    "header_length_beyond_data": (10**6).to_bytes(8, "little") + VALID[8:],
    "bad_metadata_json": _wire({"__metadata__": {"meta": "{not json"}}),
    "non_dict_metadata": _wire({"__metadata__": {"meta": "[1, 2]"}}),
    "wrong_dtype_string": _wire({"x": {"dtype": "BOGUS", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
    "dtype_numpy_lacks": _wire({"x": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4),
    "shape_does_not_match_bytes": _wire({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 4]}}, b"\0" * 4),
    "deeply_nested_metadata": _wire({"__metadata__": {"meta": "[" * 100_000 + "]" * 100_000}}),
}


@pytest.mark.parametrize("data", CORRUPT.values(), ids=CORRUPT.keys())
def test_corrupt_bytes_raise_one_message_error(data):
    with pytest.raises(MessageError) as err:
        Message.deserialise(data)
    assert isinstance(err.value, ValueError) and "\n" not in str(err.value)


def test_valid_messages_round_trip_exactly():
    back = Message.deserialise(VALID)
    assert back.serialise() == VALID and set(back) == {"B", "idx"} and back.meta == {"round": 1}
    assert Message.deserialise(_wire({"__metadata__": None})).meta == {}  # a plain safetensors file: no metadata


def test_a_scalar_array_keeps_its_shape_on_the_wire():
    """A 0-d array (e.g. a client's KL coefficient in its private state) comes back 0-d, so float() of it works."""
    back = Message.deserialise(Message({"kl_coef": np.array(0.2), "w": np.ones((2, 3)).T}).serialise())
    assert back["kl_coef"].shape == () and float(back["kl_coef"]) == 0.2 and back["w"].shape == (3, 2)
