"""Register the consumer bootstep and the remote control commands with an app (idempotent)."""

from __future__ import annotations

from typing import Any

__all__ = ["install"]


def install(app: Any) -> None:
    """Add the interval bootstep to ``app``'s consumer, open each pool process's store
    connection as the process starts, make a plain task released from an interval queue wait
    for its start, see that a body's posted done mark reached the store as it ends, stamp
    each task message sent from this process with its send's code, and
    name the interval queues in the worker's banner; safe to call any number of times."""
    from celery.signals import (
        before_task_publish,
        celeryd_after_setup,
        task_postrun,
        task_prerun,
        worker_process_init,
    )

    import celery_interval.worker.control  # noqa: F401  (registers the control commands)
    from celery_interval.headers import stamp_send
    from celery_interval.worker.banner import extend_banner
    from celery_interval.worker.bootstep import IntervalStep
    from celery_interval.worker.process import started

    app.steps["consumer"].add(IntervalStep)
    worker_process_init.connect(
        lambda **_: started.warm(app), weak=False, dispatch_uid=f"celery_interval.warm.{id(app)}"
    )
    task_prerun.connect(started.before_plain_body, dispatch_uid="celery_interval.before_body")
    task_postrun.connect(started.after_body, dispatch_uid="celery_interval.after_body")
    before_task_publish.connect(stamp_send, dispatch_uid="celery_interval.stamp_send")
    celeryd_after_setup.connect(extend_banner, dispatch_uid="celery_interval.banner")
