#!/bin/bash
# scripts/package: one run at a time per cache directory (issue 47, finding
# 5). Two runs on one KCACHE_PACKAGE_CACHE, each stopping once it holds the
# lock (KCACHE_TEST_PACKAGE_STOP=locked; no root, toolkit or network
# needed): the second says it waits for the first (by its pid) and ends
# after it. A failing step (KCACHE_TEST_PACKAGE_STOP=fail) names its exit
# status and its whole log, which starts with the step and holds all its
# output.
# Usage: lock.sh SOURCE-ROOT
. "$(dirname "$0")/../tool/lib.sh"
SRC=$1
pkg="$SRC/scripts/package"
# Without the lock these runs would go on to package: they would stop at
# once on the missing toolkit, never build.
export KCACHE_PACKAGE_CACHE="$T/cache" KCACHE_TOOLKIT="$T/no-toolkit"

KCACHE_TEST_PACKAGE_STOP=locked KCACHE_TEST_PACKAGE_HOLD=2 sh "$pkg" --dist "$T/dist" \
    >"$T/a.out" 2>"$T/a.err" &
a=$!
for _ in $(seq 200); do
    [ -s "$T/cache/.lock.pid" ] && break
    sleep 0.025
done
KCACHE_TEST_PACKAGE_STOP=locked run sh "$pkg" --dist "$T/dist"
b_end=$(date +%s.%N)
wait "$a"
a_rc=$?
expect_rc 0 "the second run, once the first ended"
[ "$a_rc" = 0 ] && ok || fail "the first run: exit $a_rc: $(cat "$T/a.err")"
expect_err_match "waiting for another scripts/package run \\(pid $a\\) using $T/cache" \
    "the second run says it waits, for which run"
a_end=$(stat -c %.Y "$T/a.err" 2>/dev/null || echo 0)
# The second ended after the first (which held the lock for 2 s).
awk -v a="$a_end" -v b="$b_end" 'BEGIN { exit !(b >= a) }' && ok ||
    fail "the second run ended at $b_end, before the first ($a_end)"

# A failing step: its status, its log named, the log whole.
KCACHE_TEST_PACKAGE_STOP=fail run sh "$pkg" --dist "$T/dist"
expect_rc 1 "a failing step"
expect_err_match "error: a test step failed \\(exit status 3; the whole log, 4 lines: $T/cache/test-step.log\\)" \
    "the failure names the status and the log"
head -n 1 "$T/cache/test-step.log" | grep -Eq '^# scripts/package \(pid [0-9]+\), .*: a test step$' && ok ||
    fail "the log starts with its step: $(head -n 1 "$T/cache/test-step.log")"
grep -qx one "$T/cache/test-step.log" && grep -qx two "$T/cache/test-step.log" && ok ||
    fail "the log holds the step's output: $(cat "$T/cache/test-step.log")"
finish
