"""Federation: the Algorithm protocol, the in-process simulator and (in flower.py) the Flower adapter.

The names below load on first use, so that importing a light submodule (`flower_client`, which every deployed
ClientApp process imports) does not import torch."""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = ["Algorithm", "ClientContext", "SimulationResult", "sample_clients", "simulate"]
_HOME = {"Algorithm": "protocol", "ClientContext": "protocol", "SimulationResult": "simulator",
         "sample_clients": "simulator", "simulate": "simulator"}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"collabalign.federation.{_HOME[name]}"), name)
