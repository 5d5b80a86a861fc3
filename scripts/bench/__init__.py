"""Product benchmarks on a GPU: whole models, fused blocks, conv2d, row ops, one matmul against the
field, search strategies, and the vertical-slice shell run (bench_tune.sh)."""
