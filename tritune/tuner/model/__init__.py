"""Whole models: the one model loader (`load`), the plan that shares a trial budget among a model's
workloads (`plan`), the whole-model check against Inductor (`check`), and real architectures built
from `transformers` configs for the examples, tests and benchmarks (`zoo`)."""
