"""Random search: uniform samples of the valid space, without repeats."""
from __future__ import annotations

from tritune.schedules.config import Config
from tritune.search.base import Strategy


class RandomSearch(Strategy):
    """Draws configs uniformly from the valid, not yet seen part of the space."""

    def _propose(self, n: int) -> list[Config]:
        return self.space.sample(self.rng, n, exclude=self.seen)
