"""vegas-sim: predict self-speculative decoding performance from GPU-measured trace sets."""

__version__ = "0.1.0"
