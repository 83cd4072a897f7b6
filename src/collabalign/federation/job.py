"""A federated training run as data, whichever engine runs it: the algorithm, every client's data, the rounds, the seed
and the engine options, and how the final state becomes the method's saved `Result`.

An entry point builds a `FederatedJob` (e.g. `fedavg_lora_job`); `run` gives it to the in-process simulator (what
`collabalign train` does), and the Flower app (`collabalign.app`) gives the same job to a deployment: the ServerApp
runs `serve` with the job's algorithm, rounds, seed and options, then `finish`; each SuperNode's ClientApp takes its
own client's data from the job it builds. One builder, so a setting cannot hold in one engine and not in another.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from collabalign.federation.engine import EngineOptions, SimulationResult
from collabalign.federation.protocol import Algorithm, ClientContext
from collabalign.federation.quantise import quantised_uploads
from collabalign.federation.simulator import simulate


@dataclass
class FederatedJob:
    """One federated run: `clients` maps client id -> that client's data; `finish` turns the run's result into the
    method's `Result` (adapters, metrics). A job's rounds are engine rounds (FIRM: `engine_rounds_per_round` per
    training round). A personalised job's `personal(state, client)` is one client's own `Result` after the last
    round, built where that client's private state is: a deployment's node saves its own (`node.handle`), the
    job's `finish` gathers them when the clients ran in this process."""

    label: str
    algorithm: Algorithm
    clients: dict[str, Any]
    rounds: int
    seed: int
    options: EngineOptions
    finish: Callable[[SimulationResult], Any]
    eval_every: int = 1
    fraction: float = 1.0
    personal: Callable[[Any, ClientContext], Any] | None = None

    def __post_init__(self) -> None:
        """Quantised uploads (`options.upload_bits`) wrap the algorithm here, so a deployment's ServerApp and nodes,
        which build the job alike, encode and decode the same way."""
        self.algorithm = quantised_uploads(self.algorithm, self.options.upload_bits)

    def simulate(self, progress: bool = False) -> SimulationResult:
        """The rounds on `options.engine` in this process (or Flower's simulation engine)."""
        return simulate(self.algorithm, self.clients, self.rounds, self.seed, self.fraction, self.eval_every,
                        options=self.options, progress=progress, label=self.label)

    def run(self, progress: bool = False) -> Any:
        """Simulated, then finished: the method's `Result`."""
        return self.finish(self.simulate(progress))
