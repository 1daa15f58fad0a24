"""In-process tests: the model, intervals, clocks, the stores (on a private redis-server)."""
