"""In-process federated simulator: the round engine (`engine.py`) with clients called in this process, a progress
bar, and per-round checkpoints in the active run directory (so `collabalign resume` continues a killed run); or, by
`EngineOptions.engine`, the same rounds on Flower's simulation engine (`flower.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from collabalign.federation.checkpoint import Checkpoint
from collabalign.federation.engine import EngineOptions, InProcess, SimulationResult, run_rounds, sample_clients
from collabalign.federation.protocol import Algorithm, ClientContext
from collabalign.federation.quantise import quantised_uploads
from collabalign.runs import active_run

__all__ = ["SimulationResult", "sample_clients", "simulate"]


def simulate(algorithm: Algorithm, client_data: dict[str, Any], rounds: int, seed: int, fraction: float = 1.0,
             eval_every: int = 1, checkpoint: str | Path | None = None, resume: bool = False,
             options: EngineOptions | None = None, progress: bool = True, label: str = "") -> SimulationResult:
    """Runs `rounds` rounds of `algorithm` over the clients in `client_data` (id -> that client's data).

    With a `checkpoint` folder every completed round is saved there; `resume=True` continues from it when it exists,
    ending exactly as an uninterrupted run. Inside an active run directory (`RunDir.active`), each call without a
    folder of its own checkpoints to the next folder of the run's ``checkpoints/`` and resumes from it.

    With ``options.engine == "flower"`` the rounds run on Flower's simulation engine (`run_flower_simulation`), same
    result type and, for a seed, the same metrics; there no per-round checkpoints are taken (`checkpoint` and
    `resume` are ignored, a killed run starts over), no progress bar is shown, and the returned clients' private
    state is empty (it stays on the Flower nodes).
    """
    options = options or EngineOptions()
    algorithm = quantised_uploads(algorithm, options.upload_bits)
    if options.engine == "flower":
        from collabalign.federation.flower import run_flower_simulation

        return run_flower_simulation(algorithm, client_data, rounds, seed, fraction, eval_every, options)
    name = label or type(algorithm).__name__
    if checkpoint is None and (run := active_run()) is not None:
        checkpoint, resume = run.next_checkpoint(name), True
    store = Checkpoint(checkpoint) if checkpoint is not None else None
    if store is not None and not resume and store.exists:
        (store.folder / "state.json").unlink()  # a fresh run: the old checkpoint is not continued
    clients = {cid: ClientContext(cid, data) for cid, data in client_data.items()}
    transport = InProcess(algorithm, clients, seed, options.timeout_s, options.batched)
    with _progress(progress) as bar:
        task = bar.add_task(name, total=rounds)

        def show(rnd: int, record: dict[str, Any]) -> None:
            bar.update(task, completed=rnd, description=f"{name} {_short(record)}")

        return run_rounds(algorithm, transport, clients, rounds, seed, fraction, eval_every, options, store, show)


def _short(record: dict[str, Any]) -> str:
    vals = [f"{k}={v:.3f}" for k, v in record.items() if k != "round" and isinstance(v, float | np.floating)]
    return " ".join(vals[:3])


def _progress(enabled: bool) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    disable=not enabled, transient=False)
