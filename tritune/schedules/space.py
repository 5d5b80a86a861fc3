"""Space: knobs x constraints, with integer index <-> config, seeded sampling and neighbours."""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from tritune.schedules.config import Config

# A constraint returns None when a config may run, else a short reason it cannot.
Constraint = Callable[[Config], "str | None"]
# entries a space remembers per table (moves, config places, configs by index) before starting again
MEMO_SIZE = 200_000


def reads(*knobs: str) -> Callable[[Constraint], Constraint]:
    """Declare the only knobs a constraint looks at, so enumeration can prune partial configs."""
    def mark(constraint: Constraint) -> Constraint:
        constraint.reads = knobs  # type: ignore[attr-defined]
        return constraint
    return mark


@dataclass(frozen=True)
class Knob:
    """A named schedule parameter and its ordered candidate values."""

    name: str
    values: tuple[int, ...]
    # its values choose different code paths (a GEMV or an MMA kernel): a model learnt on other
    # workloads may never have seen one of them, so a ranked search tries every value early
    path: bool = False


@dataclass(frozen=True)
class Limits:
    """What the device allows a program (from the GPU, or a known table for offline builds)."""

    shared_bytes: int
    sms: int
    pdl: bool = False  # programmatic dependent launch (Hopper and later, not the interpreter)
    # (shared memory per block, opt-in maximum; SM count of the largest part) by compute
    # capability, for building without a GPU
    KNOWN = {(9, 0): (232448, 132), (8, 0): (166912, 108), (8, 6): (101376, 84), (8, 9): (101376, 128)}

    @classmethod
    def for_capability(cls, major: int, minor: int) -> "Limits":
        """Limits of a compute capability from the known table."""
        shared, sms = cls.KNOWN.get((major, minor), (101376, 80))
        return cls(shared_bytes=shared, sms=sms)


def _remembered(table: dict, key: Any, make: Callable[[], Any]) -> Any:
    """table[key], made and kept on first use; a table past MEMO_SIZE entries starts again."""
    value = table.get(key)
    if value is None:
        if len(table) > MEMO_SIZE:
            table.clear()
        value = table[key] = make()
    return value


class Space:
    """The product of knob values, pruned by constraints before anything is compiled.

    Indices run over the full product (mixed radix, first knob most significant), so an index
    names a config whether or not it is valid; `valid_indices` lists those that pass.
    """

    def __init__(self, knobs: Sequence[Knob], constraints: Sequence[Constraint] = (),
                 seeder: Callable[["Space"], Sequence[Config]] | None = None) -> None:
        self.knobs = tuple(knobs)
        self.constraints = tuple(constraints)
        self.seeder = seeder  # the space's own guesses (`seeds`): valid configs of the space it is given
        self._radix = [len(k.values) for k in self.knobs]
        self._memo: dict[tuple[int, int], np.ndarray] = {}  # (moved index, knob) -> nearest valid indices
        # config -> (index, value positions), and index -> config: annealing's chains revisit both
        self._places: dict[Config, tuple[int, list[int]]] = {}
        self._at: dict[int, Config] = {}

    def without(self, names: Sequence[str]) -> "Space":
        """The subspace without some knobs (their configs lack them; kernels use the knobs' defaults)."""
        return Space([k for k in self.knobs if k.name not in names], self.constraints, self.seeder)

    @cached_property
    def seeds(self) -> tuple[Config, ...]:
        """Configs a model-based search measures first (the space's own guesses), valid here."""
        return tuple(self.seeder(self)) if self.seeder else ()

    def restricted(self, configs: Iterable[Config]) -> "Space":
        """The subspace of those valid configs that are in `configs` (e.g. a measured sample)."""
        allowed = frozenset(configs)
        return Space(self.knobs, (*self.constraints, lambda c: None if c in allowed else "not in the subset"),
                     self.seeder)

    @cached_property
    def size(self) -> int:
        """Number of configs in the full product, valid or not (`config` checks it per call)."""
        return math.prod(self._radix)

    @cached_property
    def valid_indices(self) -> np.ndarray:
        """Sorted indices of every config that passes all constraints.

        Depth-first over the knobs in index order: a constraint that declares the knobs it reads
        (see `reads`) runs as soon as those are set, so whole subtrees are skipped at once.
        """
        names = [k.name for k in self.knobs]
        levels: list[list[Constraint]] = [[] for _ in names]
        for c in self.constraints:
            # a declared knob outside this space is read with its default: it never delays a check
            levels[max((names.index(r) for r in getattr(c, "reads", names) if r in names), default=0)].append(c)
        out: list[int] = []

        def walk(depth: int, partial: dict, index: int) -> None:
            if depth == len(names):
                out.append(index)
                return
            for pos, value in enumerate(self.knobs[depth].values):
                partial[names[depth]] = value
                if levels[depth]:
                    config = Config.of(partial)  # once per node, not once per constraint
                    if any(c(config) for c in levels[depth]):
                        continue
                walk(depth + 1, partial, index * self._radix[depth] + pos)
            del partial[names[depth]]

        walk(0, {}, 0)
        return np.array(out, dtype=np.int64)

    @cached_property
    def _by_value(self) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
        """(knob, value position) -> (valid indices with that value, their value positions)."""
        digits = np.stack([(self.valid_indices // stride) % radix for stride, radix in
                           zip(self._strides, self._radix)], axis=1).astype(np.int16)
        return {(k, pos): (self.valid_indices[rows], digits[rows])
                for k in range(len(self.knobs)) for pos in range(self._radix[k])
                for rows in [np.flatnonzero(digits[:, k] == pos)] if len(rows)}

    @cached_property
    def _valid_set(self) -> frozenset[int]:
        return frozenset(self.valid_indices.tolist())

    @cached_property
    def _strides(self) -> list[int]:
        return [int(s) for s in np.cumprod([1] + self._radix[:0:-1])[::-1]]  # index step of each knob

    def _nearest(self, config: Config, knob: int, pos: int, rng: np.random.Generator | None) -> Config | None:
        """The valid config with knob `knob` at value position `pos` that changes the fewest other
        knobs of `config` (then the fewest value steps); ties go to `rng`, else to the first."""
        if (knob, pos) not in self._by_value:
            return None
        index, here = self._place(config)
        moved = index + (pos - here[knob]) * self._strides[knob]
        if moved in self._valid_set:  # the one-knob move itself is valid: nothing is nearer
            return self._config_at(moved)
        # annealing chains come back to the same moves often
        nearest = _remembered(self._memo, (moved, knob),
                              lambda: self._nearest_indices(knob, pos, np.array(here, dtype=np.int16)))
        return self._config_at(int(nearest[0] if rng is None else rng.choice(nearest)))

    def _place(self, config: Config) -> tuple[int, list[int]]:
        """A config's index and the positions of its values, remembered."""
        def place() -> tuple[int, list[int]]:
            here = [k.values.index(config[k.name]) for k in self.knobs]
            return sum(d * s for d, s in zip(here, self._strides)), here
        return _remembered(self._places, config, place)

    def _config_at(self, index: int) -> Config:
        """`config(index)`, remembered."""
        return _remembered(self._at, index, lambda: self.config(index))

    @cached_property
    def _movable(self) -> tuple[int, ...]:
        """The knobs with more than one value."""
        return tuple(k for k in range(len(self.knobs)) if self._radix[k] > 1)

    def _nearest_indices(self, knob: int, pos: int, here: np.ndarray) -> np.ndarray:
        """The indices of every valid config with that value at the least distance from `here`."""
        indices, digits = self._by_value[(knob, pos)]
        changed = (digits != here).sum(axis=1)  # a knob changed at all costs more than any steps
        fewest = np.flatnonzero(changed == changed.min())
        steps = np.abs(digits[fewest] - here).sum(axis=1)
        return indices[fewest[steps == steps.min()]]

    def random_neighbour(self, config: Config, rng: np.random.Generator) -> Config | None:
        """A random move: one knob set to another of its values; where that alone breaks a
        constraint, the nearest valid config with that value (see `neighbours`). None if no knob
        can move."""
        movable = list(self._movable)
        while movable:
            knob = movable[int(rng.integers(len(movable)))]
            pos = self._place(config)[1][knob]
            new = (pos + int(rng.integers(1, self._radix[knob]))) % self._radix[knob]
            moved = self._nearest(config, knob, new, rng)
            if moved is not None:
                return moved
            movable.remove(knob)  # rare: no valid config has that value; try another knob
        return None

    def config(self, index: int) -> Config:
        """The config at an index of the full product."""
        if not 0 <= index < self.size:
            raise IndexError(f"index {index} outside space of size {self.size}")
        values = {}
        for knob, radix in zip(reversed(self.knobs), reversed(self._radix)):
            index, digit = divmod(index, radix)
            values[knob.name] = knob.values[digit]
        return Config.of(values)

    def index(self, config: Config) -> int:
        """The index of a config (raises KeyError/ValueError if it is not in the product)."""
        index = 0
        for knob, radix in zip(self.knobs, self._radix):
            index = index * radix + knob.values.index(config[knob.name])
        return index

    def why_invalid(self, config: Config) -> str | None:
        """The first constraint a config breaks, or None when it is valid."""
        for constraint in self.constraints:
            reason = constraint(config)
            if reason:
                return reason
        return None

    def valid(self, config: Config) -> bool:
        """True when the config passes every constraint."""
        return self.why_invalid(config) is None

    def sample(self, rng: np.random.Generator, n: int, exclude: Iterable[Config] = ()) -> list[Config]:
        """Up to n distinct valid configs drawn uniformly, none of them in `exclude`."""
        return self._draw(rng, self.valid_indices, n, exclude)

    def sample_where(self, rng: np.random.Generator, n: int, name: str, value: int,
                     exclude: Iterable[Config] = ()) -> list[Config]:
        """Up to n distinct valid configs with knob `name` at `value`, drawn uniformly, none in `exclude`."""
        knob = next(i for i, k in enumerate(self.knobs) if k.name == name)
        indices, _ = self._by_value.get((knob, self.knobs[knob].values.index(value)), (np.empty(0, np.int64), None))
        return self._draw(rng, indices, n, exclude)

    def _draw(self, rng: np.random.Generator, indices: np.ndarray, n: int, exclude: Iterable[Config]) -> list[Config]:
        """Up to n distinct configs of sorted valid `indices`, drawn uniformly, none in `exclude`."""
        excluded = {self.index(c) for c in exclude if self.in_product(c)}
        pool = np.setdiff1d(indices, np.fromiter(excluded, dtype=np.int64), assume_unique=True)
        picks = rng.choice(pool, size=min(n, len(pool)), replace=False)
        return [self.config(int(i)) for i in picks]

    def neighbours(self, config: Config) -> list[Config]:
        """For each knob and each other value of it, the nearest valid config with that value:
        the config with just that knob changed where valid, else the fewest further knobs
        adjusted to make it valid (a 128x128 tile on 4 warps and 6 stages reaches 128x256 by
        taking 8 warps and 3 stages along, where no single-knob move is valid)."""
        moves = (self._nearest(config, k, pos, None) for k, knob in enumerate(self.knobs)
                 for pos, value in enumerate(knob.values) if value != config[knob.name])
        return list(dict.fromkeys(m for m in moves if m is not None))

    def in_product(self, config: Config) -> bool:
        """Whether every knob of the space has one of its values in `config` (a stored config of a
        space with other values, say deeper pipelines, may not)."""
        return all(k.name in config and config[k.name] in k.values for k in self.knobs)
