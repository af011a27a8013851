"""Parent links and innermost-range lookups of ``structure.nesting`` on nested ranges built so that the
answer is known: every range is generated inside its parent."""

from __future__ import annotations

import numpy as np

from fsdpviz.structure.nesting import innermost_in_lane, parent_links


def _forest(seed: int, n_roots: int = 30, depth: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted (start, -end) ranges with their true parent indices (-1 for roots)."""
    rng = np.random.default_rng(seed)
    made: list[tuple[int, int, int]] = []  # start, end, parent position in ``made``

    def grow(lo: int, hi: int, parent: int, level: int) -> None:
        cursor = lo
        for _ in range(int(rng.integers(0, 4)) if level else n_roots):
            if hi - cursor < 8:
                return
            start = int(rng.integers(cursor, cursor + (hi - cursor) // 2))
            end = int(rng.integers(start + 2, hi + 1))
            made.append((start, end, parent))
            me = len(made) - 1
            if level < depth:
                grow(start, end, me, level + 1)
            cursor = end
    grow(0, 10**9, -1, 0)
    starts = np.array([m[0] for m in made], dtype=np.int64)
    ends = np.array([m[1] for m in made], dtype=np.int64)
    order = np.lexsort((-ends, starts))
    position = np.empty(len(made), dtype=np.int64)
    position[order] = np.arange(len(made))
    parents = np.array([position[made[i][2]] if made[i][2] >= 0 else -1 for i in order], dtype=np.int64)
    return starts[order], ends[order], parents


def test_parent_links_recover_the_generated_nesting() -> None:
    for seed in range(5):
        starts, ends, truth = _forest(seed)
        assert len(starts) > 50
        assert (parent_links(starts, ends) == truth).all()


def test_innermost_range_of_points_is_the_deepest_one_holding_them() -> None:
    starts, ends, _ = _forest(7)
    rng = np.random.default_rng(1)
    t = rng.integers(0, 10**9, 2000)
    found = innermost_in_lane(starts, ends, parent_links(starts, ends), t)
    assert (found >= 0).sum() > 500 and (found == -1).any()  # points inside ranges and between them
    for point, got in zip(t.tolist(), found.tolist()):
        holding = [i for i in range(len(starts)) if starts[i] <= point < ends[i]]
        # the deepest of the ranges holding the point is the one with no child among them
        expected = max(holding, key=lambda i: (starts[i], -ends[i])) if holding else -1
        assert got == expected
