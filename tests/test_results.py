"""Results (pydantic + JSON), the JSON Lines sink, and metrics."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path
from typing import Any

from timeoutcore import _json as orjson  # whichever JSON engine is active
import pytest
from conftest import burn, spin_forever

import timeoutcore
from timeoutcore import DeadlineExceeded, DeadlineResult, ResultLog, metrics


def test_result_of_a_timed_out_block(api: Any) -> None:
    with pytest.raises(DeadlineExceeded):
        with api.thread_deadline(0.03, label="r", soft=0.01) as scope:
            spin_forever()
    r = scope.result
    assert isinstance(r, DeadlineResult)
    assert r.status == "timed_out" and r.label == "r" and r.limit == 0.03 and r.soft_limit == 0.01
    assert r.thread_name == threading.current_thread().name
    assert r.thread_native_id == threading.get_native_id()
    assert r.overshoot is not None and r.overshoot >= 0 and r.elapsed >= 0.03
    assert r.started_at.tzinfo is not None
    assert abs((dt.datetime.now(dt.timezone.utc) - r.started_at).total_seconds()) < 5


def test_result_statuses(api: Any) -> None:
    with api.thread_deadline(1) as ok:
        pass
    assert ok.result.status == "completed"
    with pytest.raises(KeyError):
        with api.thread_deadline(1) as bad:
            raise KeyError("boom")
    assert bad.result.status == "error"
    assert bad.result.error_type == "KeyError" and "boom" in bad.result.error_message
    # runs until the soft limit has passed, however slow the machine (the hard limit
    # caps a soft limit that never fires, and then the block does not complete)
    with api.thread_deadline(5, soft=0.02) as soft:
        _until_soft(soft)
    assert soft.result.status == "soft_exceeded"


def _until_soft(scope: Any) -> None:
    """Run until the soft limit of ``scope`` has passed (its own frame: cpython#130279)."""
    while not scope.soft_expired():
        burn(0.005)


def test_result_before_exit_is_an_error(api: Any) -> None:
    with api.thread_deadline(1) as scope:
        with pytest.raises(RuntimeError, match="exited"):
            scope.result


def test_result_json_round_trip() -> None:
    with pytest.raises(DeadlineExceeded):
        with timeoutcore.thread_deadline(0.02, label="rt") as scope:
            spin_forever()
    data = scope.result.to_json()
    assert isinstance(data, bytes) and orjson.loads(data)["status"] == "timed_out"
    assert DeadlineResult.from_json(data) == scope.result


def test_result_log_per_scope(tmp_path: Path) -> None:
    with ResultLog(tmp_path / "r.jsonl") as log:
        with timeoutcore.thread_deadline(1, label="a", result_log=log):
            pass
        with pytest.raises(DeadlineExceeded):
            with timeoutcore.thread_deadline(0.02, label="b", result_log=log):
                spin_forever()
        got = log.read()
    assert [(r.label, r.status) for r in got] == [("a", "completed"), ("b", "timed_out")]


def test_result_log_with_eight_concurrent_writers(tmp_path: Path) -> None:
    path = tmp_path / "many.jsonl"
    per_thread = 200
    with ResultLog(path) as log:
        timeoutcore.set_default_result_log(log)
        try:
            def writer(n: int) -> None:
                for i in range(per_thread):
                    try:
                        with timeoutcore.thread_deadline(
                            0.001 if i % 50 == 0 else 5, label=f"w{n}"
                        ):
                            if i % 50 == 0:
                                spin_forever()
                    except DeadlineExceeded:
                        pass

            threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            timeoutcore.set_default_result_log(None)
    lines = path.read_bytes().splitlines()
    assert len(lines) == 8 * per_thread
    parsed = [DeadlineResult.from_json(line) for line in lines]
    assert sum(r.status == "timed_out" for r in parsed) == 8 * (per_thread // 50)
    assert {r.label for r in parsed} == {f"w{n}" for n in range(8)}


def test_metrics_count_a_mixed_workload() -> None:
    metrics.collector.reset()
    metrics.enable()
    try:
        for _ in range(5):
            with timeoutcore.thread_deadline(1, label="fast"):
                pass
        for _ in range(3):
            with pytest.raises(DeadlineExceeded):
                with timeoutcore.thread_deadline(0.01, label="slow"):
                    spin_forever()
        with pytest.raises(ValueError):
            with timeoutcore.thread_deadline(1, label="err"):
                raise ValueError
    finally:
        metrics.disable()
    with timeoutcore.thread_deadline(1, label="fast"):  # not counted: disabled
        pass
    snap = metrics.collector.snapshot()
    assert snap["total"] == 9
    assert snap["by_status"] == {"completed": 5, "timed_out": 3, "error": 1}
    assert snap["by_label"]["slow"] == {"timed_out": 3}
    over = snap["overshoot"]["slow"]
    assert over["count"] == 3 and 0 <= over["p50"] <= over["p90"] <= over["p99"]
    assert orjson.loads(metrics.collector.snapshot_json()) == orjson.loads(orjson.dumps(snap))
    text = metrics.collector.prometheus()
    assert 'timeoutcore_blocks_total{status="timed_out",label="slow"} 3' in text
    assert 'timeoutcore_overshoot_seconds_count{label="slow"} 3' in text
    assert "# TYPE timeoutcore_elapsed_seconds histogram" in text


def test_metrics_off_means_no_hook() -> None:
    assert not metrics.enabled()
    scope = timeoutcore.thread_deadline(1)
    assert scope._hook is None
