#!/bin/bash
# kcache on a missing directory, an empty one, and unusable ones.
. "$(dirname "$0")/lib.sh"

# --- missing: everything works, reports empty, creates nothing -------------
M="$T/missing/cache"
run "$KC" --dir "$M" stats
expect_rc 0 "stats on missing dir"
expect_out_match '^Entries: +0' "stats on missing dir shows 0 entries"
expect_out_match 'does not exist' "stats on missing dir says so"
run "$KC" --dir "$M" stats --json
expect_rc 0 "stats --json on missing dir"
[ "$(json_get 'd["entries"]')" = 0 ] && ok || fail "stats --json entries on missing dir: $out"
[ "$(json_get 'd["exists"]')" = False ] && ok || fail "stats --json exists on missing dir: $out"
run "$KC" --dir "$M" ls
expect_rc 0 "ls on missing dir"
[ -z "$out" ] && ok || fail "ls on missing dir printed: $out"
run "$KC" --dir "$M" ls --namespace nvrtc-x
expect_rc 0 "ls --namespace on missing dir"
run "$KC" --dir "$M" show abcdef01
expect_rc 1 "show on missing dir"
expect_one_line_error "kcache: error: no entry" "show on missing dir"
run "$KC" --dir "$M" verify
expect_rc 0 "verify on missing dir"
expect_out_match 'checked 0 records' "verify on missing dir"
run "$KC" --dir "$M" gc
expect_rc 0 "gc on missing dir"
run "$KC" --dir "$M" gc --max-size 10M
expect_rc 0 "gc --max-size on missing dir"
run "$KC" --dir "$M" clear
expect_rc 0 "clear on missing dir"
run "$KC" --dir "$M" config
expect_rc 0 "config on missing dir"
expect_out_match "^KCACHE_DIR +command-line +$M\$" "config shows --dir"
[ ! -e "$M" ] && [ ! -e "$T/missing" ] && ok || fail "a command created the missing directory"

# KCACHE_DIR is honoured and --dir overrides it.
KCACHE_DIR="$M" run "$KC" stats
expect_out_match "^Cache directory: +$M" "stats uses KCACHE_DIR"
KCACHE_DIR="$T/other" run "$KC" --dir "$M" stats
expect_out_match "^Cache directory: +$M" "--dir overrides KCACHE_DIR"
# A relative --dir is made absolute.
(cd "$T" && run "$KC" --dir rel/cache stats && printf '%s\n' "$out") >"$T/rel.out"
grep -q "^Cache directory: *$T/rel/cache" "$T/rel.out" && ok || fail "relative --dir: $(cat "$T/rel.out")"

# --- a file where the directory should be ---------------------------------
F="$T/afile"
echo x >"$F"
for cmd in stats "stats --json" ls "show abcd" verify gc clear; do
    # shellcheck disable=SC2086
    run "$KC" --dir "$F" $cmd
    expect_rc 1 "$cmd on a file"
    expect_one_line_error "kcache: error: " "$cmd on a file"
    expect_err_match 'Not a directory' "$cmd on a file says why"
done
# ... and a path under a file.
run "$KC" --dir "$F/sub" ls
expect_rc 1 "ls under a file"
expect_one_line_error "kcache: error: " "ls under a file"
[ "$(cat "$F")" = x ] && ok || fail "the file was modified"

# --- empty: needs the real store ------------------------------------------
if store_is_stub; then
    echo "store is a stub: skipping the empty-directory checks" >&2
    finish
fi
E="$T/empty"
mkdir -m 700 "$E"
run "$KC" --dir "$E" stats
expect_rc 0 "stats on empty dir"
expect_out_match '^Entries: +0' "stats on empty dir"
run "$KC" --dir "$E" stats --json
expect_rc 0 "stats --json on empty dir"
[ "$(json_get 'd["entries"]')" = 0 ] && ok || fail "stats --json on empty dir: $out"
[ "$(json_get 'sorted(b["name"] for b in d["backends"])')" = "['jit', 'nvrtc']" ] && ok ||
    fail "stats --json lists nvrtc and jit: $out"
run "$KC" --dir "$E" ls
expect_rc 0 "ls on empty dir"
[ -z "$out" ] && ok || fail "ls on empty dir printed: $out"
run "$KC" --dir "$E" show abcd
expect_rc 1 "show on empty dir"
expect_one_line_error "kcache: error: no entry" "show on empty dir"
run "$KC" --dir "$E" verify
expect_rc 0 "verify on empty dir"
expect_out_match 'checked 0 records: 0 bad' "verify on empty dir"
run "$KC" --dir "$E" gc
expect_rc 0 "gc on empty dir"
run "$KC" --dir "$E" clear
expect_rc 0 "clear on empty dir"
run "$KC" --dir "$E" stats
expect_rc 0 "stats after clear on empty dir"

# --- a directory writable by others is refused ------------------------------
W="$T/open"
mkdir "$W" && chmod 777 "$W"
run "$KC" --dir "$W" ls
expect_rc 1 "ls on a world-writable dir"
expect_one_line_error "kcache: error: " "ls on a world-writable dir"

# --- a directory owned by another user is refused (needs root to set up) ----
if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1; then
    O="$T/theirs"
    mkdir -m 700 "$O" && chown nobody "$O"
    run "$KC" --dir "$O" stats
    expect_rc 1 "stats on another user's dir"
    expect_one_line_error "kcache: error: " "stats on another user's dir"
    expect_err_match 'owned by another user' "stats on another user's dir says why"
fi

finish
