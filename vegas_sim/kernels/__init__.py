"""Triton kernels and a pure-torch reference for each (see API.md). Nothing runs at import."""
