"""Integrations with other libraries; each needs its extra (``timeoutcore[celery]``,
``timeoutcore[redis]``) and is imported on its own, never by ``import timeoutcore``."""
