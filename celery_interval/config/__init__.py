"""The one home of every ``interval_*`` setting: the table, the bucket declarations of
``interval_queues``, the checked values and the validated ``Settings`` of an app."""

from __future__ import annotations

from celery_interval.config.declarations import (
    Bucket,
    Declaration,
    lookup,
    parse_declaration,
    parse_own,
    parse_queues,
)
from celery_interval.config.intervals import parse_interval_us
from celery_interval.config.settings import Settings, forget, settings_of
from celery_interval.config.suggest import closest, did_you_mean
from celery_interval.config.table import DEFAULTS, FIELDS, SETTINGS
from celery_interval.config.values import check_int, check_seconds, check_share

__all__ = [
    "DEFAULTS",
    "FIELDS",
    "SETTINGS",
    "Bucket",
    "Declaration",
    "Settings",
    "check_int",
    "check_seconds",
    "check_share",
    "closest",
    "did_you_mean",
    "forget",
    "lookup",
    "parse_declaration",
    "parse_interval_us",
    "parse_own",
    "parse_queues",
    "settings_of",
]
