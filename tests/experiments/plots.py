"""For a run that repeats one whose plots a test checks and is itself compared on its records: its figures are built
but neither laid out nor rendered to PNG (most of a toy run's time is drawing)."""

import pytest
from matplotlib.figure import Figure


def unrendered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Figure, "tight_layout", lambda self, *args, **kwargs: None)
    monkeypatch.setattr(Figure, "savefig", lambda self, *args, **kwargs: None)
