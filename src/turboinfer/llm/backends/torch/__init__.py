"""Steps on torch operations: the general packed path on any ``torch.device``, and the
lean one-sequence decoders that skip the batch machinery."""
