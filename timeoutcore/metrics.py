"""A process-wide, thread-safe collector of what guarded blocks did.

Off by default and then free: no hook runs. ``metrics.enable()`` installs the core's default
hook, after which every scope's exit is counted per status and label, and its elapsed time
and overshoot go into histograms. ``snapshot()`` returns a dict (``snapshot_json()`` the
same as JSON bytes) with p50/p90/p99; ``prometheus()`` renders the text exposition format.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import deque
from typing import Any, Optional

from . import _hooks

# Histogram bucket upper bounds in seconds (Prometheus style, cumulative on export).
BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)
_SAMPLES = 10_000  # most recent values kept per histogram for exact percentiles


class Histogram:
    """Buckets for export plus the most recent samples for percentiles."""

    __slots__ = ("counts", "total", "count", "samples")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.total = 0.0
        self.count = 0
        self.samples: deque[float] = deque(maxlen=_SAMPLES)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, value)] += 1
        self.total += value
        self.count += 1
        self.samples.append(value)

    def percentile(self, q: float) -> Optional[float]:
        if not self.samples:
            return None
        ordered = sorted(self.samples)
        rank = max(0, math.ceil(q / 100 * len(ordered)) - 1)
        return ordered[rank]

    def summary(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "sum": self.total,
            "p50": self.percentile(50),
            "p90": self.percentile(90),
            "p99": self.percentile(99),
        }


class Metrics:
    """Counts per (status, label) and elapsed/overshoot/deferred histograms per label."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}
        self._elapsed: dict[str, Histogram] = {}
        self._overshoot: dict[str, Histogram] = {}
        self._deferred: dict[str, Histogram] = {}

    def record(
        self, status: str, label: Optional[str], elapsed: float, overshoot: Optional[float],
        deferred: Optional[float] = None,
    ) -> None:
        """Count one exited block; ``deferred`` (seconds its interrupt waited for protected
        code, None if it did not fire) goes to the deferred histogram."""
        key = label if label is not None else ""
        with self._lock:
            self._counts[(status, key)] = self._counts.get((status, key), 0) + 1
            self._elapsed.setdefault(key, Histogram()).observe(elapsed)
            if overshoot is not None:
                self._overshoot.setdefault(key, Histogram()).observe(overshoot)
            if deferred is not None:
                self._deferred.setdefault(key, Histogram()).observe(deferred)

    def reset(self) -> None:
        """Forget everything counted so far."""
        with self._lock:
            self._counts.clear()
            self._elapsed.clear()
            self._overshoot.clear()
            self._deferred.clear()

    def snapshot(self) -> dict[str, Any]:
        """Counts by status and by label, and histogram summaries (seconds)."""
        with self._lock:
            by_status: dict[str, int] = {}
            by_label: dict[str, dict[str, int]] = {}
            for (status, label), n in self._counts.items():
                by_status[status] = by_status.get(status, 0) + n
                by_label.setdefault(label, {})[status] = n
            return {
                "total": sum(by_status.values()),
                "by_status": by_status,
                "by_label": by_label,
                "elapsed": {k: h.summary() for k, h in self._elapsed.items()},
                "overshoot": {k: h.summary() for k, h in self._overshoot.items()},
                "deferred": {k: h.summary() for k, h in self._deferred.items()},
            }

    def snapshot_json(self) -> bytes:
        """:meth:`snapshot` as JSON bytes (orjson's bytes, whichever engine writes them)."""
        from . import _json  # only for this serialisation: counting needs no JSON engine

        return _json.dumps(self.snapshot())

    def prometheus(self) -> str:
        """The Prometheus text exposition format (version 0.0.4)."""
        lines = [
            "# HELP timeoutcore_blocks_total Guarded blocks that exited, by status and label.",
            "# TYPE timeoutcore_blocks_total counter",
        ]
        with self._lock:
            for (status, label), n in sorted(self._counts.items()):
                lines.append(
                    f'timeoutcore_blocks_total{{status="{status}",label="{_esc(label)}"}} {n}'
                )
            for name, hists, what in (
                ("timeoutcore_elapsed_seconds", self._elapsed, "Time spent in guarded blocks."),
                ("timeoutcore_overshoot_seconds", self._overshoot,
                 "How late blocks that hit their deadline were left."),
                ("timeoutcore_deferred_seconds", self._deferred,
                 "How long fired interrupts waited for the thread to leave protected code."),
            ):
                lines.append(f"# HELP {name} {what}")
                lines.append(f"# TYPE {name} histogram")
                for label, h in sorted(hists.items()):
                    lab = _esc(label)
                    cumulative = 0
                    for bound, n in zip(BUCKETS, h.counts):
                        cumulative += n
                        lines.append(f'{name}_bucket{{label="{lab}",le="{bound:g}"}} {cumulative}')
                    lines.append(f'{name}_bucket{{label="{lab}",le="+Inf"}} {h.count}')
                    lines.append(f'{name}_sum{{label="{lab}"}} {h.total:.9g}')
                    lines.append(f'{name}_count{{label="{lab}"}} {h.count}')
        return "\n".join(lines) + "\n"


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


collector = Metrics()


def enable() -> Metrics:
    """Start counting every guarded block (process-wide); returns the collector."""
    _hooks.set_metrics(collector.record)
    return collector


def disable() -> None:
    """Stop counting (what was counted stays until ``collector.reset()``)."""
    _hooks.set_metrics(None)


def enabled() -> bool:
    """Whether blocks are being counted."""
    return _hooks.state.recorder is not None
