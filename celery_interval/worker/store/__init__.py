"""The consumer's records in the store: done marks, births, leases, places, outages."""

from __future__ import annotations
