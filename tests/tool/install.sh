#!/bin/bash
# meson install into a DESTDIR: the installed kcache-run finds the installed
# libkcache.so, and the installed kcache finds the installed store library.
# Usage: install.sh BUILD-DIR
. "$(dirname "$0")/lib.sh"
BUILD=$1
command -v meson >/dev/null || { echo "no meson" >&2; exit 77; }
unset LD_PRELOAD LD_LIBRARY_PATH

dest="$T/dest"
if ! meson install -C "$BUILD" --no-rebuild --quiet --destdir "$dest" >"$T/install.log" 2>&1; then
    cat "$T/install.log" >&2
    echo "meson install failed" >&2
    exit 1
fi
prefix=$(meson introspect "$BUILD" --buildoptions |
    python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"))')
bindir="$dest$prefix/bin"
R="$bindir/kcache-run"
[ -x "$R" ] && ok || fail "kcache-run installed executable at $R"
[ -x "$bindir/kcache" ] && ok || fail "kcache installed at $bindir/kcache"
lib=$(find "$dest" -name libkcache.so -type f | head -1)
[ -n "$lib" ] && ok || fail "libkcache.so installed under $dest"
store=$(find "$dest" -name 'libkcache-store.so*' | head -1)
[ -n "$store" ] && ok || fail "libkcache-store.so installed under $dest"
lib=$(cd "$(dirname "$lib")" && pwd -P)/libkcache.so

run "$R" --readonly -- env
expect_rc 0 "installed kcache-run"
got=$(printf '%s\n' "$out" | sed -n 's/^LD_PRELOAD=//p')
[ "$got" = "$lib" ] && ok || fail "installed kcache-run preloads the installed library: '$got', expected '$lib'"
run "$R" -- true
expect_rc 0 "installed kcache-run runs a command"
expect_err_empty "installed library preloads cleanly"
run "$R" --version
expect_out_match '^kcache-run [0-9]' "installed kcache-run --version"

# The man pages, when the build made them (scdoc found: -Dman=auto).
if [ -f "$BUILD/docs/man/kcache.1" ]; then
    for page in kcache.1 kcache-run.1; do
        m=$(find "$dest" -path "*/man1/$page" -type f | head -1)
        [ -n "$m" ] && cmp -s "$m" "$BUILD/docs/man/$page" && ok ||
            fail "meson install installs $page under man1 (found '$m')"
    done
fi

# A moved prefix: the relative path still finds it.
mv "$dest" "$T/moved"
R2="$T/moved$prefix/bin/kcache-run"
run "$R2" -- env
got=$(printf '%s\n' "$out" | sed -n 's/^LD_PRELOAD=//p')
[ "$got" = "${lib/$dest/$T/moved}" ] && ok || fail "a moved install finds its library: '$got'"

# The installed tool runs from the installed tree (rpath relative to itself).
run "$T/moved$prefix/bin/kcache" --version
expect_rc 0 "installed kcache --version"
expect_out_match '^kcache [0-9]' "installed kcache --version"
if ldd "$T/moved$prefix/bin/kcache" | grep -q "libkcache-store.so => $T/moved"; then ok; else
    fail "installed kcache resolves the installed store: $(ldd "$T/moved$prefix/bin/kcache" | grep kcache)"
fi
run "$T/moved$prefix/bin/kcache" --dir "$T/cache" stats
expect_rc 0 "installed kcache stats"

finish
