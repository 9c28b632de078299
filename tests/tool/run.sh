#!/bin/bash
# kcache-run: LD_PRELOAD prepended and kept, flags as variables, --help, bad
# flags, and finding libkcache.so relative to itself in a source tree.
# Usage: run.sh SOURCE-kcache-run BUILD-kcache-run SHIM DUMMY-LIB
. "$(dirname "$0")/lib.sh"
SRC_RUN=$1
BUILD_RUN=$2
SHIM=$3
DUMMY=$4
unset LD_PRELOAD KCACHE_READONLY KCACHE_DISABLE KCACHE_RECACHE KCACHE_LOG KCACHE_STATS \
    KCACHE_NVRTC KCACHE_JIT KCACHE_MEMO KCACHE_ALLOC

# A source-tree layout: scripts/kcache-run and build/shim/libkcache.so.
mkdir -p "$T/src/scripts" "$T/src/build/shim"
cp "$SRC_RUN" "$T/src/scripts/kcache-run"
cp "$SHIM" "$T/src/build/shim/libkcache.so"
R="$T/src/scripts/kcache-run"
LIB=$(cd "$T/src/build/shim" && pwd -P)/libkcache.so

envval() { printf '%s\n' "$out" | sed -n "s/^$1=//p"; }

run "$R" --readonly -- env
expect_rc 0 "--readonly -- env"
[ "$(envval KCACHE_READONLY)" = 1 ] && ok || fail "--readonly sets KCACHE_READONLY=1: $(envval KCACHE_READONLY)"
[ "$(envval LD_PRELOAD)" = "$LIB" ] && ok || fail "LD_PRELOAD is the source tree's library: $(envval LD_PRELOAD)"
[ -z "$(envval KCACHE_DISABLE)" ] && ok || fail "--readonly sets nothing else"
expect_err_empty "--readonly -- env"

LD_PRELOAD="$DUMMY" run "$R" -- env
[ "$(envval LD_PRELOAD)" = "$LIB:$DUMMY" ] && ok || fail "an existing LD_PRELOAD is kept after ours: $(envval LD_PRELOAD)"
LD_PRELOAD="$LIB:$DUMMY" run "$R" -- env
[ "$(envval LD_PRELOAD)" = "$LIB:$DUMMY" ] && ok || fail "nested kcache-run does not add it twice: $(envval LD_PRELOAD)"

run "$R" --dir rel/c --disable --recache --log debug --stats --no-nvrtc --no-jit --no-link --no-nvvm --no-memo --no-alloc env
expect_rc 0 "all flags, no --"
for kv in KCACHE_DISABLE=1 KCACHE_RECACHE=1 KCACHE_LOG=debug KCACHE_STATS=1 KCACHE_NVRTC=0 \
    KCACHE_JIT=0 KCACHE_LINK=0 KCACHE_NVVM=0 KCACHE_MEMO=0 KCACHE_ALLOC=0; do
    [ "$(envval "${kv%%=*}")" = "${kv#*=}" ] && ok || fail "flag sets $kv: $(envval "${kv%%=*}")"
done
[ "$(envval KCACHE_DIR)" = "$PWD/rel/c" ] && ok || fail "--dir is made absolute: $(envval KCACHE_DIR)"
run "$R" --dir="$T/abs" --log=info env
[ "$(envval KCACHE_DIR)" = "$T/abs" ] && ok || fail "--dir=D form: $(envval KCACHE_DIR)"
[ "$(envval KCACHE_LOG)" = info ] && ok || fail "--log=L form: $(envval KCACHE_LOG)"

# Arguments after the command are the command's own.
run "$R" -- sh -c 'printf "%s|" "$@"' x --readonly "a b" --
[ "$out" = "--readonly|a b|--|" ] && ok || fail "arguments pass through untouched: $out"
# The command's exit status comes back.
run "$R" -- sh -c 'exit 7'
expect_rc 7 "exit status of the command"

run "$R" --help
expect_rc 0 "--help"
expect_out_match '^Usage: kcache-run ' "--help usage line"
for f in --dir --disable --readonly --recache --log --stats --no-nvrtc --no-jit --no-link --no-memo \
    --no-alloc; do
    expect_out_match -- "$f" "--help documents $f"
done

bad() {
    local desc=$1 code=$2
    shift 2
    run "$R" "$@"
    expect_rc "$code" "$desc"
    expect_one_line_error "kcache-run: error: " "$desc"
}
bad "unknown flag" 2 --frobnicate -- env
bad "no command" 2 --readonly
bad "no command after --" 2 --readonly --
bad "--log without level" 2 --log
bad "--log bad level" 2 --log loud env
bad "--dir without value" 2 --dir
bad "--dir empty" 2 --dir "" env
bad "command not found" 127 -- /nonexistent/command

# No library anywhere near it: one line, not a silent run without the cache.
mkdir -p "$T/lonely"
cp "$SRC_RUN" "$T/lonely/kcache-run"
run "$T/lonely/kcache-run" -- env
expect_rc 127 "no library"
expect_one_line_error "kcache-run: error: cannot find libkcache.so" "no library"

# Through a symlink (as in ~/bin/kcache-run -> checkout/scripts/kcache-run).
ln -s "$R" "$T/link-run"
run "$T/link-run" -- env
[ "$(envval LD_PRELOAD)" = "$LIB" ] && ok || fail "a symlinked launcher finds the library: $(envval LD_PRELOAD)"

# The configured copy in a build directory uses that build's library.
run "$BUILD_RUN" -- env
expect_rc 0 "build-tree kcache-run"
[ "$(envval LD_PRELOAD)" = "$(cd "$(dirname "$SHIM")" && pwd -P)/libkcache.so" ] && ok ||
    fail "build-tree kcache-run uses the build's shim: $(envval LD_PRELOAD)"

# The library really loads: no ld.so complaint.
run "$R" -- true
expect_rc 0 "preloaded true"
expect_err_empty "preloaded true"

finish
