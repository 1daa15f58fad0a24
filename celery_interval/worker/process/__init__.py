"""Code that runs in a pool process, around a task's body: its claim again, a throttle, a resend."""

from __future__ import annotations
