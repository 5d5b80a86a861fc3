"""The wide GEMM family: projections of one input (q, k, v) as one launch with separate outputs."""
