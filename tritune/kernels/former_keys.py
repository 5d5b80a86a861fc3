"""Template keys of tritune before compiled-text keys, and carrying the trials stored under them over.

Before `template_key`, a family's template key hashed its sources' bytes (`codegen.files_hash`),
so any edit retired its trials. `FORMER` maps each op's last such key to the compiled-text key of
the same code (template version 1). The earlier byte keys of the repository's history were checked
the same way (each commit's own family sources, hashed both ways): none had the last code, so
their trials stay retired. A trial stored under a former key is carried over only while that key's
code is still today's: a later code change or a version bump leaves it where it is, as any
retired trial.
"""
from __future__ import annotations

from tritune.kernels.family import family, ops
from tritune.records.database import Database

# op -> {former byte key: the compiled-text key of its code}
FORMER: dict[str, dict[str, str]] = {
    "matmul": {"e90c416ba8874e75": "0fe0321c3146997d"},
    "bmm": {"e90c416ba8874e75": "0fe0321c3146997d"},
    "conv2d": {"0963f5b4f9f1b7b3": "a6b76c5fdac79a87"},
    "softmax": {"2fe8777c40f74a89": "e83d52c2a384565a"},
    "layernorm": {"2fe8777c40f74a89": "e83d52c2a384565a"},
    "gated": {"3a3e1857e753eff7": "be9b52ff6f7165b8"},
    "wide": {"4c79e208893eb38b": "9bcac5b7a3a87b1a"},
    "attention": {"147e70b24097f6d0": "951de0490466dcd1"},
}
# the op whose device key a compiled graph's verdicts are stored under (backend.compiler)
GRAPH_OP = "matmul"


def former_templates(op: str) -> dict[str, str]:
    """The op's former template keys whose code is today's, each mapped to today's key."""
    today = family(op).template_hash()
    return {old: today for old, key in FORMER.get(op, {}).items() if key == today}


def carry_over(db: Database) -> dict[str, int]:
    """Move every op's trials stored under a former key with today's code to today's key; how many
    moved, by op (`Database.carry_over`: nothing is deleted, a config stored under both stays)."""
    return {op: db.carry_over(op, former_templates(op), graphs=op == GRAPH_OP) for op in ops()}
