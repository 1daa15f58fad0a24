"""Injected faults: killed workers, store restarts, network and clock faults."""
