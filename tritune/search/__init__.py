"""Search strategies, looked up lazily by name."""
from __future__ import annotations

import importlib

from tritune.cost_model.dataset import Prior
from tritune.schedules.space import Space
from tritune.search.base import Featurize, Strategy

# name -> "module:Class"; a new strategy is one new file and one line here
REGISTRY = {
    "random": "tritune.search.random:RandomSearch",
    "grid": "tritune.search.grid:GridSearch",
    "sa": "tritune.search.model_based:ModelBasedStrategy",
}


def strategy_class(name: str) -> type[Strategy]:
    """The registered strategy class of a name (ValueError lists the known names)."""
    if name not in REGISTRY:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(sorted(REGISTRY))}")
    module, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)


def make_strategy(name: str, space: Space, seed: int = 0, features: Featurize | None = None,
                  prior: Prior | None = None, **options) -> Strategy:
    """Instantiate a registered strategy by name (ValueError lists the known names)."""
    return strategy_class(name)(space, seed=seed, features=features, prior=prior, **options)


__all__ = ["REGISTRY", "Featurize", "Strategy", "make_strategy", "strategy_class"]
