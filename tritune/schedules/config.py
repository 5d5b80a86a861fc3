"""Config: one point of a schedule space, a frozen value with one canonical JSON form."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Iterator, Mapping


@dataclass(frozen=True)
class Config(Mapping):
    """An immutable, hashable mapping of knob name to value (ints or short strings)."""

    items_: tuple[tuple[str, int | str], ...]

    @classmethod
    def of(cls, mapping: Mapping[str, int | str] | None = None, **knobs: int | str) -> "Config":
        """Build a Config from a mapping and/or keyword knobs (order does not matter)."""
        merged = dict(mapping or {}, **knobs)
        return cls(tuple(sorted(merged.items())))

    @classmethod
    def from_json(cls, text: str) -> "Config":
        """Parse the canonical JSON form back into a Config."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"config JSON must be an object, got {type(data).__name__}")
        return cls.of(data)

    def __getitem__(self, knob: str) -> int | str:
        for name, value in self.items_:
            if name == knob:
                return value
        raise KeyError(knob)

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self.items_)

    def __len__(self) -> int:
        return len(self.items_)

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
