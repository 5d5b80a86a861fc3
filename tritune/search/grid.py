"""Grid search: the valid space in index order."""
from __future__ import annotations

from tritune.schedules.config import Config
from tritune.search.base import Strategy


class GridSearch(Strategy):
    """Walks valid configs in index order, skipping those already seen (the seed is unused)."""

    seeded = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._cursor = 0

    def _propose(self, n: int) -> list[Config]:
        out: list[Config] = []
        indices = self.space.valid_indices
        while len(out) < n and self._cursor < len(indices):
            config = self.space.config(int(indices[self._cursor]))
            self._cursor += 1
            if config not in self.seen:
                out.append(config)
        return out
