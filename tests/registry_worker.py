"""A worker process for the registry tests: runs jobs under DeadlineRegistry.deadline and
prints one JSON line per job on stdout.

    python registry_worker.py URL PREFIX MARGIN JOB:HARD:BODY:KIND [JOB:HARD:BODY:KIND ...]

KIND is ``sleep`` (time.sleep, stopped through timeoutcore.patch), ``recv`` (a socket read
from a peer that never sends, stopped through patch too; BODY is unused) or ``spin`` (a CPU
loop).
"""

from __future__ import annotations

import logging
import socket
import sys
import time

from timeoutcore import _json as orjson  # whichever JSON engine is active

import timeoutcore
from timeoutcore.contrib.redis import DeadlineRegistry


def spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    for _ in range(10**15):
        if time.monotonic() > end:
            return


def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(levelname)s %(name)s %(message)s")
    url, prefix, margin = sys.argv[1], sys.argv[2], float(sys.argv[3])
    timeoutcore.patch()
    registry = DeadlineRegistry.from_url(url, prefix=prefix, margin=margin, socket_timeout=0.5,
                                         retry_after=0.5)
    for spec in sys.argv[4:]:
        job, hard, body, kind = spec.split(":")
        scope = registry.deadline(job, float(hard))
        error = None
        try:
            with scope:
                if kind == "sleep":
                    time.sleep(float(body))
                elif kind == "recv":
                    mine, silent = socket.socketpair()
                    with mine, silent:
                        mine.recv(1)
                else:
                    spin(float(body))
        except timeoutcore.DeadlineExceeded as exc:
            error = type(exc).__name__
        stopped = time.monotonic()
        print(orjson.dumps({"job": job, "status": scope.result.status, "error": error,
                            "elapsed": scope.elapsed(), "stopped": stopped}).decode(),
              flush=True)


if __name__ == "__main__":
    main()
