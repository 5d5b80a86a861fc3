"""The row-reduction family: softmax and layernorm over the last dimension."""
