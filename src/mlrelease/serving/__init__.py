"""Serving with Triton: the model repository, the CPU translation, the local server and its client."""
