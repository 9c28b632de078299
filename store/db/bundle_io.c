/*
 * bundle_io.c: the bundle stream (bundle.h's layout): one stream type with
 * running digests, the writer and the reader. The reader takes any bytes
 * (it is fuzzed: tests/fuzz/fuzz_store_bundle.c) and answers with one line
 * in info->why rather than reading past what it was given or allocating
 * what a bundle merely declares.
 */
#include "bundle.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <lz4.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#define IO_CHUNK (1u << 20)
/* A block is written in pieces of this much (a pipe's buffer), each
 * counted as written once write(2) took it. */
#define OUT_PIECE (64u << 10)
/* The header text lists namespaces up to about this many bytes. */
#define HEADER_TEXT_NS (256u << 10)

/* ---- the stream ---------------------------------------------------------- */

int kc__bundle_why(struct kc_bundle_info *info, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(info->why, sizeof info->why, fmt, ap);
    va_end(ap);
    return rc;
}

int kc__bs_init(struct kc__bstream *s, int fd, const void *mem, size_t n)
{
    memset(s, 0, sizeof *s);
    s->fd = fd;
    s->copy_fd = -1;
    s->mem = mem;
    s->mem_len = n;
    s->xxh = XXH3_createState();
    if (s->xxh == NULL)
        return -ENOMEM;
    XXH3_128bits_reset(s->xxh);
    if (fd >= 0) {
        s->buf = malloc(IO_CHUNK);
        if (s->buf == NULL)
            return -ENOMEM;
        s->cap = IO_CHUNK;
    } else {
        s->buf = (unsigned char *)mem; /* read only */
        s->len = n;
        s->cap = n;
    }
    return 0;
}

void kc__bs_free(struct kc__bstream *s)
{
    if (s->fd >= 0)
        free(s->buf);
    if (s->xxh != NULL)
        XXH3_freeState(s->xxh);
    memset(s, 0, sizeof *s);
    s->fd = -1;
    s->copy_fd = -1;
}

static int write_all(int fd, const unsigned char *p, size_t n);

/* Copies n bytes just read to copy_fd, if any: 0 or the write error. */
static int bs_copy(struct kc__bstream *s, const unsigned char *p, size_t n)
{
    if (s->copy_fd < 0 || n == 0)
        return 0;
    int rc = write_all(s->copy_fd, p, n);
    if (rc < 0 && s->copy_err == 0)
        s->copy_err = rc;
    return rc;
}

static void bs_hash(struct kc__bstream *s, const void *p, size_t n)
{
    XXH3_128bits_update(s->xxh, p, n);
    if (s->hashing)
        s->crypto->digest_add(s->crypto->ctx, p, n);
}

/* n more bytes read from fd: the reader's progress. */
static void bs_got(struct kc__bstream *s, size_t n)
{
    s->fd_bytes += n;
    if (s->on_read != NULL && n > 0)
        s->on_read(s->fd_bytes, s->on_read_arg);
}

/* Refills the buffer so that at least `want` (<= cap) bytes are buffered,
 * or the stream ends. 0 or the read error. */
static int bs_fill(struct kc__bstream *s, size_t want)
{
    if (s->fd < 0 || s->len - s->pos >= want || s->eof)
        return 0;
    memmove(s->buf, s->buf + s->pos, s->len - s->pos);
    s->len -= s->pos;
    s->pos = 0;
    while (s->len < want && !s->eof) {
        ssize_t r = read(s->fd, s->buf + s->len, s->cap - s->len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            s->eof = true;
        int rc = bs_copy(s, s->buf + s->len, (size_t)r);
        if (rc < 0)
            return rc;
        s->len += (size_t)r;
        bs_got(s, (size_t)r);
    }
    return 0;
}

int kc__bs_read(struct kc__bstream *s, void *p, size_t n)
{
    unsigned char *o = p;
    while (n > 0) {
        if (s->pos == s->len) {
            if (s->fd < 0 || s->eof)
                return -ENODATA;
            if (n >= s->cap) {
                /* Large reads go straight into the caller's memory. */
                ssize_t r = read(s->fd, o, n);
                if (r < 0 && errno == EINTR)
                    continue;
                if (r < 0)
                    return -errno;
                if (r == 0) {
                    s->eof = true;
                    return -ENODATA;
                }
                int rc = bs_copy(s, o, (size_t)r);
                if (rc < 0)
                    return rc;
                bs_got(s, (size_t)r);
                bs_hash(s, o, (size_t)r);
                s->off += (uint64_t)r;
                o += r;
                n -= (size_t)r;
                continue;
            }
            int rc = bs_fill(s, 1);
            if (rc < 0)
                return rc;
            if (s->pos == s->len)
                return -ENODATA;
        }
        size_t k = s->len - s->pos < n ? s->len - s->pos : n;
        memcpy(o, s->buf + s->pos, k);
        bs_hash(s, o, k);
        s->pos += k;
        s->off += k;
        o += k;
        n -= k;
    }
    return 0;
}

int kc__bs_peek(struct kc__bstream *s, size_t n, const unsigned char **p)
{
    int rc = bs_fill(s, n);
    if (rc < 0)
        return rc;
    if (s->len - s->pos < n)
        return -ENODATA;
    *p = s->buf + s->pos;
    return 0;
}

bool kc__bs_at_end(struct kc__bstream *s)
{
    if (bs_fill(s, 1) < 0)
        return false;
    return s->pos == s->len;
}

int kc__bs_flush(struct kc__bstream *s)
{
    int rc = write_all(s->fd, s->buf, s->len);
    if (rc == 0)
        s->len = 0;
    return rc;
}

static int write_all(int fd, const unsigned char *p, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, p + done, n - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? -errno : -EIO;
        done += (size_t)w;
    }
    return 0;
}

int kc__bs_write(struct kc__bstream *s, const void *p, size_t n)
{
    const unsigned char *q = p;
    bs_hash(s, q, n);
    s->off += n;
    if (n >= s->cap && s->fd >= 0) {
        /* A block: written from where it lies, not through the buffer. */
        int rc = kc__bs_flush(s);
        return rc < 0 ? rc : write_all(s->fd, q, n);
    }
    while (n > 0) {
        if (s->len == s->cap) {
            int rc = kc__bs_flush(s);
            if (rc < 0)
                return rc;
        }
        size_t k = s->cap - s->len < n ? s->cap - s->len : n;
        memcpy(s->buf + s->len, q, k);
        s->len += k;
        q += k;
        n -= k;
    }
    return 0;
}

/* Writes n bytes through the digests to fd now, after what the buffer
 * holds (without fd: into the buffer). 0 or the write error. */
static int bs_write_now(struct kc__bstream *s, const void *p, size_t n)
{
    if (s->fd < 0)
        return kc__bs_write(s, p, n);
    int rc = kc__bs_flush(s);
    if (rc < 0)
        return rc;
    bs_hash(s, p, n);
    s->off += n;
    return write_all(s->fd, p, n);
}

kc_digest kc__bs_digest(struct kc__bstream *s)
{
    XXH128_hash_t h = XXH3_128bits_digest(s->xxh);
    return (kc_digest){.lo = h.low64, .hi = h.high64};
}

/* ---- words ---------------------------------------------------------------- */

static const char *codec_name(uint32_t c)
{
    return c == KC_BUNDLE_ZSTD ? "zstd" : c == KC_BUNDLE_LZ4 ? "lz4" : "raw";
}

void kc__bundle_ns_describe(const char *ns, char *out, size_t n)
{
    int major, minor, fmt, len = 0;
    char id[17];
    if (sscanf(ns, "nvrtc:%d.%d-%16[0-9a-f]-f%d%n", &major, &minor, id, &fmt, &len) == 4 &&
        ns[len] == '\0')
        snprintf(out, n, "NVRTC %d.%d, libnvrtc identity %s, record format %d", major, minor, id,
                 fmt);
    else if (sscanf(ns, "jit:%16[0-9a-f]%n", id, &len) == 1 && ns[len] == '\0')
        snprintf(out, n, "CUDA driver JIT, device and driver fingerprint %s", id);
    else if (sscanf(ns, "nvvm:%d.%d-%16[0-9a-f]-f%d%n", &major, &minor, id, &fmt, &len) == 4 &&
             ns[len] == '\0')
        snprintf(out, n, "libNVVM %d.%d, libnvvm identity %s, record format %d", major, minor, id,
                 fmt);
    else
        snprintf(out, n, "not a namespace kcache's shim uses");
}

static void ascii_line(struct kc__buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void ascii_line(struct kc__buf *b, const char *fmt, ...)
{
    char line[600];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (k < 0)
        return;
    size_t m = (size_t)k < sizeof line - 1 ? (size_t)k : sizeof line - 1;
    for (size_t i = 0; i < m; i++)
        if ((unsigned char)line[i] < 0x20 || (unsigned char)line[i] > 0x7e)
            line[i] = '?';
    line[m] = '\n';
    kc__buf_add(b, line, m + 1);
}

/* The header's text. */
static void header_text(struct kc__buf *t, const struct kc_bundle_info *info, int codec)
{
    char when[64] = "?";
    time_t secs = (time_t)(info->created_ns / 1000000000u);
    struct tm tm;
    if (gmtime_r(&secs, &tm) != NULL)
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    ascii_line(t, "kcache bundle, layout %d, record format %d", KC__BUNDLE_VERSION,
               KC_FORMAT_VERSION);
    ascii_line(t, "created %s", when);
    ascii_line(t, "entries %" PRIu64 ", %" PRIu64 " bytes uncompressed, blocks %s", info->entries,
               info->raw_bytes, codec_name((uint32_t)codec));
    if (info->key_id != 0)
        ascii_line(t, "signed by key %016" PRIx64, info->key_id);
    else
        ascii_line(t, "unsigned");
    /* The text is for people and bounded (a reader refuses more than
     * KC__BUNDLE_MAX_TEXT): past HEADER_TEXT_NS bytes of namespaces the
     * rest are counted, not listed (the table after the text has them all). */
    for (size_t i = 0; i < info->n_ns; i++) {
        if (t->len > HEADER_TEXT_NS) {
            ascii_line(t, "and %zu more namespaces", info->n_ns - i);
            break;
        }
        char d[200];
        kc__bundle_ns_describe(info->ns[i].ns, d, sizeof d);
        ascii_line(t, "namespace %s: %s; %" PRIu64 " entries, %" PRIu64 " bytes", info->ns[i].ns, d,
                   info->ns[i].entries, info->ns[i].raw_bytes);
    }
}

/* ---- the writer ----------------------------------------------------------- */

static void header_encode(struct kc__buf *b, const struct kc_bundle_info *info, int codec,
                          const struct kc__bundle_dict *dicts, size_t n_dicts)
{
    struct kc__buf t = {0};
    header_text(&t, info, codec);
    size_t total = KC__BUNDLE_HDR_FIXED + t.len + 8 + 8;
    for (size_t i = 0; i < info->n_ns; i++)
        total += KC__BUNDLE_NS_FIXED + strlen(info->ns[i].ns);
    for (size_t i = 0; i < n_dicts; i++)
        total += KC__BUNDLE_DICT_FIXED + dicts[i].len;
    unsigned char f[KC__BUNDLE_HDR_FIXED] = {0};
    memcpy(f, KC__BUNDLE_MAGIC, 8);
    kc__put_u16(f + 8, KC__BUNDLE_VERSION);
    kc__put_u16(f + 10, KC_FORMAT_VERSION);
    kc__put_u32(f + 12, info->key_id != 0 ? KC__BUNDLE_SIGNED : 0);
    kc__put_u64(f + 16, info->created_ns);
    kc__put_u64(f + 24, info->entries);
    kc__put_u64(f + 32, info->raw_bytes);
    kc__put_u64(f + 40, info->key_id);
    kc__put_u32(f + 48, (uint32_t)info->n_ns);
    kc__put_u32(f + 52, (uint32_t)t.len);
    kc__put_u32(f + 56, (uint32_t)codec);
    kc__put_u32(f + 60, (uint32_t)total);
    kc__buf_add(b, f, sizeof f);
    kc__buf_add(b, t.p, t.len);
    kc__buf_free(&t);
    for (size_t i = 0; i < info->n_ns; i++) {
        unsigned char e[KC__BUNDLE_NS_FIXED] = {0};
        size_t nl = strlen(info->ns[i].ns);
        kc__put_u16(e, (uint16_t)nl);
        kc__put_u64(e + 8, info->ns[i].entries);
        kc__put_u64(e + 16, info->ns[i].raw_bytes);
        kc__buf_add(b, e, sizeof e);
        kc__buf_add(b, info->ns[i].ns, nl);
    }
    unsigned char dn[8] = {0};
    kc__put_u32(dn, (uint32_t)n_dicts);
    kc__buf_add(b, dn, sizeof dn);
    for (size_t i = 0; i < n_dicts; i++) {
        unsigned char e[KC__BUNDLE_DICT_FIXED] = {0};
        kc__put_u64(e, dicts[i].id);
        kc__put_u32(e + 8, (uint32_t)dicts[i].len);
        kc__buf_add(b, e, sizeof e);
        kc__buf_add(b, dicts[i].p, dicts[i].len);
    }
    unsigned char x[8];
    kc__put_u64(x, b->err ? 0 : XXH3_64bits(b->p, b->len));
    kc__buf_add(b, x, 8);
}

size_t kc__bundle_header_size(const struct kc_bundle_info *info, int codec,
                              const struct kc__bundle_dict *dicts, size_t n_dicts)
{
    struct kc__buf b = {0};
    header_encode(&b, info, codec, dicts, n_dicts);
    size_t n = b.err ? SIZE_MAX : b.len;
    kc__buf_free(&b);
    return n;
}

static void *out_main(void *arg);

int kc__bundle_writer_begin(struct kc__bundle_writer *w, int fd, const struct kc_bundle_info *info,
                            int codec, int level, const struct kc_bundle_crypto *crypto,
                            const struct kc__bundle_dict *dicts, size_t n_dicts)
{
    memset(w, 0, sizeof *w);
    int rc = kc__bs_init(&w->s, fd, NULL, 0);
    if (rc < 0)
        return rc;
    if (codec != KC_BUNDLE_RAW && codec != KC_BUNDLE_ZSTD && codec != KC_BUNDLE_LZ4)
        return -EINVAL;
    w->codec = codec;
    w->level = level;
    w->crypto = crypto != NULL && crypto->key_id != 0 ? crypto : NULL;
    if (codec == KC_BUNDLE_ZSTD && (w->zcctx = ZSTD_createCCtx()) == NULL)
        return -ENOMEM;
    if (w->crypto != NULL) {
        w->crypto->digest_begin(w->crypto->ctx);
        w->s.crypto = w->crypto;
        w->s.hashing = true;
    }
    struct kc__buf h = {0};
    header_encode(&h, info, codec, dicts, n_dicts);
    rc = h.err ? h.err : kc__bs_write(&w->s, h.p, h.len);
    kc__buf_free(&h);
    if (rc == 0 && fd >= 0 && pthread_mutex_init(&w->mu, NULL) == 0) {
        if (pthread_cond_init(&w->cv, NULL) != 0)
            pthread_mutex_destroy(&w->mu);
        else if (pthread_create(&w->th, NULL, out_main, w) == 0)
            w->th_started = true;
        else {
            pthread_cond_destroy(&w->cv);
            pthread_mutex_destroy(&w->mu);
        }
    }
    return rc;
}

/* Compresses (when worth it) and writes one block of `records` records
 * (raw: their bytes, plain: of them, plain puts' bytes). On the output
 * thread when there is one. */
static int out_block(struct kc__bundle_writer *w, struct kc__buf *rawb, uint32_t records,
                     uint64_t plain, uint64_t first)
{
    size_t raw = rawb->len, stored = raw;
    const unsigned char *sp = rawb->p;
    uint32_t codec = KC_BUNDLE_RAW;
    /* A block of bodies as the store keeps them (zstd frames) is carried
     * as it is: a second compression would cost time and save nothing.
     * Only what holds plain bodies (an earlier version's) is compressed. */
    bool worth = plain >= raw / 8;
    if (w->codec != KC_BUNDLE_RAW && worth) {
        size_t bound = w->codec == KC_BUNDLE_ZSTD ? ZSTD_compressBound(raw)
                                                  : (size_t)LZ4_compressBound((int)raw);
        if (w->out_cap < bound) {
            unsigned char *o = realloc(w->out, bound);
            if (o == NULL)
                return -ENOMEM;
            w->out = o;
            w->out_cap = bound;
        }
        size_t got = 0;
        if (w->codec == KC_BUNDLE_ZSTD) {
            size_t z = ZSTD_compressCCtx(w->zcctx, w->out, w->out_cap, rawb->p, raw,
                                         w->level ? w->level : 3);
            got = ZSTD_isError(z) ? 0 : z;
        } else if (raw <= (size_t)LZ4_MAX_INPUT_SIZE) {
            int z = LZ4_compress_default((const char *)rawb->p, (char *)w->out, (int)raw,
                                         (int)w->out_cap);
            got = z > 0 ? (size_t)z : 0;
        }
        /* What does not shrink is carried as it is. */
        if (got > 0 && got < raw) {
            codec = (uint32_t)w->codec;
            stored = got;
            sp = w->out;
        }
    }
    unsigned char h[KC__BUNDLE_BLOCK_HDR];
    memcpy(h, KC__BUNDLE_BLOCK_MAGIC, 8);
    kc__put_u32(h + 8, codec);
    kc__put_u32(h + 12, records);
    kc__put_u64(h + 16, raw);
    kc__put_u64(h + 24, stored);
    kc__put_u64(h + 32, XXH3_64bits(sp, stored));
    kc__put_u64(h + 40, XXH3_64bits(h, 40));
    int rc = kc__bs_write(&w->s, h, sizeof h);
    /* In pieces, each counted as written once write(2) took it: a slow
     * reader's progress is what it was given, not what was handed here.
     * Then the stream's buffer, so that the block is all in fd. */
    for (size_t at = 0; rc == 0 && at < stored;) {
        size_t k = stored - at < OUT_PIECE ? stored - at : OUT_PIECE;
        rc = bs_write_now(&w->s, sp + at, k);
        at += k;
        if (rc == 0)
            atomic_store(&w->written,
                         first + (uint64_t)((double)records * (double)at / (double)stored));
    }
    if (rc == 0)
        rc = kc__bs_flush(&w->s);
    if (rc == 0)
        atomic_store(&w->written, first + records);
    w->blocks++;
    rawb->len = 0;
    return rc;
}

/* The output thread: writes each block handed to it (w->spare), so that
 * reading the store and writing the file go on at once. */
static void *out_main(void *arg)
{
    struct kc__bundle_writer *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->pending && !w->stop)
            pthread_cond_wait(&w->cv, &w->mu);
        if (!w->pending)
            break;
        pthread_mutex_unlock(&w->mu);
        int rc = w->th_rc == 0
                     ? out_block(w, &w->spare, w->spare_records, w->spare_plain, w->spare_first)
                     : 0;
        pthread_mutex_lock(&w->mu);
        if (rc < 0 && w->th_rc == 0)
            w->th_rc = rc;
        w->pending = false;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* Waits until the output thread holds no block: its first error, or 0.
 * w->tick is called about every 100 ms meanwhile. */
static int out_wait(struct kc__bundle_writer *w)
{
    pthread_mutex_lock(&w->mu);
    while (w->pending) {
        if (w->tick == NULL) {
            pthread_cond_wait(&w->cv, &w->mu);
            continue;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT && w->pending) {
            pthread_mutex_unlock(&w->mu);
            w->tick(w->tick_arg);
            pthread_mutex_lock(&w->mu);
        }
    }
    int rc = w->th_rc;
    pthread_mutex_unlock(&w->mu);
    return rc;
}

static int writer_flush_block(struct kc__bundle_writer *w)
{
    if (w->block_records == 0)
        return 0;
    uint32_t records = w->block_records;
    uint64_t plain = w->block_plain, first = w->raw_first;
    w->block_records = 0;
    w->block_plain = 0;
    w->raw_first = w->added;
    if (!w->th_started)
        return out_block(w, &w->raw, records, plain, first);
    int rc = out_wait(w);
    if (rc < 0)
        return rc;
    struct kc__buf t = w->spare;
    pthread_mutex_lock(&w->mu);
    w->spare = w->raw;
    w->spare_records = records;
    w->spare_plain = plain;
    w->spare_first = first;
    w->pending = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    w->raw = t;
    w->raw.len = 0;
    return 0;
}

/* Stops the output thread (after the block it holds). */
static int out_stop(struct kc__bundle_writer *w)
{
    if (!w->th_started)
        return 0;
    int rc = out_wait(w);
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->th, NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    w->th_started = false;
    return rc;
}

int kc__bundle_writer_add(struct kc__bundle_writer *w, const char *ns, const kc_key *key,
                          const kc_digest *body_digest, const void *put, size_t len)
{
    if (len > KC__BUNDLE_MAX_RECORD)
        return -EFBIG;
    unsigned char h[KC__BUNDLE_REC_HDR], kk[KC__NS_MAX + 1 + KC__KEY_LEN];
    kc__put_u64(h, len);
    kc_digest name = kc_digest_of(kk, kc__kkey(ns, key, kk));
    kc__digest_encode(&name, h + 8);
    kc__digest_encode(body_digest, h + 24);
    kc__buf_add(&w->raw, h, sizeof h);
    kc__buf_add(&w->raw, put, len);
    if (w->raw.err)
        return w->raw.err;
    if (len <= 4 || ((const unsigned char *)put)[4] != KC__SP_STORED)
        w->block_plain += len;
    w->block_records++;
    w->added++;
    w->entries++;
    w->raw_bytes += KC__BUNDLE_REC_SIZE(len);
    if (w->raw.len >= KC__BUNDLE_BLOCK_TARGET)
        return writer_flush_block(w);
    return 0;
}

int kc__bundle_writer_add_body(struct kc__bundle_writer *w, const kc_digest *digest,
                               const void *value, size_t len)
{
    if (len > KC__BUNDLE_MAX_RECORD)
        return -EFBIG;
    unsigned char h[KC__BUNDLE_REC_HDR] = {0};
    kc__put_u64(h, (uint64_t)len | KC__BUNDLE_REC_BODY);
    kc__digest_encode(digest, h + 24);
    kc__buf_add(&w->raw, h, sizeof h);
    kc__buf_add(&w->raw, value, len);
    if (w->raw.err)
        return w->raw.err;
    w->block_records++;
    w->added++;
    if (w->raw.len >= KC__BUNDLE_BLOCK_TARGET)
        return writer_flush_block(w);
    return 0;
}

int kc__bundle_writer_add_entry(struct kc__bundle_writer *w, const char *ns, const kc_key *key,
                                const kc_digest *source, const struct kc__hdr *h,
                                const kc_digest *body_digest, const void *body, size_t len,
                                int type)
{
    bool stored = type != KC__SP_PUT;
    size_t at = w->raw.len;
    unsigned char rh[KC__BUNDLE_REC_HDR] = {0}, kk[KC__NS_MAX + 1 + KC__KEY_LEN];
    kc__buf_add(&w->raw, rh, sizeof rh); /* filled in below */
    int rc = type == KC__SP_ENTRY ? kc__spool_put_encode_entry(&w->raw, ns, key, source, h)
             : type == KC__SP_STORED
                 ? kc__spool_put_encode_stored(&w->raw, ns, key, source, h, body, len)
                 : kc__spool_put_encode(&w->raw, ns, key, source, h, body, len);
    if (rc != 0 || w->raw.err) {
        w->raw.len = at;
        return rc != 0 ? rc : w->raw.err;
    }
    uint64_t plen = w->raw.len - at - KC__BUNDLE_REC_HDR;
    if (plen > KC__BUNDLE_MAX_RECORD) {
        w->raw.len = at;
        return -EFBIG;
    }
    unsigned char *p = w->raw.p + at;
    kc__put_u64(p, plen);
    kc_digest name = kc_digest_of(kk, kc__kkey(ns, key, kk));
    kc__digest_encode(&name, p + 8);
    kc__digest_encode(body_digest, p + 24);
    if (!stored)
        w->block_plain += plen;
    w->block_records++;
    w->added++;
    w->entries++;
    w->raw_bytes += KC__BUNDLE_REC_SIZE(plen);
    if (w->raw.len >= KC__BUNDLE_BLOCK_TARGET)
        return writer_flush_block(w);
    return 0;
}

uint64_t kc__bundle_writer_written(struct kc__bundle_writer *w)
{
    return atomic_load(&w->written);
}

int kc__bundle_writer_sync(struct kc__bundle_writer *w)
{
    int rc = writer_flush_block(w);
    if (rc == 0 && w->th_started)
        rc = out_wait(w);
    return rc;
}

int kc__bundle_writer_finish(struct kc__bundle_writer *w, uint64_t *file_bytes)
{
    int rc = writer_flush_block(w);
    int src = out_stop(w);
    if (rc == 0)
        rc = src;
    if (rc < 0)
        return rc;
    unsigned char t[KC__BUNDLE_TRAILER] = {0};
    uint64_t before = w->s.off;
    kc_digest d = kc__bs_digest(&w->s);
    memcpy(t, KC__BUNDLE_TRAILER_MAGIC, 8);
    kc__put_u64(t + 8, w->entries);
    kc__put_u64(t + 16, w->blocks);
    kc__put_u64(t + 24, before);
    kc__digest_encode(&d, t + 32);
    if (w->crypto != NULL) {
        kc__put_u32(t + 48, KC__BUNDLE_SIGNED);
        kc__put_u64(t + 56, w->crypto->key_id);
        w->crypto->digest_end(w->crypto->ctx, t + 64);
        w->s.hashing = false;
        unsigned char msg[16 + 96];
        memcpy(msg, KC__BUNDLE_SIG_CONTEXT, 16);
        memcpy(msg + 16, t, 96);
        rc = w->crypto->sign(w->crypto->ctx, msg, sizeof msg, t + 96);
        if (rc < 0)
            return rc;
    }
    kc__put_u64(t + 160, XXH3_64bits(t, 160));
    memcpy(t + 168, KC__BUNDLE_END_MAGIC, 8);
    rc = kc__bs_write(&w->s, t, sizeof t);
    if (rc == 0)
        rc = kc__bs_flush(&w->s);
    if (rc == 0 && file_bytes != NULL)
        *file_bytes = w->s.off;
    return rc;
}

void kc__bundle_writer_free(struct kc__bundle_writer *w)
{
    out_stop(w);
    kc__bs_free(&w->s);
    kc__buf_free(&w->raw);
    kc__buf_free(&w->spare);
    free(w->out);
    if (w->zcctx != NULL)
        ZSTD_freeCCtx(w->zcctx);
    memset(w, 0, sizeof *w);
}

/* ---- namespace index ---------------------------------------------------------- */

static size_t ns_hash(const char *name)
{
    return (size_t)XXH3_64bits(name, strlen(name));
}

size_t kc__nsindex_find(const struct kc__nsindex *x, const struct kc_bundle_ns *v, const char *name)
{
    if (x->cap == 0)
        return SIZE_MAX;
    size_t mask = x->cap - 1;
    for (size_t i = ns_hash(name) & mask; x->slot[i] != 0; i = (i + 1) & mask)
        if (strcmp(v[x->slot[i] - 1].ns, name) == 0)
            return x->slot[i] - 1;
    return SIZE_MAX;
}

static void ns_place(uint32_t *slot, size_t mask, const struct kc_bundle_ns *v, uint32_t i)
{
    size_t j = ns_hash(v[i].ns) & mask;
    while (slot[j] != 0)
        j = (j + 1) & mask;
    slot[j] = i + 1;
}

int kc__nsindex_add(struct kc__nsindex *x, const struct kc_bundle_ns *v, size_t i)
{
    if (i >= UINT32_MAX)
        return -ENOMEM;
    if (2 * (x->n + 1) > x->cap) {
        size_t cap = x->cap ? 2 * x->cap : 64;
        uint32_t *slot = calloc(cap, sizeof *slot);
        if (slot == NULL)
            return -ENOMEM;
        for (size_t k = 0; k < x->cap; k++)
            if (x->slot[k] != 0)
                ns_place(slot, cap - 1, v, x->slot[k] - 1);
        free(x->slot);
        x->slot = slot;
        x->cap = cap;
    }
    ns_place(x->slot, x->cap - 1, v, (uint32_t)i);
    x->n++;
    return 0;
}

void kc__nsindex_free(struct kc__nsindex *x)
{
    free(x->slot);
    memset(x, 0, sizeof *x);
}

/* ---- the reader ------------------------------------------------------------- */

static int fail(struct kc__bundle_reader *r, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(struct kc__bundle_reader *r, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->info->why, sizeof r->info->why, fmt, ap);
    va_end(ap);
    /* One line of text, whatever a namespace in the bundle holds. */
    for (char *c = r->info->why; *c; c++)
        if ((unsigned char)*c < 0x20 || (unsigned char)*c == 0x7f)
            *c = '?';
    return rc;
}

/* A read that must succeed: a short one is a truncated bundle. */
static int must_read(struct kc__bundle_reader *r, void *p, size_t n, const char *what)
{
    int rc = kc__bs_read(&r->s, p, n);
    if (rc == -ENODATA)
        return fail(r, -EBADMSG, "truncated: the bundle ends at byte %" PRIu64 ", inside %s",
                    r->s.off, what);
    if (rc < 0)
        return fail(r, rc, "cannot read the bundle: %s", strerror(-rc));
    return 0;
}

static const char *human(uint64_t n, char *buf, size_t len)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)n;
    int i = 0;
    while (v >= 1024 && i < 6) {
        v /= 1024;
        i++;
    }
    snprintf(buf, len, i == 0 ? "%.0f %s" : "%.1f %s", v, u[i]);
    return buf;
}

/* Reads n bytes into *buf (cap *cap bytes), growing it as bytes arrive: a
 * declared length is never allocated before its bytes are there (at most
 * twice what has arrived is). */
static int read_grow(struct kc__bundle_reader *r, unsigned char **buf, size_t *cap, size_t n,
                     const char *what)
{
    size_t got = 0;
    while (got < n) {
        size_t step = got > IO_CHUNK ? got : IO_CHUNK;
        size_t want = n - got < step ? n - got : step;
        if (*cap < got + want) {
            size_t c = *cap ? *cap : IO_CHUNK;
            while (c < got + want)
                c *= 2;
            if (c > n)
                c = n;
            unsigned char *b = realloc(*buf, c);
            if (b == NULL)
                return fail(r, -ENOMEM, "out of memory");
            *buf = b;
            *cap = c;
        }
        int rc = must_read(r, *buf + got, want, what);
        if (rc < 0)
            return rc;
        got += want;
    }
    return 0;
}

/* The header's dictionaries (after the namespace table, at *o of the n
 * bytes at h): each one's id checked against its bytes, copied into the
 * reader (r->dict, r->dict_data), and loadable for inflating (r->dicts). */
static int dict_load(void *arg, uint64_t id, char **p, size_t *n)
{
    struct kc__bundle_reader *r = arg;
    for (size_t i = 0; i < r->n_dicts; i++)
        if (r->dict[i].id == id) {
            *p = malloc(r->dict[i].len);
            if (*p == NULL)
                return -ENOMEM;
            memcpy(*p, r->dict_data + r->dict[i].off, r->dict[i].len);
            *n = r->dict[i].len;
            return 0;
        }
    return -ENOENT;
}

static int read_dicts(struct kc__bundle_reader *r, const unsigned char *h, size_t n, size_t *o)
{
    if (n - *o < 8 || kc__get_u32(h + *o + 4) != 0)
        return fail(r, -EBADMSG, "damaged header: dictionary table");
    uint32_t nd = kc__get_u32(h + *o);
    *o += 8;
    if (nd > KC__BUNDLE_MAX_DICTS)
        return fail(r, -EFBIG, "header declares %u dictionaries, past the limit of %u", nd,
                    KC__BUNDLE_MAX_DICTS);
    r->dict = calloc(nd ? nd : 1, sizeof *r->dict);
    if (r->dict == NULL)
        return fail(r, -ENOMEM, "out of memory");
    size_t total = 0, start = *o;
    for (uint32_t i = 0; i < nd; i++) {
        if (n - *o < KC__BUNDLE_DICT_FIXED || kc__get_u32(h + *o + 12) != 0)
            return fail(r, -EBADMSG, "damaged header: dictionary %u", i + 1);
        uint64_t id = kc__get_u64(h + *o);
        size_t len = kc__get_u32(h + *o + 8);
        if (len == 0 || len > KC__BUNDLE_MAX_DICT || n - *o - KC__BUNDLE_DICT_FIXED < len ||
            kc__dict_id(h + *o + KC__BUNDLE_DICT_FIXED, len) != id)
            return fail(r, -EBADMSG, "damaged header: dictionary %u is not its id's", i + 1);
        r->dict[i].id = id;
        r->dict[i].len = len;
        r->dict[i].off = total;
        total += len;
        *o += KC__BUNDLE_DICT_FIXED + len;
    }
    r->dict_data = malloc(total ? total : 1);
    if (r->dict_data == NULL)
        return fail(r, -ENOMEM, "out of memory");
    for (size_t i = 0, at = start; i < nd; i++) {
        memcpy(r->dict_data + r->dict[i].off, h + at + KC__BUNDLE_DICT_FIXED, r->dict[i].len);
        at += KC__BUNDLE_DICT_FIXED + r->dict[i].len;
    }
    r->n_dicts = nd;
    kc__dicts_init(&r->dicts, dict_load, r);
    return 0;
}

bool kc__bundle_reader_has_dict(const struct kc__bundle_reader *r, uint64_t id)
{
    for (size_t i = 0; i < r->n_dicts; i++)
        if (r->dict[i].id == id)
            return true;
    return false;
}

static int reader_begin(struct kc__bundle_reader *r, int fd, const void *mem, size_t n, int copy_fd,
                        void (*on_read)(uint64_t, void *), void *arg, struct kc_bundle_info *info,
                        const struct kc_bundle_crypto *crypto, bool trust_unsigned);

int kc__bundle_reader_begin(struct kc__bundle_reader *r, int fd, const void *mem, size_t n,
                            struct kc_bundle_info *info, const struct kc_bundle_crypto *crypto,
                            bool trust_unsigned)
{
    return reader_begin(r, fd, mem, n, -1, NULL, NULL, info, crypto, trust_unsigned);
}

int kc__bundle_reader_begin_copy(struct kc__bundle_reader *r, int fd, int copy_fd,
                                 struct kc_bundle_info *info, const struct kc_bundle_crypto *crypto,
                                 bool trust_unsigned)
{
    return reader_begin(r, fd, NULL, 0, copy_fd, NULL, NULL, info, crypto, trust_unsigned);
}

int kc__bundle_reader_begin_read(struct kc__bundle_reader *r, int fd, int copy_fd,
                                 void (*on_read)(uint64_t bytes, void *arg), void *arg,
                                 struct kc_bundle_info *info, const struct kc_bundle_crypto *crypto,
                                 bool trust_unsigned)
{
    return reader_begin(r, fd, NULL, 0, copy_fd, on_read, arg, info, crypto, trust_unsigned);
}

static int reader_begin(struct kc__bundle_reader *r, int fd, const void *mem, size_t n, int copy_fd,
                        void (*on_read)(uint64_t, void *), void *arg, struct kc_bundle_info *info,
                        const struct kc_bundle_crypto *crypto, bool trust_unsigned)
{
    memset(r, 0, sizeof *r);
    memset(info, 0, sizeof *info);
    r->info = info;
    r->crypto = crypto;
    r->trust_unsigned = trust_unsigned;
    int rc = kc__bs_init(&r->s, fd, mem, n);
    if (rc < 0)
        return fail(r, rc, "out of memory");
    if (fd >= 0) {
        r->s.copy_fd = copy_fd;
        r->s.on_read = on_read;
        r->s.on_read_arg = arg;
    }
    /* The digest starts with the first byte; it is kept only when the
     * header says the bundle is signed by a key we trust. */
    bool can_verify = crypto != NULL && crypto->digest_begin != NULL && crypto->verify != NULL;
    if (can_verify) {
        crypto->digest_begin(crypto->ctx);
        r->s.crypto = crypto;
        r->s.hashing = true;
    }
    unsigned char f[KC__BUNDLE_HDR_FIXED] = {0};
    rc = kc__bs_read(&r->s, f, sizeof f);
    if (rc < 0 && rc != -ENODATA)
        return fail(r, rc, "cannot read the bundle: %s", strerror(-rc));
    size_t got = (size_t)r->s.off, m = got < 8 ? got : 8;
    if (got == 0 || memcmp(f, KC__BUNDLE_MAGIC, m) != 0)
        return fail(r, -EBADMSG, "not a kcache bundle (it does not start with KCBUNDLE)");
    if (rc == -ENODATA)
        return fail(r, -EBADMSG, "truncated: the bundle ends at byte %zu, inside its header", got);
    info->version = kc__get_u16(f + 8);
    info->format = kc__get_u16(f + 10);
    uint32_t flags = kc__get_u32(f + 12);
    info->created_ns = kc__get_u64(f + 16);
    info->entries = kc__get_u64(f + 24);
    info->raw_bytes = kc__get_u64(f + 32);
    info->key_id = kc__get_u64(f + 40);
    uint32_t nns = kc__get_u32(f + 48), tlen = kc__get_u32(f + 52), hlen = kc__get_u32(f + 60);
    if (info->version < KC__BUNDLE_VERSION_MIN || info->version > KC__BUNDLE_VERSION)
        return fail(r, -EPROTO, "bundle layout version %u; this kcache reads versions %d to %d",
                    info->version, KC__BUNDLE_VERSION_MIN, KC__BUNDLE_VERSION);
    if (info->format != KC_FORMAT_VERSION)
        return fail(r, -EPROTO,
                    "the bundle holds records of format %u; this kcache keeps format %d",
                    info->format, KC_FORMAT_VERSION);
    if ((flags & ~KC__BUNDLE_SIGNED) != 0 ||
        ((flags & KC__BUNDLE_SIGNED) != 0) != (info->key_id != 0))
        return fail(r, -EBADMSG, "damaged header: flags %#x with key id %016" PRIx64, flags,
                    info->key_id);
    if (nns > KC__BUNDLE_MAX_NS || tlen > KC__BUNDLE_MAX_TEXT || hlen > KC__BUNDLE_MAX_HDR ||
        hlen <
            KC__BUNDLE_HDR_FIXED + (uint64_t)tlen + 8 + (uint64_t)nns * (KC__BUNDLE_NS_FIXED + 1))
        return fail(r, -EFBIG,
                    "the header declares %u namespaces, %u bytes of text, %u bytes in all: "
                    "past the limits (%u, %u, %u) or inconsistent",
                    nns, tlen, hlen, KC__BUNDLE_MAX_NS, KC__BUNDLE_MAX_TEXT, KC__BUNDLE_MAX_HDR);
    info->is_signed = info->key_id != 0;
    /* The signature policy, before anything else is read. */
    if (!info->is_signed && !trust_unsigned)
        return fail(r, -EKEYREJECTED,
                    "the bundle is unsigned; import it with --trust-unsigned, or have it exported "
                    "with a signing key (KCACHE_REMOTE_SIGNING_KEY or --sign)");
    bool trusted = info->is_signed && can_verify && crypto->trusted != NULL &&
                   crypto->trusted(crypto->ctx, info->key_id) == 1;
    if (info->is_signed && !trusted && !trust_unsigned)
        return fail(r, -EKEYREJECTED,
                    "the bundle is signed by key %016" PRIx64
                    ", which is not a trusted key (KCACHE_REMOTE_TRUSTED_KEYS)",
                    info->key_id);
    if (!trusted) {
        r->s.hashing = false; /* nothing to verify with */
        r->crypto = NULL;
    }
    /* The rest of the header: read in pieces (its size is bounded above). */
    size_t rest = hlen - KC__BUNDLE_HDR_FIXED;
    unsigned char *h = NULL;
    size_t hcap = 0;
    rc = read_grow(r, &h, &hcap, rest, "its header");
    if (rc < 0) {
        free(h);
        return rc;
    }
    /* The header checksum covers its bytes before it, fixed part first. */
    XXH3_state_t *x = XXH3_createState();
    if (x == NULL) {
        free(h);
        return fail(r, -ENOMEM, "out of memory");
    }
    XXH3_64bits_reset(x);
    XXH3_64bits_update(x, f, sizeof f);
    XXH3_64bits_update(x, h, rest - 8);
    bool sum_ok = XXH3_64bits_digest(x) == kc__get_u64(h + rest - 8);
    XXH3_freeState(x);
    if (!sum_ok) {
        free(h);
        return fail(r, -EBADMSG, "damaged header (its checksum does not match)");
    }
    info->ns = calloc(nns ? nns : 1, sizeof *info->ns);
    r->ns_entries = calloc(nns ? nns : 1, sizeof *r->ns_entries);
    r->ns_bytes = calloc(nns ? nns : 1, sizeof *r->ns_bytes);
    if (info->ns == NULL || r->ns_entries == NULL || r->ns_bytes == NULL) {
        free(h);
        return fail(r, -ENOMEM, "out of memory");
    }
    size_t o = tlen;
    uint64_t sum_entries = 0, sum_bytes = 0;
    for (uint32_t i = 0; i < nns; i++) {
        if (rest - 8 - o < KC__BUNDLE_NS_FIXED) {
            free(h);
            return fail(r, -EBADMSG, "damaged header: namespace table");
        }
        size_t nl = kc__get_u16(h + o);
        if (nl < 1 || nl > KC__NS_MAX || kc__get_u16(h + o + 2) != 0 ||
            kc__get_u32(h + o + 4) != 0 || rest - 8 - o - KC__BUNDLE_NS_FIXED < nl ||
            memchr(h + o + KC__BUNDLE_NS_FIXED, 0, nl) != NULL) {
            free(h);
            return fail(r, -EBADMSG, "damaged header: namespace %u", i + 1);
        }
        struct kc_bundle_ns *e = &info->ns[i];
        e->entries = kc__get_u64(h + o + 8);
        e->raw_bytes = kc__get_u64(h + o + 16);
        memcpy(e->ns, h + o + KC__BUNDLE_NS_FIXED, nl);
        e->ns[nl] = '\0';
        e->usable = -1;
        if (kc__nsindex_find(&r->ns_index, info->ns, e->ns) != SIZE_MAX) {
            free(h);
            return fail(r, -EBADMSG, "damaged header: namespace %s twice", e->ns);
        }
        if (kc__nsindex_add(&r->ns_index, info->ns, i) != 0) {
            free(h);
            return fail(r, -ENOMEM, "out of memory");
        }
        sum_entries += e->entries;
        sum_bytes += e->raw_bytes;
        o += KC__BUNDLE_NS_FIXED + nl;
    }
    info->n_ns = nns;
    rc = read_dicts(r, h, rest - 8, &o);
    free(h);
    if (rc < 0)
        return rc;
    if (o != rest - 8)
        return fail(r, -EBADMSG, "damaged header: %zu bytes after its dictionaries", rest - 8 - o);
    if (sum_entries != info->entries || sum_bytes != info->raw_bytes)
        return fail(r, -EBADMSG, "damaged header: its namespaces do not add up to its totals");
    r->zdctx = ZSTD_createDCtx();
    if (r->zdctx == NULL)
        return fail(r, -ENOMEM, "out of memory");
    /* Windows past 16 MiB (which no writer of ours uses) are refused rather
     * than allocated. */
    ZSTD_DCtx_setParameter(r->zdctx, ZSTD_d_windowLogMax, 24);
    return 0;
}

/* Reads the trailer (its magic already peeked) and checks it, the counts,
 * the digests and the signature, and that nothing follows. */
static int read_trailer(struct kc__bundle_reader *r)
{
    struct kc_bundle_info *info = r->info;
    uint64_t before = r->s.off;
    kc_digest d = kc__bs_digest(&r->s);
    unsigned char b2[32] = {0};
    if (r->crypto != NULL) {
        r->crypto->digest_end(r->crypto->ctx, b2);
        r->s.hashing = false;
    }
    unsigned char t[KC__BUNDLE_TRAILER];
    int rc = must_read(r, t, sizeof t, "its trailer");
    if (rc < 0)
        return rc;
    if (kc__get_u64(t + 160) != XXH3_64bits(t, 160) || memcmp(t + 168, KC__BUNDLE_END_MAGIC, 8))
        return fail(r, -EBADMSG, "damaged trailer (its checksum does not match)");
    kc_digest td;
    kc__digest_decode(t + 32, &td);
    if (kc__get_u64(t + 24) != before || td.lo != d.lo || td.hi != d.hi)
        return fail(r, -EBADMSG,
                    "damaged: the digest of the bundle's %" PRIu64
                    " bytes does not match its trailer's",
                    before);
    uint32_t flags = kc__get_u32(t + 48);
    if (flags != (info->is_signed ? KC__BUNDLE_SIGNED : 0u) || kc__get_u32(t + 52) != 0 ||
        kc__get_u64(t + 56) != info->key_id)
        return fail(r, -EBADMSG, "damaged: the trailer's signer does not match the header's");
    if (kc__get_u64(t + 8) != r->record_no || kc__get_u64(t + 16) != r->block_no ||
        r->record_no != info->entries || r->seen_raw != info->raw_bytes)
        return fail(
            r, -EBADMSG,
            "damaged: %" PRIu64 " entries in %" PRIu64 " blocks read, the header says %" PRIu64
            " and the trailer %" PRIu64 " in %" PRIu64,
            r->record_no, r->block_no, info->entries, kc__get_u64(t + 8), kc__get_u64(t + 16));
    for (size_t i = 0; i < info->n_ns; i++)
        if (r->ns_entries[i] != info->ns[i].entries || r->ns_bytes[i] != info->ns[i].raw_bytes)
            return fail(r, -EBADMSG,
                        "damaged: namespace %s holds %" PRIu64 " entries, the header says %" PRIu64,
                        info->ns[i].ns, r->ns_entries[i], info->ns[i].entries);
    if (r->crypto != NULL) {
        if (memcmp(b2, t + 64, 32) != 0)
            return fail(r, -EKEYREJECTED,
                        "bad signature: the bundle's bytes are not the ones key %016" PRIx64
                        " signed",
                        info->key_id);
        unsigned char msg[16 + 96];
        memcpy(msg, KC__BUNDLE_SIG_CONTEXT, 16);
        memcpy(msg + 16, t, 96);
        rc = r->crypto->verify(r->crypto->ctx, info->key_id, msg, sizeof msg, t + 96);
        if (rc == -ENOKEY)
            return fail(r, -EKEYREJECTED,
                        "the bundle is signed by key %016" PRIx64 ", which is not a trusted key",
                        info->key_id);
        if (rc < 0)
            return fail(r, -EKEYREJECTED,
                        "bad signature: key %016" PRIx64 " did not sign this bundle", info->key_id);
    }
    if (!kc__bs_at_end(&r->s))
        return fail(r, -EBADMSG, "damaged: bytes follow the trailer at byte %" PRIu64, r->s.off);
    info->blocks = r->block_no;
    info->file_bytes = r->s.off;
    info->verified = !info->is_signed || r->crypto != NULL;
    r->done = true;
    return 0;
}

/* Makes room for cap bytes in r->raw; false (with why) when memory ran out. */
static bool raw_room(struct kc__bundle_reader *r, size_t cap)
{
    if (r->raw_cap >= cap)
        return true;
    unsigned char *p = realloc(r->raw, cap);
    if (p == NULL) {
        fail(r, -ENOMEM, "out of memory");
        return false;
    }
    r->raw = p;
    r->raw_cap = cap;
    return true;
}

/* Inflates the stored zstd frame into exactly raw bytes. The output buffer
 * grows with what the frame really produces (never to what it declares),
 * and the decoder's window is bounded: a bomb stops at its declared size. */
static bool inflate_zstd(struct kc__bundle_reader *r, size_t stored, size_t raw)
{
    ZSTD_DCtx_reset(r->zdctx, ZSTD_reset_session_only);
    ZSTD_inBuffer in = {r->stored, stored, 0};
    size_t cap = raw < IO_CHUNK ? raw : IO_CHUNK;
    if (!raw_room(r, cap ? cap : 1))
        return false;
    ZSTD_outBuffer out = {r->raw, cap, 0};
    for (;;) {
        size_t z = ZSTD_decompressStream(r->zdctx, &out, &in);
        if (ZSTD_isError(z))
            return false;
        if (z == 0) /* the frame is whole */
            return out.pos == raw && in.pos == in.size;
        if (out.pos == out.size) {
            if (out.size == raw)
                return false; /* more to come than declared */
            cap = out.size * 2 < raw ? out.size * 2 : raw;
            if (!raw_room(r, cap))
                return false;
            out.dst = r->raw;
            out.size = cap;
        } else if (in.pos == in.size) {
            return false; /* the frame is cut short */
        }
    }
}

/* An LZ4 block inflates at most 255:1, so the buffer is bounded by what is
 * stored as well as by the declared size. */
static bool inflate_lz4(struct kc__bundle_reader *r, size_t stored, size_t raw)
{
    if (raw > stored * 255 + 16 || !raw_room(r, raw ? raw : 1))
        return false;
    int z = LZ4_decompress_safe((const char *)r->stored, (char *)r->raw, (int)stored, (int)raw);
    return z >= 0 && (size_t)z == raw;
}

static int read_block(struct kc__bundle_reader *r)
{
    unsigned char h[KC__BUNDLE_BLOCK_HDR];
    uint64_t at = r->s.off;
    int rc = must_read(r, h, sizeof h, "a block header");
    if (rc < 0)
        return rc;
    uint64_t no = r->block_no + 1;
    if (kc__get_u64(h + 40) != XXH3_64bits(h, 40))
        return fail(r, -EBADMSG,
                    "damaged: block %" PRIu64 " at byte %" PRIu64
                    " (its header checksum does not match)",
                    no, at);
    uint32_t codec = kc__get_u32(h + 8), recs = kc__get_u32(h + 12);
    uint64_t raw = kc__get_u64(h + 16), stored = kc__get_u64(h + 24);
    char b1[32], b2[32];
    if (raw > KC__BUNDLE_MAX_BLOCK || stored > KC__BUNDLE_MAX_BLOCK + (KC__BUNDLE_MAX_BLOCK >> 7))
        return fail(r, -EFBIG,
                    "block %" PRIu64 " at byte %" PRIu64 " declares %s (%s stored), past the %s a "
                    "block may hold",
                    no, at, human(raw, b1, sizeof b1), human(stored, b2, sizeof b2),
                    human(KC__BUNDLE_MAX_BLOCK, (char[32]){0}, 32));
    size_t bound = codec == KC_BUNDLE_RAW    ? (size_t)raw
                   : codec == KC_BUNDLE_ZSTD ? ZSTD_compressBound((size_t)raw)
                   : codec == KC_BUNDLE_LZ4 && raw <= (uint64_t)LZ4_MAX_INPUT_SIZE
                       ? (size_t)LZ4_compressBound((int)raw)
                       : 0;
    if (codec > KC_BUNDLE_LZ4 || recs == 0 || raw < (uint64_t)recs * KC__BUNDLE_REC_HDR ||
        stored > bound || (codec == KC_BUNDLE_RAW && stored != raw) || bound == 0)
        return fail(r, -EBADMSG,
                    "damaged: block %" PRIu64 " at byte %" PRIu64 " (codec %u, %u records, %" PRIu64
                    " bytes, %" PRIu64 " stored)",
                    no, at, codec, recs, raw, stored);
    rc = read_grow(r, &r->stored, &r->stored_cap, (size_t)stored, "a block");
    if (rc < 0)
        return rc;
    if (XXH3_64bits(r->stored, (size_t)stored) != kc__get_u64(h + 32))
        return fail(r, -EBADMSG,
                    "damaged: block %" PRIu64 " at byte %" PRIu64 " (its checksum does not match)",
                    no, at);
    /* Where the block's records lie in the stream, when as they are. */
    r->block_at = codec == KC_BUNDLE_RAW ? at + KC__BUNDLE_BLOCK_HDR : UINT64_MAX;
    if (codec == KC_BUNDLE_RAW) {
        /* The stored bytes are the records: swap the buffers. */
        unsigned char *t = r->raw;
        size_t tc = r->raw_cap;
        r->raw = r->stored;
        r->raw_cap = r->stored_cap;
        r->stored = t;
        r->stored_cap = tc;
    } else {
        bool ok = codec == KC_BUNDLE_ZSTD ? inflate_zstd(r, (size_t)stored, (size_t)raw)
                                          : inflate_lz4(r, (size_t)stored, (size_t)raw);
        if (!ok)
            return r->info->why[0] != '\0'
                       ? -ENOMEM
                       : fail(r, -EBADMSG,
                              "damaged: block %" PRIu64 " at byte %" PRIu64
                              " does not inflate to its declared %" PRIu64 " bytes",
                              no, at, raw);
    }
    r->raw_len = (size_t)raw;
    r->raw_pos = 0;
    r->block_left = recs;
    r->block_no = no;
    return 0;
}

/* The body records read so far: open addressing on the digest's first
 * bytes (a digest is uniform). */
static const struct kc__bodyref *body_find(const struct kc__bundle_reader *r,
                                           const unsigned char digest[16])
{
    if (r->cap_bodies == 0)
        return NULL;
    size_t mask = r->cap_bodies - 1, i = (size_t)kc__get_u64(digest) & mask;
    for (; r->bodies[i].used; i = (i + 1) & mask)
        if (memcmp(r->bodies[i].digest, digest, 16) == 0)
            return &r->bodies[i];
    return NULL;
}

static int body_add(struct kc__bundle_reader *r, const struct kc__bodyref *b)
{
    if (2 * (r->n_bodies + 1) > r->cap_bodies) {
        size_t cap = r->cap_bodies ? 2 * r->cap_bodies : 1024;
        struct kc__bodyref *v = calloc(cap, sizeof *v);
        if (v == NULL)
            return -ENOMEM;
        for (size_t i = 0; i < r->cap_bodies; i++) {
            if (!r->bodies[i].used)
                continue;
            size_t j = (size_t)kc__get_u64(r->bodies[i].digest) & (cap - 1);
            while (v[j].used)
                j = (j + 1) & (cap - 1);
            v[j] = r->bodies[i];
        }
        free(r->bodies);
        r->bodies = v;
        r->cap_bodies = cap;
    }
    size_t mask = r->cap_bodies - 1, i = (size_t)kc__get_u64(b->digest) & mask;
    while (r->bodies[i].used)
        i = (i + 1) & mask;
    r->bodies[i] = *b;
    r->bodies[i].used = true;
    r->n_bodies++;
    return 0;
}

/* A body record (layout 3) at p (left bytes in its block; n its body's
 * length): in an uncompressed block, filed under no name, not seen before,
 * a body as the store keeps one (a dictionary it names in the header;
 * within KC__BUNDLE_MAX_RATIO; with check_bodies, inflating to its stated
 * size), its bytes its digest's. Noted for the entries that name it. */
static int read_body_record(struct kc__bundle_reader *r, const unsigned char *p, size_t left,
                            uint64_t n)
{
    static const unsigned char zero[16];
    uint64_t no = r->n_bodies + 1;
    if (n > left - KC__BUNDLE_REC_HDR || r->block_at == UINT64_MAX || memcmp(p + 8, zero, 16) != 0)
        return fail(r, -EBADMSG, "damaged: body record %" PRIu64 " in block %" PRIu64, no,
                    r->block_no);
    const unsigned char *v = p + KC__BUNDLE_REC_HDR;
    uint64_t raw, dict;
    int codec;
    kc_digest d = kc_digest_of(v, (size_t)n), want;
    kc__digest_decode(p + 24, &want);
    if (kc__body_info(v, (size_t)n, &raw, &codec, &dict) != 0 || raw / KC__BUNDLE_MAX_RATIO > n ||
        d.lo != want.lo || d.hi != want.hi)
        return fail(r, -EBADMSG,
                    "damaged: body record %" PRIu64 " is not the body its digest names", no);
    if (dict != 0 && !kc__bundle_reader_has_dict(r, dict))
        return fail(r, -EBADMSG,
                    "damaged: body record %" PRIu64 " names a dictionary the header lacks", no);
    if (body_find(r, p + 24) != NULL)
        return fail(r, -EBADMSG, "damaged: body record %" PRIu64 " is there twice", no);
    struct kc__bodyref b = {.raw = raw, .len = n, .at = r->block_at + (uint64_t)(v - r->raw)};
    memcpy(b.digest, p + 24, 16);
    if (r->check_bodies) {
        char *plain = NULL;
        size_t pl = 0;
        int rc = kc__body_decode(v, (size_t)n, &r->dicts, &plain, &pl);
        if (rc == -ENOMEM)
            return fail(r, rc, "out of memory");
        if (rc != 0) {
            free(plain);
            return fail(r, -EBADMSG, "damaged: body record %" PRIu64 " does not inflate", no);
        }
        b.xxh = kc__body_xxh(plain, pl);
        free(plain);
    }
    if (body_add(r, &b) != 0)
        return fail(r, -ENOMEM, "out of memory");
    return 0;
}

int kc__bundle_reader_next(struct kc__bundle_reader *r, struct kc__sp_put *sp,
                           const unsigned char **put, size_t *len, size_t *ns_index)
{
    if (r->done)
        return 0;
again:
    while (r->block_left == 0) {
        if (r->raw_pos != r->raw_len)
            return fail(r, -EBADMSG, "damaged: block %" PRIu64 " holds bytes past its records",
                        r->block_no);
        const unsigned char *m;
        int rc = kc__bs_peek(&r->s, 8, &m);
        if (rc == -ENODATA)
            return fail(r, -EBADMSG,
                        "truncated: the bundle ends at byte %" PRIu64 " without its trailer",
                        r->s.off + (r->s.len - r->s.pos));
        if (rc < 0)
            return fail(r, rc, "cannot read the bundle: %s", strerror(-rc));
        if (memcmp(m, KC__BUNDLE_TRAILER_MAGIC, 8) == 0) {
            rc = read_trailer(r);
            return rc < 0 ? rc : 0;
        }
        if (memcmp(m, KC__BUNDLE_BLOCK_MAGIC, 8) != 0)
            return fail(r, -EBADMSG, "damaged: no block or trailer at byte %" PRIu64, r->s.off);
        rc = read_block(r);
        if (rc < 0)
            return rc;
    }
    uint64_t no = r->record_no + 1;
    const unsigned char *p = r->raw + r->raw_pos;
    size_t left = r->raw_len - r->raw_pos;
    if (left < KC__BUNDLE_REC_HDR)
        return fail(r, -EBADMSG, "damaged: entry %" PRIu64 " is cut short", no);
    uint64_t n = kc__get_u64(p);
    if ((n & KC__BUNDLE_REC_BODY) != 0 && r->info->version >= 3) {
        int rc = read_body_record(r, p, left, n & ~KC__BUNDLE_REC_BODY);
        if (rc < 0)
            return rc;
        r->raw_pos += KC__BUNDLE_REC_HDR + (size_t)(n & ~KC__BUNDLE_REC_BODY);
        r->block_left--;
        goto again; /* the entries come after their bodies */
    }
    if (n > left - KC__BUNDLE_REC_HDR)
        return fail(r, -EBADMSG,
                    "damaged: entry %" PRIu64 " declares %" PRIu64 " bytes, its block holds %zu",
                    no, n, left - KC__BUNDLE_REC_HDR);
    const unsigned char *file = p + KC__BUNDLE_REC_HDR;
    free(r->plain);
    r->plain = NULL;
    r->entry_stored = NULL;
    r->entry_stored_len = 0;
    r->entry_stored_at = UINT64_MAX;
    r->entry_detached = false;
    /* Layout 1 has plain bodies only; layout 3 adds entries naming a body
     * record. */
    bool stored = n > 4 && file[4] == KC__SP_STORED && r->info->version >= 2;
    bool detached = n > 4 && file[4] == KC__SP_ENTRY && r->info->version >= 3;
    if ((detached ? kc__spool_put_decode_entry(file, (size_t)n, sp)
         : stored ? kc__spool_put_decode_stored(file, (size_t)n, sp)
                  : kc__spool_put_decode(file, (size_t)n, sp)) != 0)
        return fail(r, -EBADMSG, "damaged: entry %" PRIu64 " is not a whole put record", no);
    /* What a bundle brings is the importer's as imported, whatever the
     * exporting store recorded: never this node's own compile. */
    sp->hdr.prov = KC_PROV(KC_PROV_IMPORTED, 0);
    if (detached) {
        const struct kc__bodyref *b = body_find(r, p + 24);
        if (b == NULL)
            return fail(r, -EBADMSG,
                        "damaged: entry %" PRIu64 " in %s names a body the bundle does not hold "
                        "before it",
                        no, sp->ns);
        if (b->raw != sp->hdr.body_size || (r->check_bodies && b->xxh != sp->hdr.body_xxh))
            return fail(r, -EBADMSG,
                        "damaged: entry %" PRIu64 " in %s: its body is not the one its header "
                        "describes",
                        no, sp->ns);
        r->entry_detached = true;
        r->entry_stored_at = b->at;
        r->entry_stored_len = (size_t)b->len;
    }
    if (stored) {
        /* Its body as the store keeps it: a frame that states the header's
         * size, within KC__BUNDLE_MAX_RATIO of its own (an inflation bomb
         * is refused before anything is allocated for it), and inflates to
         * the body the header describes. */
        uint64_t raw, dict;
        int codec;
        if (kc__body_info(sp->body, sp->body_len, &raw, &codec, &dict) != 0 ||
            codec == KC__BODY_LEGACY || raw != sp->hdr.body_size ||
            raw / KC__BUNDLE_MAX_RATIO > sp->body_len)
            return fail(r, -EBADMSG,
                        "damaged: entry %" PRIu64 " in %s: its body is not a stored body of "
                        "the size its header declares",
                        no, sp->ns);
        if (dict != 0 && !kc__bundle_reader_has_dict(r, dict))
            return fail(r, -EBADMSG,
                        "damaged: entry %" PRIu64 " in %s: its body names a dictionary the "
                        "header lacks",
                        no, sp->ns);
        r->entry_stored = sp->body;
        r->entry_stored_len = sp->body_len;
        r->entry_stored_at =
            r->block_at == UINT64_MAX ? UINT64_MAX : r->block_at + (uint64_t)(sp->body - r->raw);
        if (!r->check_bodies) {
            sp->body = NULL;
            sp->body_len = 0;
        } else {
            char *b = NULL;
            size_t bl = 0;
            int rc = kc__body_decode(r->entry_stored, r->entry_stored_len, &r->dicts, &b, &bl);
            if (rc == -ENOMEM)
                return fail(r, rc, "out of memory");
            if (rc != 0 || kc__body_xxh(b, bl) != sp->hdr.body_xxh) {
                free(b);
                return fail(r, -EBADMSG,
                            "damaged: entry %" PRIu64 " in %s: its body does not inflate to "
                            "the one its header describes",
                            no, sp->ns);
            }
            r->plain = b;
            sp->body = (const unsigned char *)b;
            sp->body_len = bl;
        }
    }
    r->entry_digest = p + 24;
    unsigned char kk[KC__NS_MAX + 1 + KC__KEY_LEN];
    kc_digest name = kc_digest_of(kk, kc__kkey(sp->ns, &sp->key, kk)), want;
    kc__digest_decode(p + 8, &want);
    if (name.lo != want.lo || name.hi != want.hi)
        return fail(r, -EBADMSG,
                    "entry %" PRIu64 " in %s: its key does not match the name it is filed under",
                    no, sp->ns);
    /* The digest names the body as the store keeps it: the stored bytes,
     * or the plain body of a 'P' put (which is how it is kept); a body
     * record's was checked when it was read. */
    kc_digest bd = detached ? (kc_digest){0}
                   : stored ? kc_digest_of(r->entry_stored, r->entry_stored_len)
                            : kc_digest_of(sp->body, sp->body_len);
    kc__digest_decode(p + 24, &want);
    if (!detached && (bd.lo != want.lo || bd.hi != want.hi))
        return fail(r, -EBADMSG, "entry %" PRIu64 " in %s: its body does not match its digest", no,
                    sp->ns);
    size_t i = kc__nsindex_find(&r->ns_index, r->info->ns, sp->ns);
    if (i >= r->info->n_ns)
        return fail(r, -EBADMSG, "entry %" PRIu64 " is in namespace %s, which the header lacks", no,
                    sp->ns);
    if (no > r->info->entries || r->ns_entries[i] >= r->info->ns[i].entries)
        return fail(r, -EBADMSG,
                    "damaged: more entries than the header declares (entry %" PRIu64 " in %s)", no,
                    sp->ns);
    /* The header counts every entry as its plain put (a stored body at its
     * inflated size). */
    uint64_t plain = KC__BUNDLE_REC_SIZE(
        detached ? n + sp->hdr.body_size
                 : n - r->entry_stored_len + (r->entry_stored != NULL ? sp->hdr.body_size : 0));
    r->ns_entries[i]++;
    r->ns_bytes[i] += plain;
    r->seen_raw += plain;
    r->raw_pos += KC__BUNDLE_REC_HDR + (size_t)n;
    r->block_left--;
    r->record_no = no;
    if (put != NULL)
        *put = file;
    if (len != NULL)
        *len = (size_t)n;
    if (ns_index != NULL)
        *ns_index = i;
    return 1;
}

void kc__bundle_reader_free(struct kc__bundle_reader *r)
{
    kc__bs_free(&r->s);
    free(r->bodies);
    kc__dicts_free(&r->dicts);
    free(r->dict);
    free(r->dict_data);
    free(r->plain);
    free(r->stored);
    free(r->raw);
    free(r->ns_entries);
    free(r->ns_bytes);
    kc__nsindex_free(&r->ns_index);
    if (r->zdctx != NULL)
        ZSTD_freeDCtx(r->zdctx);
    memset(r, 0, sizeof *r);
}

int kc__bundle_trailer_peek(const unsigned char *t, struct kc_bundle_info *info)
{
    if (memcmp(t, KC__BUNDLE_TRAILER_MAGIC, 8) != 0 || memcmp(t + 168, KC__BUNDLE_END_MAGIC, 8) ||
        kc__get_u64(t + 160) != XXH3_64bits(t, 160))
        return -EBADMSG;
    info->entries = kc__get_u64(t + 8);
    info->blocks = kc__get_u64(t + 16);
    info->is_signed = (kc__get_u32(t + 48) & KC__BUNDLE_SIGNED) != 0;
    info->key_id = kc__get_u64(t + 56);
    return 0;
}
