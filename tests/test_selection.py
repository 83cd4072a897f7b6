"""The one rule that picks a grid point from held-out training scores."""

import math

from collabalign.selection import best


def test_best_prefers_the_highest_score_then_the_smaller_point_and_never_a_diverged_run():
    assert best({(0.01, 8.0): 50.0, (0.1, 1.0): 60.0, (0.1, 8.0): math.nan}) == (0.1, 1.0)
    assert best({(0.1, 8.0): 60.0, (0.1, 1.0): 60.0}) == (0.1, 1.0)
    assert best({0.01: math.nan, 0.1: 10.0}) == 0.1
    assert best({0.003: 0.6, 0.001: 0.6, 0.01: 0.59}) == 0.001
