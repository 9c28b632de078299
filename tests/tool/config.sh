#!/bin/bash
# kcache config: every variable, its value and where it came from; warnings
# for malformed values and unknown variables.
. "$(dirname "$0")/lib.sh"

run "$KC" config
expect_rc 0 "config"
expect_err_empty "config with a clean environment"
for v in KCACHE_DIR KCACHE_DISABLE KCACHE_READONLY KCACHE_RECACHE KCACHE_MAXSIZE KCACHE_LOG \
    KCACHE_STATS KCACHE_NVRTC KCACHE_JIT KCACHE_MEMO KCACHE_ALLOC; do
    expect_out_match "^$v +default " "config lists $v as default"
done
expect_out_match "^KCACHE_DIR +default +$XDG_CACHE_HOME/kcache\$" "default dir follows XDG_CACHE_HOME"
expect_out_no_match '^warning' "no warnings in a clean environment"

KCACHE_READONLY=1 KCACHE_MAXSIZE=2G KCACHE_LOG=debug KCACHE_DIR="$T/c" run "$KC" config
expect_rc 0 "config with env"
expect_out_match '^KCACHE_READONLY +environment +1$' "READONLY from environment"
expect_out_match '^KCACHE_MAXSIZE +environment +2147483648$' "MAXSIZE from environment"
expect_out_match '^KCACHE_LOG +environment +debug$' "LOG from environment"
expect_out_match "^KCACHE_DIR +environment +$T/c\$" "DIR from environment"
expect_out_match '^KCACHE_RECACHE +default +0$' "RECACHE still default"

# The columns line up for every name, the longest (KCACHE_REMOTE_*) too,
# and for the internal variables listed when set.
KCACHE_REMOTE_PASSWORD_FILE="$T/pw" KCACHE_REMOTE_TRUSTED_KEYS="$T/t" KCACHE_TOOL=/bin/true run "$KC" config
cols=$(printf '%s\n' "$out" | awk '/^(VARIABLE|KCACHE_)/ { match($0, /^[A-Z_]+ +/); print RLENGTH }' | sort -u)
[ "$(printf '%s\n' "$cols" | wc -l)" -eq 1 ] && ok || fail "config's FROM column starts at one place: $cols"
cols=$(printf '%s\n' "$out" | awk '/^(VARIABLE|KCACHE_)/ { match($0, /^[A-Z_]+ +[A-Za-z-]+ +/); print RLENGTH }' | sort -u)
[ "$(printf '%s\n' "$cols" | wc -l)" -eq 1 ] && ok || fail "config's VALUE column starts at one place: $cols"

KCACHE_DIR="$T/c" run "$KC" --dir "$T/d" config
expect_out_match "^KCACHE_DIR +command-line +$T/d\$" "--dir beats KCACHE_DIR"

KCACHE_MAXSIZE=banana KCACHE_FOO=1 run "$KC" config
expect_rc 0 "config with bad values"
expect_out_match '^KCACHE_MAXSIZE +default +5368709120' "malformed MAXSIZE keeps the default"
expect_out_match "^warning: .*KCACHE_MAXSIZE=banana" "warning for KCACHE_MAXSIZE=banana"
expect_out_match "^warning: .*KCACHE_FOO" "warning for unknown KCACHE_FOO"

KCACHE_READONLY=maybe run "$KC" config
expect_out_match "^warning: .*KCACHE_READONLY=maybe" "warning for a malformed boolean"

# Other commands print the warnings on stderr, once each.
KCACHE_MAXSIZE=banana run "$KC" --dir "$T/missing" stats
expect_rc 0 "stats with a malformed variable"
n=$(printf '%s\n' "$err" | grep -c 'KCACHE_MAXSIZE=banana')
[ "$n" -eq 1 ] && ok || fail "stats should warn once about KCACHE_MAXSIZE, got $n: $err"

# Sizes in one format, bytes (issue 47, finding 11): KCACHE_MAXSIZE,
# KCACHE_ALLOC_POOL and KCACHE_REMOTE_MAX_ENTRY alike.
KCACHE_REMOTE_MAX_ENTRY=16M run "$KC" config
expect_out_match '^KCACHE_MAXSIZE +default +5368709120$' "MAXSIZE in bytes"
expect_out_match '^KCACHE_ALLOC_POOL +default +268435456$' "ALLOC_POOL in bytes"
expect_out_match '^KCACHE_REMOTE_MAX_ENTRY +environment +16777216$' "REMOTE_MAX_ENTRY in bytes"
run "$KC" config
expect_out_match '^KCACHE_REMOTE_MAX_ENTRY +default +67108864$' "REMOTE_MAX_ENTRY's default in bytes"

# This kcache's build id, which every key its shim derives carries (issue
# 47, finding 7): in config and --version, the same.
run "$KC" config
expect_out_match '^kcache build: [0-9a-f]{16} \(.*libkcache\.so' "config names this build and its shim"
b=$(printf '%s\n' "$out" | sed -n 's/^kcache build: \([0-9a-f]*\) .*/\1/p')
run "$KC" --version
expect_out_match "^kcache [0-9.]+ \\(store ABI [0-9]+, record format [0-9]+, build $b\\)\$" \
    "--version names the same build ($b)"

finish
