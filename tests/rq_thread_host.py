"""A process that hosts RQ workers in threads other than the main one (tests/test_rq.py):
``python rq_thread_host.py <redis url> <queue> <workers>`` runs ``<workers>`` instances of
``timeoutcore.contrib.rq.SimpleWorker`` in burst mode, each in a thread of its own, on
``<queue>``, and exits once they are done; it prints the threads it had before and after."""

from __future__ import annotations

import json
import sys
import threading

from redis import Redis

from timeoutcore.contrib.rq import SimpleWorker


def main(url: str, queue: str, workers: int) -> None:
    before = sorted(t.name for t in threading.enumerate())
    connection = Redis.from_url(url)
    threads = [
        threading.Thread(target=SimpleWorker([queue], connection=connection,
                                             name=f"{queue}-t{i}").work,
                         kwargs={"burst": True}, name=f"rq-host-{i}")
        for i in range(workers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    after = sorted(t.name for t in threading.enumerate())
    connection.close()
    print(json.dumps({"before": before, "after": after}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
