#!/bin/bash
# The remote tier links into a shared object with nothing but libc (the
# preloaded shim's rule): libhiredis and libsodium are dlopen()ed, never
# NEEDED. $1: a shared object made of store/remote and common/ alone,
# linked with --no-undefined.
set -u
so=${1:?usage: needed.sh SHARED_OBJECT}
needed=$(readelf -d "$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
bad=$(printf '%s\n' "$needed" | grep -Ev '^(libc\.so\.6|ld-linux-x86-64\.so\.2|libdl\.so\.2|libpthread\.so\.0)$' | grep -v '^$')
if [ -n "$bad" ]; then
    echo "FAIL: $so needs more than libc: $bad" >&2
    exit 1
fi
if readelf -d "$so" | grep -Eq 'hiredis|sodium'; then
    echo "FAIL: $so names hiredis or libsodium" >&2
    exit 1
fi
echo "NEEDED: $(echo $needed)"
