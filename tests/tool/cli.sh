#!/bin/bash
# kcache: --help, --version, and every kind of bad argument (exit 2, one line).
. "$(dirname "$0")/lib.sh"

run "$KC" --help
expect_rc 0 "--help"
for c in stats ls show verify gc clear config owner --dir --json --namespace --max-size --idle-ms; do
    expect_out_match "$c" "--help mentions $c"
done
expect_err_empty "--help"
run "$KC" -h
expect_rc 0 "-h"
run "$KC" help
expect_rc 0 "help"
expect_out_match '^Usage: kcache' "help prints usage"

run "$KC" --version
expect_rc 0 "--version"
expect_out_match '^kcache [0-9]+\.[0-9]+\.[0-9]+' "--version"

bad() {
    local desc=$1
    shift
    run "$KC" --dir "$T/cache" "$@"
    expect_rc 2 "$desc"
    expect_one_line_error "kcache: error: " "$desc"
}
run "$KC"
expect_rc 2 "no command"
expect_one_line_error "kcache: error: " "no command"
bad "unknown command" frobnicate
bad "unknown global option" --frob stats
bad "unknown stats option" stats --frob
bad "json on ls" ls --json
bad "ls namespace without value" ls --namespace
bad "ls extra argument" ls extra
bad "show without key" show
bad "show non-hex key" show zzzzzz
bad "show key too short" show abc
bad "show key too long" show 0123456789abcdef0123456789abcdef0
bad "show two keys" show abcd abcd
bad "gc bad size" gc --max-size banana
bad "gc size without value" gc --max-size
bad "gc negative size" gc --max-size -5
bad "owner bad idle" owner --idle-ms soon
bad "clear extra" clear now
run "$KC" stats --dir
expect_rc 2 "--dir without value"
expect_one_line_error "kcache: error: " "--dir without value"
run "$KC" --dir "" stats
expect_rc 2 "--dir empty"
expect_one_line_error "kcache: error: " "--dir empty"
[ ! -e "$T/cache" ] && ok || fail "a usage error created the cache directory"

finish
