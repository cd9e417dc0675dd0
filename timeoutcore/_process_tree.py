"""A command's process tree: signal it whole, reap it whole (no orphans, no zombies).

Used by ``run()`` and by ``patch()`` (a scope-owned ``Popen`` child whose wait the deadline
interrupted is killed and reaped here); plain ``os``/``signal`` code, safe to call while the
deadline's interrupt is being raised (nothing here waits with a deadline).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess as _stdlib_subprocess
import time
from typing import Any

from .blocking import original

_REAP_ORPHANS_FOR = 2.0  # s: at most, waiting for re-parented descendants to be reaped
_Popen = _stdlib_subprocess.Popen


def _session_members(sid: int) -> list[tuple[int, int, int, bytes]]:
    """``(pid, ppid, pgrp, state)`` of every process in session ``sid`` (from /proc)."""
    return [(pid, ppid, pgrp, state) for pid, ppid, pgrp, s, state in _process_table()
            if s == sid]


def signal_tree(leader: int, sig: int, *, session: bool = True) -> None:
    """Send ``sig`` to the process group ``leader`` and, with ``session``, to every other
    process of the session ``leader`` (descendants that moved to a process group of their
    own). Call it before ``leader`` is reaped: until then neither id can be reused."""
    try:
        os.killpg(leader, sig)
    except (ProcessLookupError, PermissionError):
        pass
    if not session:
        return
    for pid, _, pgrp, state in _session_members(leader):
        if pgrp != leader and state != b"Z":
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def kill_session(sid: int) -> None:
    """SIGKILL what is left of the session ``sid`` after its leader exited and was reaped
    (its background descendants), then reap those re-parented to this process.

    Only the members found in /proc are signalled, never ``killpg(sid)``: once nothing is
    left in the session, its number may belong to an unrelated process group."""
    members = _session_members(sid)
    if any(pid == sid for pid, _, _, _ in members):
        return  # a live process has the leader's number: not the session we knew
    found = False
    for pid, _, _, state in members:
        if state != b"Z":
            found = True
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    if found:
        reap_orphans(sid)


_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
_libc: Any = None


def _prctl(option: int, arg: Any) -> bool:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return bool(_libc.prctl(option, arg, 0, 0, 0) == 0)


def become_subreaper() -> None:
    """Make this process a child subreaper (``PR_SET_CHILD_SUBREAPER``): orphaned
    descendants are re-parented to it instead of to init, so :func:`kill_descendants`
    finds them all -- ``setsid()`` escapes and daemons included. ``OSError`` if refused."""
    if not _prctl(_PR_SET_CHILD_SUBREAPER, 1):
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(err)}")


def _process_table() -> list[tuple[int, int, int, int, bytes]]:
    """``(pid, ppid, pgrp, sid, state)`` of every process (from /proc)."""
    table = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
            fields = data[data.rindex(b")") + 2:].split()
            table.append((int(name), int(fields[1]), int(fields[2]), int(fields[3]),
                          fields[0]))
        except (OSError, ValueError, IndexError):
            continue
    return table


def descendants(*, other_sessions: bool = False) -> list[tuple[int, int, bytes]]:
    """``(pid, ppid, state)`` of every descendant of this process (zombies included);
    with ``other_sessions``, only those outside this process's session and their subtrees
    (what tasks start under ``patch()`` -- a session of their own each -- and daemons that
    ``setsid()``; not the helpers this process forks itself, such as Celery's embedded
    beat or multiprocessing's resource tracker)."""
    me = os.getpid()
    mine = os.getsid(0)
    table = _process_table()
    by_parent: dict[int, list[tuple[int, int, int, int, bytes]]] = {}
    for entry in table:
        by_parent.setdefault(entry[1], []).append(entry)
    out: list[tuple[int, int, bytes]] = []
    todo = [(me, False)]
    while todo:
        parent, inside = todo.pop()
        for pid, ppid, _, sid, state in by_parent.get(parent, ()):
            taken = inside or not other_sessions or sid != mine
            if taken:
                out.append((pid, ppid, state))
            todo.append((pid, taken))
    return out


def kill_descendants(timeout: float = _REAP_ORPHANS_FOR, *, other_sessions: bool = False) -> int:
    """SIGKILL every descendant of this process (with ``other_sessions``: see
    :func:`descendants`) and reap them; returns how many were killed or reaped. Meant for
    a child subreaper (:func:`become_subreaper`): then the descendants of killed ones come
    back to it and are reaped too. Never waits with a deadline; at most ``timeout``
    seconds for the re-parented ones. (The /proc scan and the kill are two steps: a
    process that exits and is reaped by its own parent in between has its pid free again;
    the window is microseconds, the kernel hands pids out in order.)"""
    me = os.getpid()
    end = time.monotonic() + timeout
    count = 0
    seen: set[int] = set()
    while True:
        found = descendants(other_sessions=other_sessions)
        for pid, ppid, state in found:
            if state != b"Z" and pid not in seen:
                seen.add(pid)
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for pid, ppid, _ in found:
            if ppid == me:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0] == pid:
                        count += 1
                except ChildProcessError:
                    pass
        if not found or time.monotonic() >= end:
            return max(count, len(seen))
        time.sleep(0.001)


def _is_reaper() -> bool:
    """Are orphans re-parented to this process (PID 1, or a child subreaper)?"""
    if os.getpid() == 1:
        return True
    try:
        flag = ctypes.c_int(0)
        return _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag)) and bool(flag.value)
    except (OSError, AttributeError):
        return False


def reap_orphans(sid: int, timeout: float = _REAP_ORPHANS_FOR) -> None:
    """Reap the processes of session ``sid`` that were re-parented to this process.

    Only does something when this process is PID 1 or a child subreaper (otherwise orphans
    go to one of those, which reaps them). The members must have been sent ``SIGKILL``.
    """
    if not _is_reaper():
        return
    me = os.getpid()
    end = time.monotonic() + timeout
    while True:
        members = _session_members(sid)
        for pid, ppid, _, _ in members:
            if ppid == me:
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
        if not members or time.monotonic() >= end:
            return
        if all(ppid != me and state == b"Z" for _, ppid, _, state in members):
            return  # zombies of someone else's
        time.sleep(0.001)


def kill_and_reap(proc: Any, *, group: bool = True) -> None:
    """SIGKILL a ``Popen`` child (its whole group and session with ``group``) and reap it.

    Used when a scope's deadline interrupts a wait on a scope-owned child; safe to call while
    the interrupt is being raised (it never waits with a deadline).
    """
    if proc.returncode is None:
        if group:
            signal_tree(proc.pid, signal.SIGKILL)
        else:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # gone, or it changed its user (setuid): it is not ours to kill
        _reap(proc)
    if group:
        reap_orphans(proc.pid)


def _reap(proc: Any, timeout: float = _REAP_ORPHANS_FOR) -> None:
    """Reap ``proc`` (already sent SIGKILL) without a deadline and without patched calls,
    waiting at most ``timeout`` seconds (a child that could not be killed -- it changed
    its user -- is left to its ``Popen``)."""
    end = time.monotonic() + timeout
    while proc.returncode is None:
        try:
            pid, status = os.waitpid(proc.pid, os.WNOHANG)
        except ChildProcessError:
            original(_Popen.poll)(proc)  # someone else reaped it: let Popen find out
            return
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return
        if time.monotonic() >= end:
            return
        time.sleep(0.0005)
