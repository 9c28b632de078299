#!/bin/sh
# kcache-run and the shim's glibc record (lib/libkcache.so.glibc):
#  - the build's record is the newest GLIBC_ version objdump lists for the
#    shim (scripts/glibc-needs), and not newer than the running glibc;
#  - a tree whose record asks for a glibc newer than this one's: kcache-run
#    prints exactly one line and runs the command without the shim (its
#    output and exit status untouched);
#  - the same tree with the build's record: the shim is preloaded.
# Usage: glibc_check.sh BUILD-DIR SRC-DIR
set -u
build=$1 src=$2
fails=0
ok() { echo "ok: $1"; }
fail() { echo "FAIL: $1"; fails=$((fails + 1)); }

shim=$build/shim/libkcache.so
rec=$(cat "$build/shim/libkcache.so.glibc") || { echo "FAIL: no $build/shim/libkcache.so.glibc"; exit 1; }
want=$(objdump -T "$shim" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' |
    sort -t. -k1,1n -k2,2n -k3,3n | tail -n 1)
[ "$rec" = "$want" ] && ok "the record ($rec) is objdump -T's newest GLIBC_ version" ||
    fail "the record says $rec, objdump -T says $want"
have=$(getconf GNU_LIBC_VERSION | sed 's/^glibc //')
newest=$(printf '%s\n%s\n' "$rec" "$have" | sort -t. -k1,1n -k2,2n -k3,3n | tail -n 1)
[ "$newest" = "$have" ] && ok "this glibc ($have) can load the shim ($rec)" ||
    fail "the shim needs glibc $rec, this is $have"

t=$(mktemp -d "${TMPDIR:-/tmp}/glibc-check.XXXXXX") || exit 1
trap 'rm -rf "$t"' EXIT
mkdir -p "$t/bin" "$t/lib"
cp "$build/scripts/kcache-run" "$t/bin/"
cp "$shim" "$t/lib/"
unset LD_PRELOAD KCACHE_DISABLE

echo 99.0 > "$t/lib/libkcache.so.glibc"
out=$("$t/bin/kcache-run" sh -c 'echo "preload=${LD_PRELOAD:-}"; exit 3' 2> "$t/err")
rc=$?
[ $rc = 3 ] && ok "too new: the command's own status (3)" || fail "too new: status $rc, not 3"
[ "$out" = "preload=" ] && ok "too new: the command ran without the shim" ||
    fail "too new: the command saw '$out'"
[ "$(wc -l < "$t/err")" = 1 ] && grep -q "needs glibc 99.0, this machine has $have" "$t/err" &&
    ok "too new: one line: $(cat "$t/err")" || fail "too new: stderr was: $(cat "$t/err")"

cp "$build/shim/libkcache.so.glibc" "$t/lib/"
out=$(KCACHE_DISABLE=1 "$t/bin/kcache-run" sh -c 'echo "preload=${LD_PRELOAD:-}"' 2> "$t/err")
case $out in
"preload=$(cd "$t/lib" && pwd -P)/libkcache.so") ok "loadable: the shim preloaded" ;;
*) fail "loadable: the command saw '$out' ($(cat "$t/err"))" ;;
esac
[ ! -s "$t/err" ] && ok "loadable: nothing on stderr" || fail "loadable: stderr: $(cat "$t/err")"

# Not a small regular file (a FIFO no one writes, a link to /dev/zero, a
# huge file): the record is treated as absent, the command runs with the
# shim, and nothing hangs (the launcher is given 20 s).
for kind in fifo zero big; do
    rm -f "$t/lib/libkcache.so.glibc"
    case $kind in
    fifo) mkfifo "$t/lib/libkcache.so.glibc" ;;
    zero) ln -s /dev/zero "$t/lib/libkcache.so.glibc" ;;
    big) head -c 10000000 /dev/zero | tr '\0' 9 > "$t/lib/libkcache.so.glibc" ;;
    esac
    out=$(KCACHE_DISABLE=1 timeout 20 "$t/bin/kcache-run" sh -c 'echo "preload=${LD_PRELOAD:-}"; exit 4' 2> "$t/err")
    rc=$?
    case $rc:$out in
    "4:preload=$(cd "$t/lib" && pwd -P)/libkcache.so") ok "record a $kind: the command ran with the shim, status 4" ;;
    *) fail "record a $kind: status $rc, the command saw '$out' ($(cat "$t/err"))" ;;
    esac
done

echo "$fails failed"
[ $fails = 0 ]
