"""Rewrite ``constraints.txt``: the exact versions CI installs, resolved afresh from PyPI.

    python3 scripts/refresh_constraints.py            # every CPython 3.11-3.14(t) found
    python3 scripts/refresh_constraints.py python3.12 /opt/py314t/bin/python3.14t

CI (``.ci/run``) and every nox session install through ``constraints.txt`` (``PIP_CONSTRAINT``
and ``PIP_BUILD_CONSTRAINT``), so a release elsewhere changes nothing until this script is run
and its diff committed on its own: a refresh is a deliberate change that CI tests like any
other. The package's own requirements (``setup.py``) stay ranges; the constraints only fix
which version of each range the project's checks run against.

For each interpreter, pip resolves (``--dry-run --report``, nothing is installed) everything CI
installs with it: the build requirements (build isolation), the project with its ``test``,
``celery``, ``redis``, ``anyio``, ``dramatiq``, ``rq``, ``huey``, ``docs`` and ``plot``
extras, the tools the nox sessions add (ruff, mypy, type stubs) and nox itself. A package whose newest allowed version differs between interpreters gets one line per
``python_version``; 3.14 and 3.14t must agree (no PEP 508 marker tells them apart).

Tools and stubs are named in ``TOOLS`` below with the reason for any cap.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "constraints.txt"
VERSIONS = ["3.11", "3.12", "3.13", "3.14", "3.14t"]

# What the nox sessions and .ci/run install besides the project. A cap says why it is there;
# lifting one is a change of its own (fix what the newer tool reports, then lift).
TOOLS = [
    # [tool.ruff] selects no rules, so the rule set is ruff's default, and 0.16 widened that
    # default from 59 rules to 413: stay on 0.15.x until pyproject selects its rules.
    "ruff<0.16",
    # 1.20 reports false union-attr errors after `x is None or x is not <Any>` guards
    # (timeoutcore/_fallback.py).
    "mypy<1.20",
    "types-cffi",
    "nox",
    # the docs session's check of the README as PyPI renders it
    "twine",
]
EXTRAS = ".[test,celery,redis,anyio,dramatiq,rq,huey,docs,plot]"


def _find_interpreters() -> list[str]:
    found = []
    pyenv_root = os.environ.get("PYENV_ROOT") or _run_out(["pyenv", "root"])
    for version in VERSIONS:
        exe = shutil.which(f"python{version}")
        if exe is not None and not _works(exe):
            exe = None  # a pyenv shim for a version pyenv does not select
        if exe is None and pyenv_root and not version.endswith("t"):
            candidates = sorted(
                Path(pyenv_root, "versions").glob(f"{version}.*"),
                key=lambda d: [int(x) for x in re.findall(r"\d+", d.name)],
            )
            plain = [d for d in candidates if re.fullmatch(rf"{re.escape(version)}\.\d+", d.name)]
            if plain:
                exe = str(plain[-1] / "bin" / f"python{version}")
        if exe is not None:
            found.append(exe)
    return found


def _works(exe: str) -> bool:
    try:
        return subprocess.run([exe, "-c", "pass"], capture_output=True, check=False).returncode == 0
    except OSError:
        return False


def _run_out(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return ""


def _tag(exe: str) -> str:
    """'3.12' or '3.14t': the interpreter's version and whether it is free-threaded."""
    code = ("import sys, sysconfig; print('%d.%d%s' % (sys.version_info[:2] + "
            "('t' if sysconfig.get_config_var('Py_GIL_DISABLED') else '',)))")
    return subprocess.run([exe, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()


def _resolve(exe: str, requirements: list[str]) -> dict[str, str]:
    """name -> version that pip would install for ``requirements`` on ``exe``."""
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp, "venv")
        subprocess.run([exe, "-m", "venv", str(venv)], check=True)
        py = str(venv / "bin" / "python")
        env = dict(os.environ, PIP_CONSTRAINT="", PIP_BUILD_CONSTRAINT="",
                   PIP_DISABLE_PIP_VERSION_CHECK="1")
        # A pip that knows --report (22.2+), the same one on every interpreter.
        subprocess.run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True,
                       env=env)
        report = Path(tmp, "report.json")
        subprocess.run([py, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
                        "--report", str(report), *requirements],
                       check=True, env=env, cwd=ROOT)
        data = json.loads(report.read_text())
    pins = {}
    for item in data["install"]:
        meta = item["metadata"]
        name = re.sub(r"[-_.]+", "-", meta["name"]).lower()
        if name == "timeoutcore":
            continue
        pins[name] = meta["version"]
    return pins


def main(argv: list[str]) -> int:
    exes = argv or _find_interpreters()
    if not exes:
        print("no CPython 3.11-3.14 found", file=sys.stderr)
        return 1
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    per_version: dict[str, dict[str, str]] = {}
    for exe in exes:
        tag = _tag(exe)
        print(f"resolving for {tag} ({exe})", file=sys.stderr)
        pins = _resolve(exe, [EXTRAS, *TOOLS])
        for name, version in _resolve(exe, build).items():
            if pins.setdefault(name, version) != version:
                print(f"{tag}: the build wants {name}=={version}, the install "
                      f"{pins[name]}: pinning the install's", file=sys.stderr)
        per_version[tag] = pins
    gil_free = per_version.pop("3.14t", None)
    if gil_free is not None and "3.14" in per_version:
        clash = {n for n in gil_free.keys() & per_version["3.14"].keys()
                 if gil_free[n] != per_version["3.14"][n]}
        if clash:
            print(f"3.14 and 3.14t resolve differently: {sorted(clash)}", file=sys.stderr)
            return 1
    if gil_free is not None:
        # Free-threaded-only packages (none disagree with 3.14, checked above).
        per_version.setdefault("3.14", {})
        for name, version in gil_free.items():
            per_version["3.14"].setdefault(name, version)

    lines = []
    for name in sorted({n for pins in per_version.values() for n in pins}):
        versions = {tag: pins[name] for tag, pins in per_version.items() if name in pins}
        if len(set(versions.values())) == 1:
            lines.append(f"{name}=={next(iter(versions.values()))}")
        else:
            for tag, version in sorted(versions.items()):
                lines.append(f'{name}=={version}; python_version == "{tag}"')
    resolved_for = sorted(per_version) + (["3.14t"] if gil_free is not None else [])
    header = [
        "# Exact versions for CI and the nox sessions (PIP_CONSTRAINT). Written by",
        "# scripts/refresh_constraints.py; refresh on purpose, in a commit of its own.",
        f"# Resolved for CPython {', '.join(resolved_for)}.",
    ]
    OUT.write_text("\n".join(header + lines) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}: {len(lines)} lines", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
