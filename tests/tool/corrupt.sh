# corrupt_one DIR: flips one byte in the body of a pending record, through
# the store's own files (store/local/local.h: DIR/spool/p-* are put files, a
# header then the record). Returns 1 when there is no such file. Sourced.
corrupt_one() {
    local f size off byte
    f=$(find "$1/spool" -maxdepth 1 -type f -name 'p-*' 2>/dev/null | head -1)
    [ -n "$f" ] || return 1
    size=$(stat -c %s "$f")
    [ "$size" -gt 64 ] || return 1
    off=$((size - 20))
    byte=$(od -An -tu1 -j "$off" -N1 "$f" | tr -d ' ')
    printf "$(printf '\\%03o' $(((byte + 1) % 256)))" |
        dd of="$f" bs=1 seek="$off" count=1 conv=notrunc status=none
}
