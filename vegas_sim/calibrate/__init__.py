"""The GPU half: model runtime, weight loading, spec-decode loop, timers, grid runner."""
