#!/bin/bash
# KCACHE_STATS=1 prints one line per process that reached kcache, none for
# the processes of a job that only loaded it (issue 47, finding 9): a
# launcher's shells around one program that compiles with NVRTC (through
# ctypes) print one line in all, and a job of shells alone prints none.
# And KCACHE_LOG=debug times NVRTC's create only where it ran: a hit (the
# program kept by kcache, never created in NVRTC) reports none of NVRTC's.
# Usage: stats_line.sh LIBKCACHE NVRTC-CLIENT LIBNVRTC
. "$(dirname "$0")/lib.sh"
SHIM=$1 CLIENT=$2 NVRTC=$3

export KCACHE_DIR="$T/cache" KCACHE_READONLY=1 KCACHE_TOOL=/nonexistent KCACHE_STATS=1
LD_PRELOAD="$SHIM" run sh -c 'sh -c "true"; env true; bash -c "ls / >/dev/null"'
expect_rc 0 "shells under the shim"
n=$(printf '%s\n' "$err" | grep -c '^kcache: stats:')
[ "$n" -eq 0 ] && ok || fail "processes that never reached kcache printed $n stats lines: $err"

if [ -e "$NVRTC" ]; then
    LD_PRELOAD="$SHIM" run sh -c 'sh -c "true"; exec sh -c "python3 \"$0\" \"$1\" compute_80 k1 k2"' \
        "$CLIENT" "$NVRTC"
    expect_rc 0 "a program that compiles, started through shells"
    n=$(printf '%s\n' "$err" | grep -c '^kcache: stats:')
    [ "$n" -eq 1 ] && ok || fail "one stats line for the one process that compiled, got $n: $err"
    expect_err_match '^kcache: stats: nvrtc hits=0 misses=2 ' "the line is the compiling process's"

    # A store of its own (no owner: the records stay in the spool, which
    # lookups read), a miss, then a hit.
    for i in 1 2; do
        KCACHE_READONLY=0 KCACHE_DIR="$T/store" KCACHE_LOG=debug LD_PRELOAD="$SHIM" \
            run python3 "$CLIENT" "$NVRTC" compute_80 k1
        expect_rc 0 "run $i with KCACHE_LOG=debug"
        eval "err$i=\$err"
    done
    err=$err1
    expect_err_match "NVRTC creates the program kcache kept \\(k1.cu\\): [0-9.]+ ms" \
        "the miss times NVRTC's create where it runs"
    err=$err2
    expect_err_match '^kcache: stats: nvrtc hits=1 ' "the second run is served"
    if printf '%s\n' "$err2" | grep -q "ms of it NVRTC's\|NVRTC creates"; then
        fail "a hit reports a time of NVRTC's create, which never ran: $err2"
    else ok; fi
else
    echo "skip: no $NVRTC"
fi
finish
