"""The CPU half: latency model, acceptance model, SimPy engine, analytic model, predict API."""
