"""Trace sets: the contract between calibrate/ (GPU) and sim/ (CPU)."""
