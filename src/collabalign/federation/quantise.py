"""Quantised uploads (`engine.upload_bits`: 8 or 4): each client's reply travels as its update, quantised per array with
unbiased stochastic rounding, and the server restores it before checking it. For a floating array with base b (the
broadcast array of the same name and shape, else 0) and reply y, the update d = y - b is sent as integer codes

    s = max|d| / L,  L = 2^(bits-1) - 1 (127 or 7);   q = floor(d / s) + [u < d / s - floor(d / s)],  u ~ U(0, 1)

(int8 codes; 4-bit codes are offset by 8 and packed two to a byte) and one float32 scale, so E[b + s q] = y: the
rounding is unbiased and the server's mean of many clients' updates is the mean of their true updates plus zero-mean
noise of at most s per coordinate. Integer arrays travel as they are. The ledger counts the bytes actually sent.
The draws come from the client's round generator after its update, so a run stays deterministic."""

from __future__ import annotations

from typing import Any

import numpy as np

from collabalign.comm import Message
from collabalign.federation.engine import batched_update
from collabalign.federation.protocol import ClientContext

SCALE = "#scale"  # suffix of an array's scale in a quantised reply


def quantise(delta: np.ndarray, bits: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(codes, scale) of `delta` (module doc): int8 codes, or for 4 bits uint8 bytes of two codes each."""
    levels = 2 ** (bits - 1) - 1
    flat = np.asarray(delta, np.float64).ravel()
    top = float(np.max(np.abs(flat))) if flat.size else 0.0
    scale = np.float32(top / levels if top > 0 else 1.0)
    if float(scale) * levels < top:  # the float32 scale rounded up, so that every |d / s| <= L: no clipping bias
        scale = np.nextafter(scale, np.float32(np.inf))
    x = flat / np.float64(scale)
    low = np.floor(x)
    codes = (low + (rng.random(x.shape) < x - low)).astype(np.int8)
    if bits == 4:
        nibbles = (codes + 8).astype(np.uint8)
        nibbles = np.append(nibbles, np.uint8(8)) if len(nibbles) % 2 else nibbles  # a pad code of 0
        codes = (nibbles[0::2] << 4 | nibbles[1::2]).astype(np.uint8)
    return codes, np.array([scale], np.float32)  # E[s q] = d exactly: s is the float32 the server reads


def restore(codes: np.ndarray, scale: np.ndarray, bits: int, size: int) -> np.ndarray:
    """The float64 update `quantise` encoded (flat, `size` values); ValueError on codes that cannot be it."""
    if scale.shape != (1,) or not np.isfinite(scale[0]) or scale[0] <= 0:
        raise ValueError(f"scale {scale.tolist()[:3]} is not one finite positive number")
    if bits == 4:
        if codes.dtype != np.uint8 or codes.shape != ((size + 1) // 2,):
            raise ValueError(f"{codes.shape} {codes.dtype} codes for {size} 4-bit values")
        q = np.stack([codes >> 4, codes & 15], axis=1).ravel()[:size].astype(np.int64) - 8
    else:
        if codes.dtype != np.int8 or codes.shape != (size,):
            raise ValueError(f"{codes.shape} {codes.dtype} codes for {size} 8-bit values")
        q = codes.astype(np.int64)
    levels = 2 ** (bits - 1) - 1
    if q.size and (q.min() < -levels or q.max() > levels):
        raise ValueError(f"a code beyond ±{levels}")
    return q * np.float64(scale[0])


def base_of(message: Message, name: str, shape: tuple[int, ...]) -> np.ndarray | float:
    """What the update of array `name` is measured from: the broadcast array of that name and shape, else 0."""
    return message[name] if name in message and message[name].shape == shape else 0.0


class QuantisedUploads:
    """`algorithm` with its clients' replies quantised (module doc); everything else is the algorithm's own."""

    def __init__(self, algorithm: Any, bits: int):
        self.inner, self.bits = algorithm, bits

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def client_update(self, message: Message, client: ClientContext) -> Message:
        return self.encode(self.inner.client_update(message, client), message, client.rng)

    def client_update_many(self, messages: dict[str, Message], clients: dict[str, ClientContext]
                           ) -> dict[str, Message]:
        many = batched_update(self.inner)
        replies = many(messages, clients) if many is not None else {
            cid: self.inner.client_update(m, clients[cid]) for cid, m in messages.items()}
        return {cid: self.encode(reply, messages[cid], clients[cid].rng) for cid, reply in replies.items()}

    def encode(self, reply: Message, message: Message, rng: np.random.Generator) -> Message:
        arrays, quantised = {}, {}
        for name, value in reply.items():
            if not np.issubdtype(value.dtype, np.floating):
                arrays[name] = value
                continue
            delta = value.astype(np.float64) - base_of(message, name, value.shape)
            arrays[name], arrays[name + SCALE] = quantise(delta, self.bits, rng)
            quantised[name] = [list(value.shape), value.dtype.str]
        return Message(arrays, {**reply.meta, "quantised": {"bits": self.bits, "arrays": quantised}})

    def decode_reply(self, reply: Message, message: Message) -> Message:
        """The reply as the client computed it, up to the rounding; ValueError when it is not a quantised reply."""
        info = reply.meta.get("quantised")
        if not isinstance(info, dict) or info.get("bits") != self.bits or not isinstance(info.get("arrays"), dict):
            raise ValueError(f"not a {self.bits}-bit quantised reply")
        arrays = {k: v for k, v in reply.items() if not k.endswith(SCALE) and k not in info["arrays"]}
        for name, (shape, dtype) in info["arrays"].items():
            shape, dtype = tuple(int(n) for n in shape), np.dtype(dtype)
            if not np.issubdtype(dtype, np.floating) or name not in reply or name + SCALE not in reply:
                raise ValueError(f"array {name!r}: no {dtype} codes and scale")
            delta = restore(reply[name], reply[name + SCALE], self.bits, int(np.prod(shape))).reshape(shape)
            arrays[name] = (base_of(message, name, shape) + delta).astype(dtype)
        meta = {k: v for k, v in reply.meta.items() if k != "quantised"}
        return Message(arrays, meta)


def quantised_uploads(algorithm: Any, bits: int | None) -> Any:
    """`algorithm` whose uploads are quantised to `bits` (None: as it is; never wrapped twice)."""
    if bits is None or isinstance(algorithm, QuantisedUploads):
        return algorithm
    return QuantisedUploads(algorithm, bits)
