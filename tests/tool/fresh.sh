#!/bin/bash
# kcache stats / ls / export read the database whole or say they cannot:
# a database whose reader cannot be opened is an error (exit 1, one line),
# never "0 entries"; while an owner drains batch after batch (sessions
# ending, tables flushed and compacted), stats and ls never show fewer
# entries than they showed before.
# Usage: fresh.sh PATH-OF-kc-populate
. "$(dirname "$0")/lib.sh"
POP=$1

D="$T/cache"
KCACHE_TOOL=/nonexistent/kcache "$POP" "$D" 30 --drain >/dev/null 2>&1 ||
    { echo "kc-populate failed" >&2; exit 1; }
run "$KC" --dir "$D" stats
expect_out_match '^Entries: +30( |$)' "stats of the filled store"

# A database no reader can open (CURRENT names a MANIFEST that is not there).
cp -a "$D" "$T/broken"
echo "MANIFEST-999999" >"$T/broken/db/CURRENT"
for cmd in stats ls; do
    run "$KC" --dir "$T/broken" $cmd
    expect_rc 1 "$cmd of an unreadable database"
    expect_one_line_error "kcache: error: " "$cmd of an unreadable database"
done
run "$KC" --dir "$T/broken" export -o "$T/broken.kcb"
expect_rc 1 "export of an unreadable database"
expect_one_line_error "kcache: error: export failed" "export of an unreadable database"
[ ! -e "$T/broken.kcb" ] && ok || fail "export of an unreadable database wrote a bundle"

# A live owner (started by the puts, idle after 200 ms: each batch ends a
# session with a flush and, from the second table on, a compaction).
export KCACHE_TOOL="$KC" KCACHE_OWNER_IDLE_MS=200
L="$T/live"
(
    for i in $(seq 1 25); do
        "$POP" "$L" 20 --first $((i * 20)) >/dev/null 2>&1
        sleep 0.1
    done
    touch "$T/done"
) &
maxs=0
maxl=0
while [ ! -e "$T/done" ]; do
    run "$KC" --dir "$L" stats
    n=$(printf '%s\n' "$out" | sed -n 's/^Entries: *\([0-9]*\).*/\1/p')
    n=${n:-0}
    [ "$rc" -eq 0 ] && ok || fail "stats during the drains: exit $rc: $err"
    [ "$n" -ge "$maxs" ] && ok || fail "stats showed $n entries after $maxs"
    [ "$n" -gt "$maxs" ] && maxs=$n
    run "$KC" --dir "$L" ls
    # Stored entries: lines, not pending ones (an empty listing is none:
    # printf gives it one empty line, which grep -vc would count).
    l=$(printf '%s\n' "$out" | grep -v ' pending$' | grep -c .)
    [ "$l" -ge "$maxl" ] && ok || fail "ls showed $l stored entries after $maxl (exit $rc, stderr: $err; out: $(printf '%s\n' "$out" | head -3))"
    [ "$l" -gt "$maxl" ] && maxl=$l
done
wait
# Every owner gone: the whole store.
for _ in $(seq 100); do
    run "$KC" --dir "$L" stats
    printf '%s\n' "$out" | grep -Eq '^Entries: *500( |$)' && break
    sleep 0.1
done
expect_out_match '^Entries: +500( |$)' "stats after the drains"
for _ in $(seq 200); do
    flock -n "$L/owner.lock" true 2>/dev/null && break
    sleep 0.05
done
finish
