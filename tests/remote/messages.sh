#!/bin/bash
# What the tool says about the remote's credentials and trust (issue 22,
# items 8, 14, 16), against private redis-servers this script starts with
# `requirepass` (a unix socket, and a loopback port with cluster mode on)
# and stops at the end: passwords never shown, whatever they hold;
# KCACHE_REMOTE_PASSWORD_FILE (mode-checked); NOAUTH named as such; one
# trusted key counted once; keygen into a directory that does not exist.
shim=${KCACHE_SHIM:?}
bench=${1:?usage: messages.sh NVRTC_BENCH}
. "$(dirname "$0")/../tool/lib.sh"

pids=()
stop_servers() {
    for p in "${pids[@]}"; do
        kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    pids=()
}
trap 'stop_servers; rm -rf "$T"' EXIT

wait_up() { # SOCKET-or-PORT
    for _ in $(seq 400); do
        if [[ "$1" == /* ]]; then
            redis-cli -s "$1" -a zqpass --no-auth-warning PING 2>/dev/null | grep -q PONG && return
        else
            redis-cli -p "$1" -a zqpass --no-auth-warning PING 2>/dev/null | grep -q PONG && return
        fi
        sleep 0.025
    done
    echo "redis-server did not start" >&2
    exit 1
}

sock="$T/redis.sock"
redis-server --port 0 --bind 127.0.0.1 --unixsocket "$sock" --unixsocketperm 700 \
    --dir "$T" --save '' --appendonly no --logfile "$T/redis.log" --requirepass zqpass &
pids+=($!)
wait_up "$sock"
# A free port whose cluster bus port (+10000) is free too.
port=$(python3 -c '
import random, socket
for _ in range(1000):
    p = random.randrange(20000, 30000)
    try:
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", p)); b.bind(("127.0.0.1", p + 10000))
        print(p); break
    except OSError:
        pass')
mkdir -p "$T/c"
redis-server --port "$port" --bind 127.0.0.1 --dir "$T/c" --save '' --appendonly no \
    --logfile "$T/c/log" --requirepass zqpass --cluster-enabled yes \
    --cluster-config-file "$T/c/nodes.conf" &
pids+=($!)
wait_up "$port"

# keygen into a directory that does not exist: made (0700).
run "$KC" keygen "$T/keys/writer"
expect_rc 0 "keygen into a missing directory"
[ -f "$T/keys/writer" ] && [ "$(stat -c %a "$T/keys")" = 700 ] && ok ||
    fail "keygen did not make $T/keys (0700): $err"
key="$T/keys/writer"
cp "$key.pub" "$T/trusted"
export KCACHE_REMOTE_SIGNING_KEY="$key" KCACHE_REMOTE_TRUSTED_KEYS="$T/trusted"

# No password: NOAUTH, said as such.
KCACHE_REMOTE="redis+unix:$sock" run "$KC" remote ping
expect_rc 1 "ping without the password"
expect_out_match 'NOAUTH' "ping names NOAUTH"
expect_out_no_match 'something else than' "NOAUTH is not 'something else than PONG'"
expect_out_match '^signed entry: not tried' "no round trip after a server failed"
expect_out_no_match 'Network is down' "no 'Network is down'"
KCACHE_REMOTE="redis-cluster://127.0.0.1:$port" run "$KC" remote ping
expect_rc 1 "cluster ping without the password"
all="$out
$err"
printf '%s\n' "$all" | grep -q 'NOAUTH' && ok || fail "cluster without a password: no NOAUTH: $all"
printf '%s\n' "$all" | grep -q 'slot map' && fail "cluster NOAUTH called a bad slot map: $all" || ok

# The password in the URL: the endpoint shown as redis://:********@.
KCACHE_REMOTE="redis://:zqpass@127.0.0.1:$port" run "$KC" remote ping
expect_out_match "^redis://:\*\*\*\*\*\*\*\*@127\.0\.0\.1:$port" "endpoint shown with its ':'"
expect_out_no_match 'zqpass' "ping does not show the password"

# The password file: used, and refused when others may read it.
printf 'zqpass\n' >"$T/pw"
chmod 600 "$T/pw"
KCACHE_REMOTE="redis+unix:$sock" KCACHE_REMOTE_PASSWORD_FILE="$T/pw" run "$KC" remote ping
expect_rc 0 "ping with KCACHE_REMOTE_PASSWORD_FILE"
expect_out_match '^signed entry: written, read back and verified, deleted \(key id [0-9a-f]{16}, 1 trusted key\)' \
    "the round trip with the password file; a one-line trusted file is one key"
chmod 644 "$T/pw"
KCACHE_REMOTE="redis+unix:$sock" KCACHE_REMOTE_PASSWORD_FILE="$T/pw" run "$KC" remote ping
expect_rc 1 "a password file others may read"
expect_err_match 'PASSWORD_FILE .*refused.*0600' "a 0644 password file is refused"
chmod 600 "$T/pw"
KCACHE_REMOTE_PASSWORD_FILE="$T/pw" run "$KC" config
expect_out_match "^KCACHE_REMOTE_PASSWORD_FILE +environment +$T/pw\$" "config shows the password file"

# Passwords holding '|', a space or a tab: never shown, the way to write
# them said.
for v in 'redis://:zq1|zq2@127.0.0.1:1' 'redis://:zq1 zq2@127.0.0.1:1' \
    $'redis://u:zq1\tzq2@127.0.0.1:1|read-only' 'redis-cluster://:zq1|zq2@127.0.0.1:1,127.0.0.1:2'; do
    KCACHE_REMOTE="$v" run "$KC" config
    all="$out
$err"
    printf '%s\n' "$all" | grep -q 'zq' && fail "config shows a password ($v): $all" || ok
    printf '%s\n' "$all" | grep -q '%7C' && ok || fail "config does not say how to write it ($v): $all"
    KCACHE_REMOTE="$v" run "$KC" remote ping
    all="$out
$err"
    printf '%s\n' "$all" | grep -q 'zq' && fail "ping shows a password ($v): $all" || ok
    KCACHE_REMOTE="$v" run "$KC" push
    all="$out
$err"
    printf '%s\n' "$all" | grep -q 'zq' && fail "push shows a password ($v): $all" || ok
done

# The host's warning (a program preloaded with the shim) does not show it
# either.
printf 'extern "C" __global__ void k(float *x) { x[threadIdx.x] += 1.0f; }\n' >"$T/k.cu"
mkdir -p "$T/out"
KCACHE_READONLY=1 KCACHE_DIR="$T/kc" KCACHE_REMOTE='redis://:zq1|zq2@127.0.0.1:1' LD_PRELOAD="$shim" \
    run "$bench" --opt -arch=compute_80 --file "$T/k.cu" --save "$T/out" 1
expect_rc 0 "a host with a malformed KCACHE_REMOTE"
expect_err_match 'KCACHE_REMOTE: .*%7C' "the host warns how to write it"
printf '%s\n' "$err" | grep -q 'zq' && fail "the host warning shows a password: $err" || ok

# A password on each seed of a cluster: refused, not the first seed dropped.
KCACHE_REMOTE="redis-cluster://:zqa@127.0.0.1:1,:zqa@127.0.0.1:2" run "$KC" config
expect_out_match 'warning: .*before the first seed' "credentials on each seed are refused"
expect_out_no_match 'zqa' "the refusal shows no password"

# The remote off (no trusted key, no signing key): ping says so.
KCACHE_REMOTE_SIGNING_KEY= KCACHE_REMOTE_TRUSTED_KEYS= KCACHE_REMOTE="redis+unix:$sock" \
    KCACHE_REMOTE_PASSWORD_FILE="$T/pw" run "$KC" remote ping
expect_out_no_match 'Network is down' "ping with the remote off: no 'Network is down'"
expect_out_match 'remote is off' "ping with the remote off says so"

stop_servers
finish
