/*
 * store-bench: fills a store with artifacts of realistic sizes (1-64 KB,
 * log-normal, median ~8 KB, mean ~10 KB: a million entries are ~10 GB) and
 * measures random gets.
 *
 *   store-bench [--entries N] [--dir D] [--gets G] [--corpus DIR] [--keep] [--bulk]
 *               [--no-fill] [--no-stats]
 *
 * --corpus DIR takes the records' bytes from the real artifacts in DIR (the
 * demo set's PTX and cubins, as scripts/bench saves them): each record is a
 * slice of one, from a random offset, continued with the start of others
 * until it has its size, and tagged with its index on its first line, so
 * no two are alike and each compresses as real artifacts do. Without it the
 * records are PTX-like text (ptxgen.h).
 *
 * --no-fill measures an existing store (--dir, filled by an earlier run
 * with the same --entries) without filling it again. --no-stats skips the
 * walk of every entry that sizes the store (disk_bytes is then 0), so a
 * profile of the run shows the gets alone.
 *
 * --bulk writes the spool files put() writes, directly (without the
 * process's bookkeeping of its own pending puts, which a million entries
 * would fill).
 *
 * Before the timed gets every file of the store is read once (the fill
 * evicts part of a large store from the page cache); resident_before says
 * how much of it was cached.
 *
 * Prints one line per measure, `name value unit`, then a summary line:
 *   store-bench: entries=N get_p50_us=.. get_p99_us=.. raw_bytes=.. disk_bytes=.. ratio=..
 *                fresh_hit_us=.. resident_before_pct=..
 * ratio is raw/disk; fresh_* are a new process's first hit through RocksDB
 * (store-first: dlopen of the library, its database tier opened, one get),
 * the median of 9 runs. The timed gets go through the database tier too.
 * Without --dir it uses a fresh temp directory and removes it afterwards.
 */
#include "local.h"
#include "ptxgen.h"
#include "store.h"
#include "tier.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* An artifact's size: log-normal around 8 KB (sigma 0.66, so the mean is
 * ~10 KB), kept within 1..64 KB. */
static size_t artifact_size(uint64_t *s)
{
    double u1 = ((double)(ptxgen_next(s) >> 11) + 1.0) / 9007199254740993.0;
    double u2 = (double)(ptxgen_next(s) >> 11) / 9007199254740992.0;
    double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
    double v = 8192.0 * exp(0.66 * z);
    return v < 1024.0 ? 1024 : v > 65536.0 ? 65536 : (size_t)v;
}

/* Real artifacts, sorted by file name so a run is reproducible. */
struct artifact {
    char *path;
    unsigned char *data;
    size_t len;
};
struct corpus {
    struct artifact *a;
    size_t n;
};

static void corpus_add(const char *path, void *arg)
{
    struct corpus *c = arg;
    struct artifact f = {0};
    struct artifact *grown = realloc(c->a, (c->n + 1) * sizeof *grown);
    if (grown == NULL)
        return;
    c->a = grown;
    if (kc__read_file(AT_FDCWD, path, 64u << 20, &f.data, &f.len) != 0 || f.len == 0 ||
        (f.path = strdup(path)) == NULL) {
        free(f.data);
        return;
    }
    c->a[c->n++] = f;
}

static int cmp_artifact(const void *x, const void *y)
{
    return strcmp(((const struct artifact *)x)->path, ((const struct artifact *)y)->path);
}

static char *corpus_record(const struct corpus *c, uint64_t i, size_t len)
{
    unsigned char *out = malloc(len);
    if (out == NULL)
        return NULL;
    uint64_t s = i * 0x2545f4914f6cdd1dull + 7;
    size_t f = ptxgen_next(&s) % c->n, off = ptxgen_next(&s) % c->a[f].len, n = 0;
    while (n < len) {
        size_t take = c->a[f].len - off < len - n ? c->a[f].len - off : len - n;
        memcpy(out + n, c->a[f].data + off, take);
        n += take;
        f = ptxgen_next(&s) % c->n;
        off = 0;
    }
    char tag[40];
    int t = snprintf(tag, sizeof tag, "// record %016llx\n", (unsigned long long)i);
    memcpy(out, tag, (size_t)t < len ? (size_t)t : len);
    return (char *)out;
}

static kc_key key_of(uint64_t i)
{
    return (kc_key){.id = {.lo = i * 0x9e3779b97f4a7c15ull, .hi = i}, .build = 1};
}

/* A put file as st_put writes it, without the pending-put bookkeeping. */
static int bulk_put(const char *dir, const char *ns, const kc_key *key, const void *body,
                    size_t len)
{
    static uint64_t created;
    struct kc__hdr h = {0};
    h.kind = KC_KIND_NVRTC;
    h.format = KC_FORMAT_VERSION;
    h.body_size = len;
    h.saved_ns = 1000000;
    h.body_xxh = kc__body_xxh(body, len);
    h.created_ns = kc_wall_ns();
    if (h.created_ns <= created)
        h.created_ns = created + 1;
    created = h.created_ns;
    struct kc__buf b = {0};
    int rc = kc__spool_put_encode(&b, ns, key, NULL, &h, body, len);
    char name[40], spool[4200];
    kc__spool_name(ns, key, 'p', name);
    snprintf(spool, sizeof spool, "%s/spool", dir);
    if (rc == 0)
        rc = kc__spool_write(spool, name, b.p, b.len, false);
    kc__buf_free(&b);
    return rc;
}

/* Page-cache state of the store before the timed gets. The fill writes
 * many times the store's size through the page cache (spool files, then
 * compactions), and right after a million-entry fill a sixth of the
 * tables had been evicted: random gets then measured the disk as much as
 * the store. Every size is measured warm, as the 1k store always is:
 * each file under db/ and hot/ is read once. Returns the percentage of
 * their pages that were resident before. */
struct warm {
    uint64_t pages, resident;
};

static void warm_file(const char *path, void *arg)
{
    struct warm *w = arg;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
        size_t len = (size_t)st.st_size, pg = (size_t)sysconf(_SC_PAGESIZE);
        size_t n = (len + pg - 1) / pg;
        void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
        unsigned char *vec = malloc(n);
        if (m != MAP_FAILED && vec != NULL && mincore(m, len, vec) == 0) {
            for (size_t i = 0; i < n; i++)
                w->resident += vec[i] & 1;
            w->pages += n;
        }
        free(vec);
        if (m != MAP_FAILED)
            munmap(m, len);
        static char buf[1 << 20];
        while (read(fd, buf, sizeof buf) > 0) {
        }
    }
    close(fd);
}

static double warm_store(const char *dir)
{
    struct warm w = {0};
    const char *sub[] = {"db", "hot"};
    for (size_t i = 0; i < sizeof sub / sizeof sub[0]; i++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", dir, sub[i]);
        kc__each_child(p, warm_file, &w);
    }
    return w.pages ? 100.0 * (double)w.resident / (double)w.pages : 100.0;
}

int main(int argc, char **argv)
{
    uint64_t entries = 10000, gets = 2000;
    const char *dir = NULL, *corpus_dir = NULL;
    int keep = 0, bulk = 0, nofill = 0, nostats = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--entries") == 0 && i + 1 < argc)
            entries = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--gets") == 0 && i + 1 < argc)
            gets = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc)
            dir = argv[++i];
        else if (strcmp(argv[i], "--corpus") == 0 && i + 1 < argc)
            corpus_dir = argv[++i];
        else if (strcmp(argv[i], "--keep") == 0)
            keep = 1;
        else if (strcmp(argv[i], "--bulk") == 0)
            bulk = 1;
        else if (strcmp(argv[i], "--no-fill") == 0)
            nofill = 1;
        else if (strcmp(argv[i], "--no-stats") == 0)
            nostats = 1;
        else {
            fprintf(stderr, "usage: store-bench [--entries N] [--gets G] [--dir D] [--corpus DIR] "
                            "[--keep] [--bulk] [--no-fill] [--no-stats]\n");
            return 2;
        }
    }
    struct corpus corpus = {0};
    if (corpus_dir != NULL) {
        kc__each_child(corpus_dir, corpus_add, &corpus);
        qsort(corpus.a, corpus.n, sizeof *corpus.a, cmp_artifact);
        if (corpus.n == 0) {
            fprintf(stderr, "store-bench: no artifact in %s\n", corpus_dir);
            return 2;
        }
    }
    char tmp[] = "/tmp/kc-bench-XXXXXX";
    if (dir == NULL) {
        if (mkdtemp(tmp) == NULL)
            return 1;
        dir = tmp;
    } else {
        keep = 1;
    }
    if (nofill && dir == tmp) {
        fprintf(stderr, "store-bench: --no-fill needs --dir\n");
        return 2;
    }
    const struct kc_store_api *S = kc_store_api();
    const struct kc_store_ops *api = S->ops;
    const struct kc_store_admin *adm = kc_store_admin();
    const char *NS = "bench/sm_90";
    struct kc_store_options o = {.dir = dir, .max_size = 1ull << 40, .tool = "/bin/true"};
    struct kc_store *st;
    int rc = S->open(&o, &st);
    if (rc < 0) {
        fprintf(stderr, "store-bench: open %s: %s\n", dir, strerror(-rc));
        return 1;
    }

    /* Fill, draining in-process as we go (the owner's work, timed apart). */
    uint64_t raw = 0, t0 = now_ns(), put_ns = 0, drain_ns = 0;
    uint64_t sz_seed = 12345;
    for (uint64_t i = 0; i < entries && !nofill; i++) {
        size_t len = artifact_size(&sz_seed);
        char *body = corpus.n ? corpus_record(&corpus, i, len) : ptxgen(i, len);
        if (body == NULL) {
            fprintf(stderr, "store-bench: out of memory\n");
            return 1;
        }
        kc_key k = key_of(i);
        uint64_t a = now_ns();
        rc = bulk ? bulk_put(dir, NS, &k, body, len)
                  : api->put(st, NS, &k, NULL, KC_KIND_NVRTC, body, len, 1000000);
        put_ns += now_ns() - a;
        free(body);
        if (rc < 0) {
            fprintf(stderr, "store-bench: put: %s\n", strerror(-rc));
            return 1;
        }
        raw += len;
        if ((i + 1) % (bulk ? 20000 : 2000) == 0 || i + 1 == entries) {
            a = now_ns();
            rc = adm->drain(st, 30000);
            drain_ns += now_ns() - a;
            if (rc < 0) {
                fprintf(stderr, "store-bench: drain: %s\n", strerror(-rc));
                return 1;
            }
        }
    }
    uint64_t fill_ns = now_ns() - t0;
    api->close(st);

    /* A fresh process's first hit: store-first dlopen()s the library as the
     * shim does, opens the store and gets one key. Median of a few runs. */
    enum { FRESH = 9 };
    double fr[FRESH][4];
    int nfr = 0;
    uint64_t fs = 4242;
    for (int r = 0; r < FRESH && entries > 0 && !nofill; r++) {
        uint64_t i = ptxgen_next(&fs) % entries;
        kc_key k = key_of(i);
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' '%s' %" PRIu64 " %" PRIu64 " %" PRIu64,
                 STORE_FIRST, STORE_LIB, dir, NS, k.id.lo, k.id.hi, k.build);
        FILE *p = popen(cmd, "r");
        if (p == NULL)
            break;
        double a, b, c, d;
        int prc;
        if (fscanf(p, "first dlopen_us=%lf open_us=%lf get_us=%lf total_us=%lf rc=%d", &a, &b, &c,
                   &d, &prc) == 5 &&
            prc == 0) {
            fr[nfr][0] = a;
            fr[nfr][1] = b;
            fr[nfr][2] = c;
            fr[nfr][3] = d;
            nfr++;
        }
        pclose(p);
    }
    double fresh[4] = {0, 0, 0, 0};
    for (int j = 0; j < 4 && nfr > 0; j++) {
        double v[FRESH];
        for (int r = 0; r < nfr; r++)
            v[r] = fr[r][j];
        qsort(v, (size_t)nfr, sizeof v[0], cmp_double);
        fresh[j] = v[nfr / 2];
    }

    double resident = warm_store(dir);

    /* A fresh database tier, as a new process would have: the secondary
     * opens on the first get (timed apart), then random gets, each through
     * RocksDB (the store's own get serves those with a hot file from
     * DIR/hot, its local tier). */
    rc = S->open(&o, &st);
    struct kc_tier *db = NULL;
    if (rc < 0 || S->db_tier_open(&o, &db) < 0)
        return 1;
    uint64_t *lat = calloc(gets ? gets : 1, sizeof *lat);
    uint64_t s = 99, first_ns = 0;
    for (uint64_t g = 0; g <= gets; g++) {
        uint64_t i = entries ? ptxgen_next(&s) % entries : 0;
        kc_key k = key_of(i);
        void *b = NULL;
        size_t n = 0;
        uint64_t a = now_ns();
        rc = db->ops->get(db, NS, &k, &b, &n, NULL);
        uint64_t dt = now_ns() - a;
        if (rc < 0 && entries > 0) {
            fprintf(stderr, "store-bench: get %" PRIu64 ": %s\n", i, strerror(-rc));
            return 1;
        }
        api->free(b);
        if (g == 0)
            first_ns = dt;
        else
            lat[g - 1] = dt;
    }
    qsort(lat, gets, sizeof *lat, cmp_u64);
    double p50 = gets ? lat[gets / 2] / 1000.0 : 0, p99 = gets ? lat[gets * 99 / 100] / 1000.0 : 0;
    struct kc_store_stats *stt;
    uint64_t disk = 0, unique = 0;
    if (!nostats && adm->stats(st, &stt) == 0) {
        disk = stt->disk_bytes;
        unique = stt->unique_bytes;
        adm->stats_free(stt);
    }
    db->ops->close(db);
    api->close(st);

    printf("entries %" PRIu64 "\n", entries);
    printf("fill %.2f s\n", fill_ns / 1e9);
    printf("put_mean %.1f us\n", entries ? put_ns / 1e3 / (double)entries : 0);
    printf("drain_total %.2f s\n", drain_ns / 1e9);
    printf("first_get %.1f us\n", first_ns / 1e3);
    printf("fresh_dlopen %.1f us\n", fresh[0]);
    printf("fresh_open %.1f us\n", fresh[1]);
    printf("fresh_first_get %.1f us\n", fresh[2]);
    printf("fresh_total %.1f us\n", fresh[3]);
    printf("resident_before %.1f %%\n", resident);
    printf("get_p50 %.1f us\n", p50);
    printf("get_p99 %.1f us\n", p99);
    printf("raw_bytes %" PRIu64 " B\n", raw);
    printf("unique_bytes %" PRIu64 " B\n", unique);
    printf("disk_bytes %" PRIu64 " B\n", disk);
    /* Where the bytes on disk are: RocksDB's files, the hot files. */
    char sub[4200];
    uint64_t reserved;
    snprintf(sub, sizeof sub, "%s/db", dir);
    uint64_t db_bytes = nostats ? 0 : kc__du(sub, &reserved);
    snprintf(sub, sizeof sub, "%s/hot", dir);
    uint64_t hot_bytes = nostats ? 0 : kc__du(sub, &reserved);
    printf("db_bytes %" PRIu64 " B\n", db_bytes);
    printf("hot_bytes %" PRIu64 " B\n", hot_bytes);
    printf("corpus_files %zu\n", corpus.n);
    printf("store-bench: entries=%" PRIu64 " get_p50_us=%.1f get_p99_us=%.1f raw_bytes=%" PRIu64
           " disk_bytes=%" PRIu64 " ratio=%.2f fresh_hit_us=%.1f resident_before_pct=%.1f"
           " corpus_files=%zu db_bytes=%" PRIu64 " hot_bytes=%" PRIu64 "\n",
           entries, p50, p99, raw, disk, disk ? (double)raw / (double)disk : 0.0, fresh[3],
           resident, corpus.n, db_bytes, hot_bytes);
    free(lat);
    if (!keep) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            return 1;
    }
    return 0;
}
