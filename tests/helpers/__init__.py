"""Shared test helpers, and the Celery apps test workers run (``-A tests.helpers.workerapp``)."""
