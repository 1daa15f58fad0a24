"""The test suite: unit, integration, faults and spark tests, and their helpers."""
