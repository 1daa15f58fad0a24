"""Reach the machine's services and tools, or skip (fail under CI=true) with the reason."""

from __future__ import annotations

import os
import socket

import pytest

RABBITMQ_URL = os.environ.get("CI_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")


def reachable(host: str, port: int, timeout_s: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def skip_or_fail(message: str) -> None:
    """A missing service or tool is a skip on a developer's machine, a failure under CI=true."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {message}")
    pytest.skip(message)


def require_service(name: str, host: str, port: int, hint: str) -> None:
    """Skip when a shared service is down (under CI=true: fail)."""
    if not reachable(host, port):
        skip_or_fail(f"{name} is not reachable at {host}:{port} ({hint})")


def rabbitmq_url() -> str:
    require_service("RabbitMQ", "127.0.0.1", 5672, "start it with `rabbitmq-server -detached`")
    return RABBITMQ_URL
