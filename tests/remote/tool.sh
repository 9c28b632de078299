#!/bin/bash
# The tool's remote commands against a private redis-server on a unix
# socket in the test's directory (suite remote): `kcache keygen PATH`,
# `kcache remote ping` (writer, read-only reader, server down), and
# `kcache config` showing the remote variables with passwords redacted
# and a malformed KCACHE_REMOTE as a warning (the tool's, and the shim's
# in a process that compiles: one prefix, not two).
SHIM=${KCACHE_SHIM:-}
. "$(dirname "$0")/../tool/lib.sh"

server=
stop_server() {
    if [ -n "$server" ]; then
        kill -CONT "$server" 2>/dev/null
        kill -KILL "$server" 2>/dev/null
        wait "$server" 2>/dev/null
        server=
    fi
}
trap 'stop_server; rm -rf "$T"' EXIT

sock="$T/redis.sock"
redis-server --port 0 --bind 127.0.0.1 --unixsocket "$sock" --unixsocketperm 700 \
    --dir "$T" --save '' --appendonly no --logfile "$T/redis.log" &
server=$!
for _ in $(seq 400); do
    [ -S "$sock" ] && redis-cli -s "$sock" PING 2>/dev/null | grep -q PONG && break
    sleep 0.025
done

# keygen: PATH 0600 and PATH.pub, one line as ssh-keygen writes it.
run "$KC" keygen "$T/key"
expect_rc 0 "keygen"
expect_out_match 'key id [0-9a-f]{16}' "keygen prints the key id"
[ "$(stat -c %a "$T/key")" = 600 ] && ok || fail "secret key mode $(stat -c %a "$T/key")"
[ "$(wc -l <"$T/key.pub")" -eq 1 ] && ok || fail "PATH.pub is not one line"
grep -Eq '^kcache-ed25519 [A-Za-z0-9+/]{43}= [^ ]+@[^ ]+$' "$T/key.pub" && ok ||
    fail "PATH.pub: $(cat "$T/key.pub")"
run "$KC" keygen "$T/key"
expect_rc 1 "keygen over an existing key"
expect_one_line_error "kcache: error:" "keygen over an existing key"
run "$KC" keygen
expect_rc 2 "keygen without PATH"
cp "$T/key.pub" "$T/trusted"

export KCACHE_REMOTE="redis+unix:$sock"
# ping as a writer: latency, version, the signed round trip.
KCACHE_REMOTE_SIGNING_KEY="$T/key" KCACHE_REMOTE_TRUSTED_KEYS="$T/trusted" \
    run "$KC" remote ping
expect_rc 0 "remote ping"
expect_out_match "^redis\+unix:$sock: [0-9.]+ ms, redis [0-9]+\.[0-9]+\.[0-9]+, master\$" \
    "ping shows latency, version and role"
expect_out_match '^signed entry: written, read back and verified, deleted' "ping round trip"
[ "$(redis-cli -s "$sock" DBSIZE)" = 0 ] && ok || fail "ping left its probe behind"

# ping as a read-only node.
KCACHE_REMOTE_TRUSTED_KEYS="$T/trusted" run "$KC" remote ping
expect_rc 0 "remote ping, read-only"
expect_out_match '^signed entry: not written \(no signing key' "read-only ping"

# A key readable by others is refused: ping says the node is read-only.
chmod 644 "$T/key"
KCACHE_REMOTE_SIGNING_KEY="$T/key" KCACHE_REMOTE_TRUSTED_KEYS="$T/trusted" \
    run "$KC" remote ping
expect_err_match 'SIGNING_KEY .* refused' "a 0644 signing key is refused"
expect_out_match '^signed entry: not written' "a 0644 key signs nothing"
# config warns of it as ping does, and of an unreadable trusted file and
# password file (issue 47, finding 6): a job's user who cannot read them
# learns it from `kcache config`.
KCACHE_REMOTE_SIGNING_KEY="$T/key" KCACHE_REMOTE_TRUSTED_KEYS="$T/trusted" run "$KC" config
expect_out_match '^warning: remote: KCACHE_REMOTE_SIGNING_KEY .*key refused \(Operation not permitted' \
    "config warns of a refused signing key"
KCACHE_REMOTE_TRUSTED_KEYS="$T/no-such-trusted" run "$KC" config
expect_out_match '^warning: remote: KCACHE_REMOTE_TRUSTED_KEYS .*no-such-trusted unusable' \
    "config warns of an unusable trusted keys file"
printf 'pw\n' >"$T/pw" && chmod 644 "$T/pw"
KCACHE_REMOTE_PASSWORD_FILE="$T/pw" KCACHE_REMOTE_TRUSTED_KEYS="$T/trusted" run "$KC" config
expect_out_match '^warning: remote: KCACHE_REMOTE_PASSWORD_FILE .*pw refused' \
    "config warns of a refused password file"
rm -f "$T/pw"
chmod 600 "$T/key"

# config: the URL without its password; a malformed one is a warning.
KCACHE_REMOTE="redis://bob:hunter2@127.0.0.1:1/2|read-only" KCACHE_REMOTE_TTL=60 run "$KC" config
expect_rc 0 "config with a remote"
expect_out_match '^KCACHE_REMOTE +environment +redis://bob:\*\*\*\*\*\*\*\*@127\.0\.0\.1:1/2\|read-only$' \
    "config shows the URL redacted"
expect_out_match '^KCACHE_REMOTE_TTL +environment +60$' "config shows the TTL"
expect_out_no_match 'hunter2' "config never shows the password"
KCACHE_REMOTE="redis://bob:hunter2@host:notaport" run "$KC" config
expect_out_match '^warning: KCACHE_REMOTE: .*bad host or port.*remote is off' "malformed URL warns"
expect_out_no_match 'hunter2' "the warning does not show the password"
# The shim's warning, in a process that compiles (NVRTC through ctypes).
if [ -n "$SHIM" ] && [ -e /usr/local/cuda/lib64/libnvrtc.so ]; then
    # Read-only: nothing stored, no owner started (one would outlive the test).
    KCACHE_REMOTE="redis://bob:hunter2@host:notaport" LD_PRELOAD="$SHIM" KCACHE_DIR="$T/shimdir" \
        KCACHE_READONLY=1 KCACHE_TOOL=/nonexistent run python3 -c '
import ctypes
n = ctypes.CDLL("/usr/local/cuda/lib64/libnvrtc.so")
p = ctypes.c_void_p()
assert n.nvrtcCreateProgram(ctypes.byref(p), b"__global__ void k() {}", b"k.cu", 0, None, None) == 0
print(n.nvrtcCompileProgram(p, 0, None))'
    expect_out_match '^0$' "the shim's process compiles"
    expect_err_match "^kcache: warning: KCACHE_REMOTE: 'redis://bob:\*+@host:notaport': bad host or port; the remote is off\$" \
        "the shim warns of a malformed KCACHE_REMOTE"
    printf '%s\n' "$err" | grep -q 'KCACHE_REMOTE: KCACHE_REMOTE' && fail "the shim's warning repeats its prefix: $err" || ok
fi

# remote stats: entries and bytes per namespace and build, locks and
# foreign keys left out; remote prune by build, then by namespace.
b1=00000000000000000000000000000001000000000000000a
b2=00000000000000000000000000000002000000000000000b
redis-cli -s "$sock" SET "kcache:nvrtc:13.0-a:$b1" 12345678 >/dev/null
redis-cli -s "$sock" SET "kcache:nvrtc:13.0-a:$b2" 1234 >/dev/null
redis-cli -s "$sock" SET "kcache:jit:13.0-a:$b2" 123 >/dev/null
redis-cli -s "$sock" SET "kcache:lock:{kcache:jit:13.0-a:$b2}" x >/dev/null
redis-cli -s "$sock" SET "someone:else" x >/dev/null
KCACHE_REMOTE_TRUSTED_KEYS="$T/trusted" run "$KC" remote stats
expect_rc 0 "remote stats"
expect_out_match '^Remote entries: +3 ' "remote stats counts the entries, not locks"
expect_out_match '^  nvrtc:13.0-a +000000000000000a +1  8 B$' "one row per namespace and build"
expect_out_match '^  nvrtc:13.0-a +000000000000000b +1  4 B$' "the other build"
KCACHE_REMOTE_TRUSTED_KEYS="$T/trusted" run "$KC" remote stats --json
expect_rc 0 "remote stats --json"
[ "$(json_get "d['entries']")" = 3 ] && ok || fail "remote stats --json: $out"
KCACHE_REMOTE_TRUSTED_KEYS="$T/trusted" run "$KC" remote prune
expect_rc 2 "remote prune without --build or --namespace"
KCACHE_REMOTE_TRUSTED_KEYS="$T/trusted" run "$KC" remote prune --build b
expect_rc 1 "remote prune by a node that does not write"
KCACHE_REMOTE_SIGNING_KEY="$T/key" KCACHE_REMOTE_TRUSTED_KEYS="$T/trusted" \
    run "$KC" remote prune --build b
expect_rc 0 "remote prune --build"
expect_out_match '^pruned 2 entries' "prune --build drops that build's entries"
[ "$(redis-cli -s "$sock" EXISTS "kcache:nvrtc:13.0-a:$b1")" = 1 ] && ok || fail "pruned another build"
KCACHE_REMOTE_SIGNING_KEY="$T/key" KCACHE_REMOTE_TRUSTED_KEYS="$T/trusted" \
    run "$KC" remote prune --namespace nvrtc:13.0-a
expect_out_match '^pruned 1 entries' "prune --namespace"
[ "$(redis-cli -s "$sock" EXISTS someone:else)" = 1 ] && ok || fail "pruned a foreign key"

# The manifests, kept under build 0 by every build (issue 47, finding 7):
# labelled in remote stats, this tool's build marked, and prune --build 0
# refused (the next run would compile everything) unless --manifests.
m0=000000000000000000000000000000030000000000000000
redis-cli -s "$sock" SET "kcache:nvrtc:13.0-a:$m0" 12 >/dev/null
KCACHE_REMOTE_TRUSTED_KEYS="$T/trusted" run "$KC" remote stats
expect_out_match '^  nvrtc:13.0-a +manifests +1  2 B  \(every build' "remote stats labels the manifests"
expect_out_match '^This kcache.s build: +[0-9a-f]{16}$' "remote stats names this build"
KCACHE_REMOTE_TRUSTED_KEYS="$T/trusted" run "$KC" remote stats --json
[ "$(json_get "d['namespaces'][0]['manifests']")" = True ] && ok || fail "remote stats --json: manifests: $out"
KCACHE_REMOTE_SIGNING_KEY="$T/key" KCACHE_REMOTE_TRUSTED_KEYS="$T/trusted" \
    run "$KC" remote prune --build 0000000000000000
expect_rc 2 "prune --build 0 is refused"
expect_one_line_error "kcache: error:" "prune --build 0"
expect_err_match 'manifests.*--manifests' "prune --build 0 says what it would remove and how"
[ "$(redis-cli -s "$sock" EXISTS "kcache:nvrtc:13.0-a:$m0")" = 1 ] && ok || fail "prune --build 0 removed the manifests"
KCACHE_REMOTE_SIGNING_KEY="$T/key" KCACHE_REMOTE_TRUSTED_KEYS="$T/trusted" \
    run "$KC" remote prune --manifests
expect_rc 0 "prune --manifests"
expect_out_match '^pruned 1 entries' "prune --manifests removes them"
redis-cli -s "$sock" FLUSHALL >/dev/null

# stats --openmetrics: gauges and counters a textfile collector reads.
run "$KC" --dir "$T/om" stats --openmetrics
expect_rc 0 "stats --openmetrics"
expect_out_match '^# TYPE kcache_hits_total counter$' "openmetrics counter families"
expect_out_match '^kcache_hits_total\{dir="[^"]*/om",backend="nvrtc"\} 0$' "per-backend samples"
expect_out_match '^kcache_remote_timeouts_total\{dir="[^"]*"\} 0$' "remote counters"
expect_out_match '^kcache_entries\{dir="[^"]*"\} 0$' "store gauges"
expect_out_match '^# EOF$' "ends with # EOF"

# ping without a remote, and with the server down.
KCACHE_REMOTE= run "$KC" remote ping
expect_rc 1 "ping without KCACHE_REMOTE"
expect_one_line_error "kcache: error:" "ping without KCACHE_REMOTE"
run "$KC" remote frobnicate
expect_rc 2 "unknown remote subcommand"
stop_server
KCACHE_REMOTE_TRUSTED_KEYS="$T/trusted" run "$KC" remote ping
expect_rc 1 "ping with the server down"
expect_out_match "^redis\+unix:$sock: (cannot connect|Connection refused|No such)" "ping names the failure"

finish
