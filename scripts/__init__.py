"""Benchmarks and probes for a GPU host (speed lives here, not in the tests). Each is a module run
from the repository's root: `python -m scripts.bench.model_bench --help`.

- `bench`: product benchmarks, tritune against torch, cuDNN and Inductor (results in BENCHMARKS.md);
- `probes`: one-off measurements behind a design choice (how L2 is flushed, how long to time, what
  cuBLAS launches, what a replayed call costs);
- `reliability`: a long run with its worker killed again and again (`soak`).

Every timing goes through `tritune.tuner.timing`; every model is built by `tritune.tuner.model.load`.
"""
