"""Strategy: the propose/update interface every search strategy implements."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from tritune.records.result import MeasureResult
from tritune.schedules.config import Config
from tritune.schedules.space import Space


# Feature rows of configs of the task being tuned (see tritune.cost_model.features).
Featurize = Callable[[Sequence[Config]], np.ndarray]


@dataclass(frozen=True)
class Prior:
    """Measurements of other workloads of the same op on the same device, for a warm start."""

    X: np.ndarray
    y: np.ndarray
    groups: np.ndarray

    @staticmethod
    def merge(*priors: "Prior | None") -> "Prior | None":
        """One prior holding every given one's workloads as separate groups (None if none given)."""
        given = [p for p in priors if p is not None and len(p.y)]
        if not given:
            return None
        offsets = np.cumsum([0] + [int(p.groups.max()) + 1 for p in given[:-1]])
        return Prior(np.concatenate([p.X for p in given]), np.concatenate([p.y for p in given]),
                     np.concatenate([p.groups + o for p, o in zip(given, offsets)]))


class Strategy:
    """Proposes configs to measure and learns from their results. Never measures anything itself.

    Subclasses implement `_propose(n)`; the base keeps the set of configs already proposed or
    measured, so no strategy proposes a config twice (resumed runs pass stored results to update).
    """

    seeded = True  # False: the same proposals whatever the seed (one run says all)

    def __init__(self, space: Space, seed: int = 0, features: Featurize | None = None,
                 prior: Prior | None = None) -> None:
        # features and prior serve model-based strategies; the others ignore them
        self.space, self.features, self.prior = space, features, prior
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.seen: set[Config] = set()
        self.results: list[MeasureResult] = []

    @property
    def round_size(self) -> int | None:
        """How many configs this strategy wants measured between updates (None: no preference)."""
        return None

    def propose(self, n: int) -> list[Config]:
        """Up to n new valid configs; fewer (or none) only when the space is exhausted."""
        configs = [c for c in self._propose(n) if c not in self.seen][:n]
        self.seen.update(configs)
        return configs

    def update(self, results: Sequence[MeasureResult]) -> None:
        """Learn from measured (or failed) configs."""
        self.results.extend(results)
        self.seen.update(r.config for r in results)

    def _propose(self, n: int) -> list[Config]:
        raise NotImplementedError
