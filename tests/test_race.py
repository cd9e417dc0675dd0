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


def _cancelled_hammer(n: int, seed: int, slot: list, out: list) -> None:
    """Blocks of ~0.1 ms under a far deadline, each published in ``slot`` for the
    canceller; counts escapes, blocks that raised, and blocks that were cancelled."""
    rnd = random.Random(seed)
    escapes = raised = 0
    for _ in range(n):
        scope = timeoutcore.thread_deadline(30)
        slot[0] = scope
        try:
            try:
                with scope:
                    burn(0.0001 * rnd.uniform(0.5, 1.5))
            except DeadlineExceeded:
                raised += 1
            x = 0
            for _ in range(16):  # bytecode after the exit, where a stray interrupt lands
                x += 1
        except _DeadlineInterrupt:
            escapes += 1
        slot[0] = None
    out.append((escapes, raised))


def test_no_interrupt_escapes_a_block_cancelled_from_another_thread() -> None:
    """cancel() from another thread fires the block from the canceller's thread (the
    interrupt goes pending there for the block's own thread): cancels landing in every
    phase of entry, body and exit never let it surface outside the block, and every block
    that raised was one the canceller cancelled."""
    blocks = max(4000, BLOCKS // 10)
    slots: list[list] = [[None] for _ in range(THREADS)]
    results: list = []
    done = threading.Event()
    cancels = [0]

    def canceller() -> None:
        rnd = random.Random(99)
        while not done.is_set():
            scope = slots[rnd.randrange(THREADS)][0]
            if scope is not None:
                scope.cancel("hammer")
                cancels[0] += 1
            burn(0.0002 * rnd.random())

    threads = [
        threading.Thread(target=_cancelled_hammer, args=(blocks // THREADS, seed, slots[seed], results))
        for seed in range(THREADS)
    ]
    c = threading.Thread(target=canceller)
    c.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    c.join()
    escapes = sum(r[0] for r in results)
    raised = sum(r[1] for r in results)
    assert len(results) == THREADS
    assert 0 < raised <= cancels[0], (raised, cancels[0])
    assert escapes == 0
