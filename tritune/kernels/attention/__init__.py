"""The attention family: softmax(scale·q·kᵀ + mask)·v for a few query rows (decode, speculative tokens)."""
