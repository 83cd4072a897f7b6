"""The Flower ClientApp's plumbing, light to import (Flower and the standard library only, no torch): a ClientApp
that answers the three message kinds the engine sends (``query`` for the handshake, ``train``, ``evaluate``) by
handing each message's bytes to a `Handler` and replying with the bytes it returns.

A Flower SuperNode starts a fresh ClientApp process for every message, so what this module imports is paid every
round on every node; the work itself (the algorithm, the model, the data) lives behind the handler: in this process
(`flower.in_process_handler`, the simulation) or in a long-lived node worker (`collabalign.node`, a deployment).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

RECORD = "collabalign"  # name of the ConfigRecord in a message's content
PAYLOAD = "payload"  # its one bytes value: a serialised collabalign Message
CLIENT_ID = "client_id"  # handshake reply: the client id of the node's partition
PROPERTIES = "properties"  # handshake reply: what the node declares about itself (JSON), e.g. its LoRA rank

# (kind, Flower context, round, the message's payload bytes) -> the reply's payload bytes ("query": JSON
# {"client": id, "properties": {...}})
Handler = Callable[[str, Any, int, bytes], bytes]


def content(payload: bytes) -> Any:
    """A Flower RecordDict holding a serialised collabalign Message."""
    from flwr.app import ConfigRecord, RecordDict

    return RecordDict({RECORD: ConfigRecord({PAYLOAD: payload})})


def payload_of(flower_message: Any) -> bytes:
    """The serialised collabalign Message a Flower message carries (KeyError when it carries none)."""
    return bytes(flower_message.content.config_records[RECORD][PAYLOAD])


def whoami(cid: str, properties: dict[str, Any] | None = None) -> bytes:
    """A handler's answer to the handshake's query."""
    return json.dumps({"client": cid, "properties": properties or {}}).encode()


def client_app(handle: Handler) -> Any:
    """A ClientApp whose query, train and evaluate handlers call `handle`."""
    from flwr.app import ConfigRecord, Context, RecordDict
    from flwr.app import Message as FlowerMessage
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.query()
    def whoami(message: FlowerMessage, context: Context) -> FlowerMessage:
        answer = json.loads(handle("query", context, 0, b""))
        record = ConfigRecord({CLIENT_ID: answer["client"], PROPERTIES: json.dumps(answer["properties"])})
        return FlowerMessage(RecordDict({RECORD: record}), reply_to=message)

    @app.train()
    def train(message: FlowerMessage, context: Context) -> FlowerMessage:
        reply = handle("train", context, int(message.metadata.group_id), payload_of(message))
        return FlowerMessage(content(reply), reply_to=message)

    @app.evaluate()
    def evaluate(message: FlowerMessage, context: Context) -> FlowerMessage:
        reply = handle("evaluate", context, int(message.metadata.group_id), payload_of(message))
        return FlowerMessage(content(reply), reply_to=message)

    return app
