"""A node's private-state folder: each round starts from the state the round before left, a round run again (a
resumed ServerApp) starts from the same state as the first time, and only the two newest rounds are kept."""

import numpy as np

from collabalign.federation.flower import NodeStore


def test_each_round_starts_from_the_round_before_and_old_rounds_are_removed(tmp_path):
    store = NodeStore(tmp_path / "client0")
    assert store.load(1) == {}
    for r in (1, 2, 3):
        store.save(r, {"v": np.full(3, float(r), np.float32)})
    np.testing.assert_array_equal(store.load(4)["v"], np.full(3, 3.0, np.float32))
    np.testing.assert_array_equal(store.load(3)["v"], np.full(3, 2.0, np.float32))  # round 3 run again
    assert sorted(p.name for p in (tmp_path / "client0").iterdir()) == ["round-00002.safetensors",
                                                                       "round-00003.safetensors"]
    store.save(3, {"v": np.full(3, 30.0, np.float32)})  # the rerun replaces round 3 and keeps its starting point
    np.testing.assert_array_equal(store.load(4)["v"], np.full(3, 30.0, np.float32))
    np.testing.assert_array_equal(store.load(3)["v"], np.full(3, 2.0, np.float32))


def test_a_client_without_state_writes_nothing(tmp_path):
    NodeStore(tmp_path / "client0").save(1, {})
    assert not (tmp_path / "client0").exists()
