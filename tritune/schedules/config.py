"""Config: one point of a schedule space, a frozen value with one canonical JSON form."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Iterator, Mapping


@dataclass(frozen=True)
class Config(Mapping):
    """An immutable, hashable mapping of knob name to value (ints or short strings)."""

    items_: tuple[tuple[str, int | str], ...]
    # the same pairs as a dict: knob lookups run millions of times in space enumeration and search
    _map: dict = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_map", dict(self.items_))

    @classmethod
    def of(cls, mapping: Mapping[str, int | str] | None = None, **knobs: int | str) -> "Config":
        """Build a Config from a mapping and/or keyword knobs (order does not matter)."""
        merged = dict(mapping or {}, **knobs) if knobs else (mapping or {})
        return cls(tuple(sorted(merged.items())))

    @classmethod
    def from_json(cls, text: str) -> "Config":
        """Parse the canonical JSON form back into a Config."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"config JSON must be an object, got {type(data).__name__}")
        return cls.of(data)

    def __getitem__(self, knob: str) -> int | str:
        return self._map[knob]

    def get(self, knob: str, default: int | str | None = None) -> int | str | None:
        """The knob's value, or `default` where the config lacks it."""
        return self._map.get(knob, default)

    def __contains__(self, knob: object) -> bool:
        return knob in self._map

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self.items_)

    def __len__(self) -> int:
        return len(self.items_)

    @property
    def library(self) -> str | None:
        """The library implementation this config names (`Config.of(library="addmm")`: the
        implementation a user has without tritune, measured as a candidate), or None for a schedule."""
        return self._map.get("library")

    def replace(self, **knobs: int | str) -> "Config":
        """A copy with some knobs changed."""
        return Config.of(dict(self.items_), **knobs)

    def to_json(self) -> str:
        """The canonical JSON form: sorted keys, no spaces. Keys and hashes derive from it."""
        return json.dumps(dict(self.items_), sort_keys=True, separators=(",", ":"))

    @property
    def key(self) -> str:
        """A short stable hash of the canonical JSON form."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"Config({self.to_json()})"
