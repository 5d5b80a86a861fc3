"""The contraction family: matmul and bmm in any layout, with fused epilogues."""
