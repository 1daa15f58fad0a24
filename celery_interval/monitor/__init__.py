"""Live figures of a fleet's interval buckets: a Prometheus exporter and ``interval top``."""

from __future__ import annotations
