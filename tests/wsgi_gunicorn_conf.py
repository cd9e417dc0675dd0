"""gunicorn configuration for tests/test_wsgi.py: the recipe of docs/wsgi.md.

``timeoutcore.patch()`` runs in each worker after the fork (and before the worker imports
the application, unless ``--preload``), so ``time.sleep``, socket reads and subprocess waits
in a request stop at the request's deadline.
"""

from __future__ import annotations

from typing import Any

import timeoutcore


def post_fork(server: Any, worker: Any) -> None:
    timeoutcore.patch()
