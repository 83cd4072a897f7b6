"""Federation: the Algorithm protocol, the in-process simulator and (in flower.py) the Flower adapter."""

from collabalign.federation.protocol import Algorithm, ClientContext
from collabalign.federation.simulator import SimulationResult, sample_clients, simulate

__all__ = ["Algorithm", "ClientContext", "SimulationResult", "sample_clients", "simulate"]
