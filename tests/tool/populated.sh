#!/bin/bash
# kcache on a populated store: ls, show, stats, verify (with a corrupted
# record), gc and clear.
# Usage: populated.sh PATH-OF-kc-populate
. "$(dirname "$0")/lib.sh"
POP=$1

if store_is_stub; then
    echo "store is a stub: skipping" >&2
    exit 77
fi

# No process may start an owner in the background: one that lingered would
# drain the spool under the corruption check below. kc-populate --drain and
# the tool's verify/gc/clear become the owner themselves.
export KCACHE_TOOL=/nonexistent/kcache
D="$T/cache"
"$POP" "$D" 6 --no-owner >"$T/keys" || { echo "kc-populate failed" >&2; exit 1; }
[ "$(wc -l <"$T/keys")" -eq 6 ] && ok || fail "kc-populate printed $(wc -l <"$T/keys") keys"

# --- owner: drains the spool and exits when idle -----------------------------
run "$KC" --dir "$D" ls
[ "$(printf '%s\n' "$out" | grep -c ' pending$')" -eq 6 ] && ok || fail "6 entries pending before the owner: $out"
run "$KC" owner --dir "$D" --idle-ms 0
expect_rc 0 "owner --idle-ms 0"
expect_err_empty "owner"
run "$KC" --dir "$D" ls
[ "$(printf '%s\n' "$out" | grep -c ' pending$')" -eq 0 ] && ok || fail "nothing pending after the owner: $out"
run "$KC" owner --dir "$T/afile-owner/x" --idle-ms 0
expect_rc 0 "owner creates a missing directory"
echo x >"$T/afile"
run "$KC" owner --dir "$T/afile" --idle-ms 0
expect_rc 1 "owner on a file"
expect_one_line_error "kcache: error: " "owner on a file"

# --- ls ---------------------------------------------------------------------
run "$KC" --dir "$D" ls
expect_rc 0 "ls"
[ "$(printf '%s\n' "$out" | grep -c .)" -eq 6 ] && ok || fail "ls lists 6 entries: $out"
while read -r k; do
    expect_out_match "^$k (nvrtc|jit)-test " "ls lists $k"
done <"$T/keys"
run "$KC" --dir "$D" ls --namespace jit-test
expect_rc 0 "ls --namespace"
[ "$(printf '%s\n' "$out" | grep -c .)" -eq 3 ] && ok || fail "ls --namespace jit-test lists 3: $out"
expect_out_no_match 'nvrtc-test' "ls --namespace filters"
run "$KC" --dir "$D" ls --namespace nothing-here
expect_rc 0 "ls on an unknown namespace"
[ -z "$out" ] && ok || fail "ls on an unknown namespace printed: $out"

# --- show ---------------------------------------------------------------
k2=$(sed -n 3p "$T/keys")
run "$KC" --dir "$D" show "$k2"
expect_rc 0 "show"
expect_out_match "^Key: +$k2\$" "show prints the key"
expect_out_match '^Namespace: +nvrtc-test$' "show prints the namespace"
expect_out_match '^Kind: +nvrtc$' "show prints the kind"
expect_out_match "^Size: +$((1000 + 37 * 2)) bytes" "show prints the size"
run "$KC" --dir "$D" show "$(printf '%s' "$k2" | tr a-f A-F)"
expect_rc 0 "show accepts upper-case hex"
run "$KC" --dir "$D" show "${k2:0:31}"
expect_rc 0 "show accepts a unique prefix"
run "$KC" --dir "$D" show feed
expect_rc 1 "show with an ambiguous prefix"
expect_one_line_error "kcache: error: " "show with an ambiguous prefix"
expect_err_match ambiguous "show with an ambiguous prefix says so"
run "$KC" --dir "$D" show 00000000000000000000000000000000
expect_rc 1 "show with an unknown key"
expect_one_line_error "kcache: error: no entry" "show with an unknown key"

# --- stats --------------------------------------------------------------
run "$KC" --dir "$D" stats
expect_rc 0 "stats"
expect_out_match '^Entries: +6' "stats counts 6 entries"
expect_out_match '^Entries: +6 \(artifacts and manifests' "stats says entries count manifests too"
expect_out_match '^  nvrtc-test +3 entries' "stats per namespace"
expect_out_match '^  nvrtc +hits 3 +misses 2 +passthrough 1 +stores 2' "stats nvrtc counters"
expect_out_match '^  jit +hits 5 +misses 1 +passthrough 0 +stores 1 +errors 1' "stats jit counters"
run "$KC" --dir "$D" stats --json
expect_rc 0 "stats --json"
[ "$(json_get 'd["entries"]')" = 6 ] && ok || fail "json entries: $out"
[ "$(json_get '{n["name"]: n["entries"] for n in d["namespaces"]}["jit-test"]')" = 3 ] && ok ||
    fail "json namespaces: $out"
[ "$(json_get '{b["name"]: b["hits"] for b in d["backends"]}["jit"]')" = 5 ] && ok ||
    fail "json backend hits: $out"
[ "$(json_get 'd["saved_seconds"]')" = 1.75 ] && ok || fail "json saved seconds: $out"
raw=$((1000 * 2 + 37 * (2 + 3 + 4 + 5) + 1000 * 4))
[ "$(json_get 'd["raw_bytes"]')" = "$raw" ] && ok || fail "json raw_bytes should be $raw: $out"
[ "$(json_get 'd["unique_bytes"] < d["raw_bytes"]')" = True ] && ok ||
    fail "identical bodies count once in unique_bytes: $out"
[ "$(json_get 'd["disk_bytes"] > 0')" = True ] && ok || fail "json disk_bytes: $out"
[ "$(json_get '0 <= d["reserved_bytes"] <= d["disk_bytes"]')" = True ] && ok ||
    fail "json reserved_bytes: $out"

# --- verify: a clean store, then a corrupted record -------------------------
run "$KC" --dir "$D" verify
expect_rc 0 "verify"
expect_out_match '^checked 6 records: 0 bad' "verify on a clean store"
. "$(dirname "$0")/corrupt.sh"
# A 7th record that stays in the spool (no owner may start), then corrupted.
"$POP" "$D" 1 --first 6 --no-owner >"$T/key7" || fail "kc-populate of a pending record"
k7=$(cat "$T/key7")
run "$KC" --dir "$D" ls
expect_out_match "^$k7 .* pending\$" "ls marks the spooled record pending"
if corrupt_one "$D"; then
    run "$KC" --dir "$D" verify
    expect_rc 0 "verify with a corrupted record"
    expect_out_match '^checked [0-9]+ records: ([1-9][0-9]* bad, [1-9][0-9]* purged|.* [1-9][0-9]* bad spool)' \
        "verify finds and purges the corrupted record"
    run "$KC" --dir "$D" verify
    expect_out_match ': 0 bad, 0 purged, 0 bad spool' "verify again finds nothing"
    run "$KC" --dir "$D" ls
    [ "$(printf '%s\n' "$out" | grep -c .)" -eq 6 ] && ok || fail "ls after purge lists 6: $out"
    expect_out_no_match "^$k7 " "the corrupted record is gone"
else
    fail "could not corrupt a record (no spool put file under $D/spool)"
fi

# --- progress: on a terminal only -------------------------------------------
if command -v script >/dev/null 2>&1; then
    P="$T/progress"
    "$POP" "$P" 8 --drain --no-owner >/dev/null 2>&1 || fail "kc-populate of 8 records"
    script -qec "'$KC' --dir '$P' gc --max-size 1 >/dev/null" "$T/typescript" >/dev/null 2>&1
    grep -q $'\rgc: ' "$T/typescript" && ok || fail "gc shows progress on a terminal: $(cat -v "$T/typescript")"
    "$POP" "$P" 8 --drain --no-owner >/dev/null 2>&1 || fail "kc-populate of 8 records"
    run "$KC" --dir "$P" gc --max-size 1
    expect_rc 0 "gc of 8 records"
    expect_out_match '^evicted [1-9]' "gc of 8 records evicts"
    expect_err_empty "gc shows no progress when stderr is not a terminal"
else
    echo "no script(1): skipping the progress check" >&2
fi

# --- gc -------------------------------------------------------------------
run "$KC" --dir "$D" gc --max-size 1G
expect_rc 0 "gc with room to spare"
expect_out_match '^evicted 0 entries' "gc evicts nothing under the limit"
run "$KC" --dir "$D" gc --max-size 1
expect_rc 0 "gc to 1 byte"
expect_out_match '^evicted [1-9]' "gc evicts"
run "$KC" --dir "$D" ls
n=$(printf '%s\n' "$out" | grep -c .)
[ "$n" -lt 6 ] && ok || fail "gc --max-size 1 left $n entries"

# --- clear ------------------------------------------------------------------
"$POP" "$D" 4 --no-owner >/dev/null || fail "repopulate"
# Single-flight lock files: clear removes the free ones, never a held one.
mkdir -p "$D/locks" && : >"$D/locks/free" && : >"$D/locks/held"
flock "$D/locks/held" sleep 5 &
holder=$!
sleep 0.3
run "$KC" --dir "$D" clear
expect_rc 0 "clear"
[ ! -e "$D/locks/free" ] && ok || fail "clear left a free lock file"
[ -e "$D/locks/held" ] && ok || fail "clear removed a held lock file"
kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null
run "$KC" --dir "$D" ls
expect_rc 0 "ls after clear"
[ -z "$out" ] && ok || fail "ls after clear printed: $out"
run "$KC" --dir "$D" stats --json
[ "$(json_get 'd["entries"]')" = 0 ] && ok || fail "stats after clear: $out"

finish
