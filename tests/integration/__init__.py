"""Real Celery workers, brokers and the command line."""
