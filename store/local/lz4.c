/*
 * lz4.c: the LZ4 block decoder (lz4_Block_format.md) the shim serves packed
 * hot files through, libc only; the owner packs them with liblz4. It takes
 * any bytes (fuzzed: tests/fuzz/fuzz_store_lz4.c) and answers -EBADMSG
 * rather than reading or writing out of bounds.
 */
#include "local.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

/* An LZ4 length continuation: bytes added while they are 255. */
static int lz4_more(const unsigned char **ip, const unsigned char *end, size_t *len)
{
    unsigned b;
    do {
        if (*ip >= end || *len > SIZE_MAX - 255)
            return -EBADMSG;
        b = *(*ip)++;
        *len += b;
    } while (b == 255);
    return 0;
}

int kc__lz4_unpack(const void *src, size_t n, void *dst, size_t cap)
{
    const unsigned char *ip = src, *const iend = ip + n;
    unsigned char *op = dst, *const o0 = dst, *const oend = op + cap;
    for (;;) {
        if (ip >= iend)
            return -EBADMSG;
        unsigned tok = *ip++;
        size_t lit = tok >> 4;
        if (lit < 15 && (size_t)(iend - ip) >= 16 + 2 && (size_t)(oend - op) >= 16) {
            /* Short literals with room on both sides: 16 bytes copied at
             * once (what lies past them is written over later). */
            memcpy(op, ip, 16);
            op += lit;
            ip += lit;
        } else {
            if (lit == 15 && lz4_more(&ip, iend, &lit) != 0)
                return -EBADMSG;
            if (lit > (size_t)(iend - ip) || lit > (size_t)(oend - op))
                return -EBADMSG;
            if (lit > 0)
                memcpy(op, ip, lit);
            op += lit;
            ip += lit;
            if (ip == iend) /* the last sequence has literals only */
                break;
        }
        if (iend - ip < 2)
            return -EBADMSG;
        size_t off = (size_t)ip[0] | (size_t)ip[1] << 8;
        ip += 2;
        if (off == 0 || off > (size_t)(op - o0))
            return -EBADMSG;
        size_t m = tok & 15;
        if (m == 15 && lz4_more(&ip, iend, &m) != 0)
            return -EBADMSG;
        if ((size_t)(oend - op) < 4 || m > (size_t)(oend - op) - 4)
            return -EBADMSG;
        m += 4;
        const unsigned char *from = op - off;
        unsigned char *end = op + m;
        if ((size_t)(oend - op) >= m + 8) {
            /* 8 bytes at a time, reading only bytes already final: from
             * `step` back, the least multiple of off that is >= 8 (the
             * match repeats with period off), once the first step - off
             * bytes are copied one by one. The last chunk may run up to 7
             * bytes past the match. */
            size_t step = off >= 8 ? off : off * ((8 + off - 1) / off);
            size_t k = step - off < m ? step - off : m;
            for (size_t i = 0; i < k; i++)
                op[i] = from[i];
            op += k;
            if (op < end) {
                from = op - step;
                do {
                    memcpy(op, from, 8);
                    op += 8;
                    from += 8;
                } while (op < end);
            }
        } else if (off >= m) {
            memcpy(op, from, m);
        } else { /* overlapping: a repeat of the last off bytes */
            for (size_t i = 0; i < m; i++)
                op[i] = from[i];
        }
        op = end;
    }
    return op == oend ? 0 : -EBADMSG;
}
