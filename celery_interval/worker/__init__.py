"""The worker side: the consumer bootstep and the services it runs inside a Celery worker."""
