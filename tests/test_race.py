"""The race hammer: an interrupt must never surface after its block has exited.

Many blocks whose body lasts about as long as their deadline, so that the deadline fires
in every phase of the block's exit. Any internal interrupt seen *outside* a block is an
escape. TIMEOUTCORE_HAMMER_BLOCKS sets the total (default 100 000).
"""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

import timeoutcore
from timeoutcore import DeadlineExceeded
from timeoutcore.errors import _DeadlineInterrupt

BLOCKS = int(os.environ.get("TIMEOUTCORE_HAMMER_BLOCKS", "100000"))
THREADS = 4
DEADLINE = 0.0002


def burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def hammer(n: int, seed: int, out: list) -> None:
    rnd = random.Random(seed)
    escapes = timeouts = 0
    for i in range(n):
        body = DEADLINE * rnd.uniform(0.5, 1.5)
        try:
            try:
                with timeoutcore.thread_deadline(DEADLINE):
                    if i % 4 == 0:
                        time.sleep(body)  # releases the GIL
                    else:
                        burn(body)
            except DeadlineExceeded:
                timeouts += 1
            x = 0
            for _ in range(16):  # bytecode after the exit, where a stray interrupt lands
                x += 1
        except _DeadlineInterrupt:
            escapes += 1
    out.append((escapes, timeouts))


@pytest.mark.skipif(timeoutcore.ENGINE != "native", reason="the fallback engine documents rare escapes")
def test_no_interrupt_escapes_its_block() -> None:
    results: list = []
    threads = [
        threading.Thread(target=hammer, args=(BLOCKS // THREADS, seed, results))
        for seed in range(THREADS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    escapes = sum(r[0] for r in results)
    timeouts = sum(r[1] for r in results)
    assert len(results) == THREADS
    # the hammer only means something if deadlines really fire in a good share of blocks
    assert 0.02 * BLOCKS < timeouts < 0.98 * BLOCKS, timeouts
    assert escapes == 0
