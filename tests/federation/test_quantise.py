"""Quantised uploads: the rounding is unbiased (the mean of many draws is the input), codes and scales round-trip, the
server restores each reply before checking it and rejects one it cannot decode, the ledger counts the bytes actually
sent (about 1/4 and 1/8 of float32 uploads), and a quantised FedAvg-LoRA run is deterministic and still learns."""

import numpy as np
import pytest

from collabalign.comm import Message
from collabalign.federation.engine import EngineOptions
from collabalign.federation.quantise import SCALE, QuantisedUploads, quantise, restore
from collabalign.federation.simulator import simulate
from collabalign.methods.fedavg import FedAvg

from .toy import LeastSquares


@pytest.mark.parametrize("bits", [8, 4])
def test_stochastic_rounding_is_unbiased_and_within_one_step(bits):
    rng = np.random.default_rng(0)
    delta = rng.normal(size=37) * 1e-3
    draws = np.stack([restore(*quantise(delta, bits, rng), bits, delta.size) for _ in range(20_000)])
    step = np.abs(delta).max() / (2 ** (bits - 1) - 1)
    assert np.all(np.abs(draws - delta) <= step * (1 + 1e-9))  # each draw is a neighbouring level
    standard_error = draws.std(0) / np.sqrt(len(draws))
    # the mean is the input (a coordinate a hair from a level draws the other one about once in 1e5: SE 0 here)
    assert np.all(np.abs(draws.mean(0) - delta) <= 5 * standard_error + step * 1e-4)
    assert np.abs(draws.mean(0) - delta).max() < step / 20


def test_codes_take_a_byte_or_half_of_one_and_zero_updates_survive():
    rng = np.random.default_rng(1)
    for bits, size in ((8, 11), (4, 11), (4, 12)):
        codes, scale = quantise(np.linspace(-1, 1, size), bits, rng)
        assert codes.nbytes == (size if bits == 8 else (size + 1) // 2) and scale.dtype == np.float32
    codes, scale = quantise(np.zeros(5), 4, rng)
    assert np.array_equal(restore(codes, scale, 4, 5), np.zeros(5))


def test_the_server_restores_replies_and_rejects_what_it_cannot_decode():
    algorithm = QuantisedUploads(FedAvg(LeastSquares()), 8)
    message = Message({"w": np.ones(4, np.float32)}, {"round": 1})
    reply = Message({"w": np.array([1.5, 1.0, 0.5, 1.25], np.float32)}, {"n": 3})
    sent = algorithm.encode(reply, message, np.random.default_rng(0))
    assert sent["w"].dtype == np.int8 and sent.meta["n"] == 3
    back = algorithm.decode_reply(sent, message)
    assert back.meta == {"n": 3} and back["w"].dtype == np.float32
    np.testing.assert_allclose(back["w"], reply["w"], atol=0.5 / 127 + 1e-7)
    bad = [Message(dict(sent), {"n": 3}),  # no quantisation header
           Message({**sent, "w" + SCALE: np.array([np.inf], np.float32)}, sent.meta),
           Message({**sent, "w": sent["w"][:2]}, sent.meta),
           Message({**sent, "w": sent["w"].astype(np.int16)}, sent.meta)]
    for message_ in bad:
        with pytest.raises(ValueError):
            algorithm.decode_reply(message_, message)


def test_quantised_runs_count_the_bytes_sent_are_deterministic_and_close_to_full_precision():
    trainer = LeastSquares(dim=4000, lr=1e-4)
    data = trainer.client_data(4, n=40)
    full = simulate(FedAvg(trainer), data, 6, seed=0, progress=False)
    runs = {bits: simulate(FedAvg(trainer), data, 6, seed=0, progress=False, options=EngineOptions(upload_bits=bits))
            for bits in (8, 4)}
    again = simulate(FedAvg(trainer), data, 6, seed=0, progress=False, options=EngineOptions(upload_bits=4))
    np.testing.assert_array_equal(again.state["w"], runs[4].state["w"])
    for bits, run in runs.items():
        assert run.ledger.total("down") == full.ledger.total("down")
        assert not any(r.get("dropped") for r in run.metrics)
        error = np.abs(run.state["w"] - full.state["w"]).max()
        assert 0 < error < (0.05 if bits == 8 else 0.5) * np.abs(full.state["w"]).max()
    ratio = {bits: run.ledger.total("up") / full.ledger.total("up") for bits, run in runs.items()}
    assert 0.25 < ratio[8] < 0.3 and 0.125 < ratio[4] < 0.17, ratio  # 1 and 1/2 byte a value against 4, plus headers
