"""The PyTorch side: call-time replay (ops), graph matching, task extraction, the torch.compile backend."""
