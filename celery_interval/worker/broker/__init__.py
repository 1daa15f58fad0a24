"""The consumer's side of the broker: parking in overflow queues, delivery, broker loss."""

from __future__ import annotations
