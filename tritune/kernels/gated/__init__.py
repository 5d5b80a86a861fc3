"""The gated dual-GEMM family: act(x @ W1ᵀ) * (x @ W2ᵀ) in one kernel (SwiGLU, GeGLU)."""
