# Shared helpers for the tool tests (bash). Sourced, not run.
# Each test gets its own temp directory, removed at exit.
set -u

T=$(mktemp -d "${TMPDIR:-/tmp}/kcache-tool.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
KC=${KCACHE_TOOL:?KCACHE_TOOL is not set}
# The test environment's own variables (KCACHE_SHIM, ...) would each draw an
# "unknown variable" warning; drop them for the tool under test.
unset KCACHE_SHIM KCACHE_SRC KCACHE_BUILD KCACHE_DIR
export HOME="$T/home" XDG_CACHE_HOME="$T/xdg"
mkdir -p "$HOME"

failures=0
checks=0
fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}
ok() { checks=$((checks + 1)); }

# run CMD...: runs it, leaving $rc, $out (stdout) and $err (stderr).
run() {
    "$@" >"$T/.out" 2>"$T/.err"
    rc=$?
    out=$(cat "$T/.out")
    err=$(cat "$T/.err")
}

# expect_rc N DESC: checks $rc.
expect_rc() {
    if [ "$rc" -ne "$1" ]; then
        fail "$2: exit $rc, expected $1; stderr: $err"
    else ok; fi
}

# expect_one_line_error PREFIX DESC: stderr is exactly one line starting with PREFIX.
expect_one_line_error() {
    local n
    n=$(printf '%s\n' "$err" | grep -c '')
    if [ -z "$err" ] || [ "$n" -ne 1 ]; then
        fail "$2: expected one line on stderr, got $n: $err"
    elif [[ "$err" != "$1"* ]]; then
        fail "$2: stderr does not start with '$1': $err"
    else ok; fi
}

expect_out_match() {
    if ! printf '%s\n' "$out" | grep -Eq -- "$1"; then
        fail "$2: stdout does not match /$1/: $out"
    else ok; fi
}

expect_out_no_match() {
    if printf '%s\n' "$out" | grep -Eq -- "$1"; then
        fail "$2: stdout matches /$1/: $out"
    else ok; fi
}

expect_err_match() {
    if ! printf '%s\n' "$err" | grep -Eq -- "$1"; then
        fail "$2: stderr does not match /$1/: $err"
    else ok; fi
}

expect_err_empty() {
    if [ -n "$err" ]; then fail "$1: stderr not empty: $err"; else ok; fi
}

# A JSON document on stdout; prints the value of a Python expression over it
# (`d` is the document).
json_get() {
    printf '%s' "$out" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"
}

# True when the store library is still the skeleton's stub.
store_is_stub() {
    "$KC" --dir "$T/.probe" stats >/dev/null 2>&1 || return 0
    mkdir -p "$T/.probe2" && chmod 700 "$T/.probe2"
    if "$KC" --dir "$T/.probe2" stats 2>&1 | grep -q 'does not provide'; then return 0; fi
    return 1
}

finish() {
    if [ "$failures" -gt 0 ]; then
        echo "$failures of $((checks + failures)) checks failed" >&2
        exit 1
    fi
    echo "all $checks checks passed"
    exit 0
}
