/*
 * why.c: `kcache why`: for a recent miss, the input that made it one. The
 * shim writes a record of each miss's inputs (common/why.h); this compares
 * a miss with the nearest earlier record of the same library and program
 * name (fewest inputs differing, the latest first) and names what
 * differs; another program's record is no explanation of a miss.
 */
#include "why.h"

#include "../common/why.h"
#include "cli.h"
#include "help.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A record's inputs indexed once, so that comparing two records costs
 * O(n log n) in their inputs, never a scan of one record per input of the
 * other: `kcache why --last N` compares each miss with every earlier
 * record of its library. */
enum { KEYED, OPTION, EXPRESSION }; /* an input's class: by (kind, name), or a list */

struct idx {
    const struct kc_why_rec *r;
    unsigned char *cls;     /* per input: KEYED, OPTION or EXPRESSION */
    size_t *keyed, nk;      /* the keyed inputs by (kind, name), then position */
    size_t *list[3], nl[3]; /* each list's inputs by (digest, position) */
};

static int cls_of(const char *kind)
{
    return strcmp(kind, "option") == 0       ? OPTION
           : strcmp(kind, "expression") == 0 ? EXPRESSION
                                             : KEYED;
}

/* (qsort has no argument: the record whose positions are sorted) */
static const struct kc_why_rec *sorting;

static int by_kind_name(const void *x, const void *y)
{
    size_t i = *(const size_t *)x, j = *(const size_t *)y;
    int c = strcmp(sorting->in[i].kind, sorting->in[j].kind);
    if (c == 0)
        c = strcmp(sorting->in[i].name, sorting->in[j].name);
    return c != 0 ? c : i < j ? -1 : i > j;
}

static int by_digest(const void *x, const void *y)
{
    size_t i = *(const size_t *)x, j = *(const size_t *)y;
    int c = strcmp(sorting->in[i].digest, sorting->in[j].digest);
    return c != 0 ? c : i < j ? -1 : i > j;
}

static void idx_free(struct idx *x)
{
    free(x->cls);
    free(x->keyed);
    for (int k = 0; k < 3; k++)
        free(x->list[k]);
    memset(x, 0, sizeof *x);
}

/* Indexes r: 0, or -ENOMEM. */
static int idx_make(const struct kc_why_rec *r, struct idx *x)
{
    memset(x, 0, sizeof *x);
    x->r = r;
    size_t n = r->n ? r->n : 1;
    x->cls = malloc(n);
    x->keyed = malloc(n * sizeof *x->keyed);
    for (int k = OPTION; k <= EXPRESSION; k++)
        x->list[k] = malloc(n * sizeof *x->list[k]);
    if (x->cls == NULL || x->keyed == NULL || x->list[OPTION] == NULL ||
        x->list[EXPRESSION] == NULL) {
        idx_free(x);
        return -ENOMEM;
    }
    for (size_t i = 0; i < r->n; i++) {
        int c = cls_of(r->in[i].kind);
        x->cls[i] = (unsigned char)c;
        if (c == KEYED)
            x->keyed[x->nk++] = i;
        else
            x->list[c][x->nl[c]++] = i;
    }
    sorting = r;
    qsort(x->keyed, x->nk, sizeof *x->keyed, by_kind_name);
    for (int k = OPTION; k <= EXPRESSION; k++)
        qsort(x->list[k], x->nl[k], sizeof *x->list[k], by_digest);
    return 0;
}

/* x's first keyed input (lowest position) of (kind, name), or NULL. */
static const struct kc_why_input *find(const struct idx *x, const char *kind, const char *name)
{
    size_t lo = 0, hi = x->nk;
    while (lo < hi) { /* the first not below (kind, name) */
        size_t mid = lo + (hi - lo) / 2;
        const struct kc_why_input *in = &x->r->in[x->keyed[mid]];
        int c = strcmp(in->kind, kind);
        if (c == 0)
            c = strcmp(in->name, name);
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == x->nk)
        return NULL;
    const struct kc_why_input *in = &x->r->in[x->keyed[lo]];
    return strcmp(in->kind, kind) == 0 && strcmp(in->name, name) == 0 ? in : NULL;
}

/* How many of x's inputs of list `k` have `digest`, and the position of
 * the first of them (*first; (size_t)-1 when none). */
static size_t count(const struct idx *x, int k, const char *digest, size_t *first)
{
    const size_t *v = x->list[k];
    size_t lo = 0, hi = x->nl[k];
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(x->r->in[v[mid]].digest, digest) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *first = lo < x->nl[k] && strcmp(x->r->in[v[lo]].digest, digest) == 0 ? v[lo] : (size_t)-1;
    size_t end = lo;
    while (end < x->nl[k] && strcmp(x->r->in[v[end]].digest, digest) == 0)
        end++;
    return end - lo;
}

struct diff {
    const char *what; /* changed, added, removed, found, gone, order */
    const char *kind, *name;
    const char *then, *now;
};

/* The differences from e (earlier) to m, in the order they are reported:
 * into v (room for e->n + m->n + 2) when v is not NULL; their count. When
 * `stop` differences are found the count stops there (a bound the caller
 * need not pass: (size_t)-1). */
static size_t differ(const struct idx *xe, const struct idx *xm, struct diff *v, size_t stop)
{
    const struct kc_why_rec *e = xe->r, *m = xm->r;
    size_t n = 0;
#define PUT(...)                                                                                   \
    do {                                                                                           \
        if (v != NULL)                                                                             \
            v[n] = (struct diff){__VA_ARGS__};                                                     \
        if (++n >= stop)                                                                           \
            return n;                                                                              \
    } while (0)
    for (size_t i = 0; i < m->n; i++) {
        const struct kc_why_input *a = &m->in[i];
        if (xm->cls[i] != KEYED)
            continue; /* (below) */
        const struct kc_why_input *b = find(xe, a->kind, a->name);
        if (b == NULL)
            PUT("added", a->kind, a->name, NULL, a->shown);
        else if (strcmp(a->digest, b->digest) != 0) {
            const char *w = "changed";
            if (strcmp(a->kind, "file") == 0 && strcmp(b->shown, "absent") == 0)
                w = "found";
            else if (strcmp(a->kind, "file") == 0 && strcmp(a->shown, "absent") == 0)
                w = "gone";
            PUT(w, a->kind, a->name, b->shown, a->shown);
        }
    }
    for (size_t i = 0; i < e->n; i++) {
        const struct kc_why_input *b = &e->in[i];
        if (xe->cls[i] == KEYED && find(xm, b->kind, b->name) == NULL)
            PUT("removed", b->kind, b->name, b->shown, NULL);
    }
    /* Options and name expressions: as lists (one added, one removed, or
     * the same ones in another order). */
    static const char *const kinds[] = {[OPTION] = "option", [EXPRESSION] = "expression"};
    for (int k = OPTION; k <= EXPRESSION; k++) {
        size_t before = n, first;
        for (size_t i = 0; i < m->n; i++) {
            const struct kc_why_input *a = &m->in[i];
            if (xm->cls[i] != k)
                continue;
            size_t in_m = count(xm, k, a->digest, &first);
            if (first == i && in_m > count(xe, k, a->digest, &(size_t){0}))
                PUT("added", kinds[k], "", NULL, a->shown);
        }
        for (size_t i = 0; i < e->n; i++) {
            const struct kc_why_input *b = &e->in[i];
            if (xe->cls[i] != k)
                continue;
            size_t in_e = count(xe, k, b->digest, &first);
            if (first == i && in_e > count(xm, k, b->digest, &(size_t){0}))
                PUT("removed", kinds[k], "", b->shown, NULL);
        }
        if (n == before) { /* the same ones: in the same order? */
            size_t ia = 0, ib = 0;
            bool same = true;
            while (same) {
                while (ia < m->n && xm->cls[ia] != k)
                    ia++;
                while (ib < e->n && xe->cls[ib] != k)
                    ib++;
                if (ia == m->n || ib == e->n)
                    break;
                same = strcmp(m->in[ia++].digest, e->in[ib++].digest) == 0;
            }
            if (!same)
                PUT("order", kinds[k], "", NULL, NULL);
        }
    }
#undef PUT
    return n;
}

/* The nearest earlier record of x[at]'s library and program name (fewest
 * differences, the latest), or NULL. The latest are compared first
 * and each comparison stops once it cannot win, so a store of many
 * similar records costs little more than one comparison per record. */
static const struct idx *nearest(const struct idx *x, size_t at)
{
    const struct kc_why_rec *m = x[at].r;
    const struct idx *best = NULL;
    size_t best_score = (size_t)-1;
    for (size_t i = at; i-- > 0 && best_score > 0;) {
        const struct kc_why_rec *e = x[i].r;
        if (strcmp(e->backend, m->backend) != 0 || strcmp(e->name, m->name) != 0 ||
            e->time > m->time)
            continue;
        /* One that cannot beat the best (nd < best_score) stops being
         * counted. */
        size_t stop = best_score;
        size_t nd = differ(&x[i], &x[at], NULL, stop);
        if (nd >= stop)
            continue;
        size_t score = nd;
        if (score < best_score) /* (strictly: the latest wins a tie) */
            best = &x[i], best_score = score;
    }
    return best;
}

static const char *when(uint64_t ns, char *buf, size_t len)
{
    time_t t = (time_t)(ns / 1000000000u);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm);
    return buf;
}

static const char *label(const char *kind)
{
    if (strcmp(kind, "file") == 0)
        return "header file";
    if (strcmp(kind, "header") == 0)
        return "in-memory header";
    if (strcmp(kind, "source") == 0)
        return "the source";
    if (strcmp(kind, "program") == 0)
        return "the program's name";
    if (strcmp(kind, "cwd") == 0)
        return "the working directory";
    if (strcmp(kind, "kcache") == 0)
        return "kcache's build";
    return kind;
}

/* One difference, every text of it from the records escaped. */
static void say(FILE *f, const struct diff *d)
{
    char a[KC_TOOL_PRINTABLE_MAX], b[KC_TOOL_PRINTABLE_MAX], nm[KC_TOOL_PRINTABLE_MAX];
    char kd[KC_TOOL_PRINTABLE_MAX];
    kc_tool_printable(d->name, nm, sizeof nm);
    kc_tool_printable(d->then ? d->then : "", a, sizeof a);
    kc_tool_printable(d->now ? d->now : "", b, sizeof b);
    const char *kind = kc_tool_printable(label(d->kind), kd, sizeof kd);
    const char *sep = d->name[0] ? " " : "";
    if (strcmp(d->what, "order") == 0)
        fprintf(f, "    the %ss are the same, in another order\n", d->kind);
    else if (strcmp(d->what, "found") == 0)
        fprintf(f, "    %s%s%s: now found (%s), absent before\n", kind, sep, nm, b);
    else if (strcmp(d->what, "gone") == 0)
        fprintf(f, "    %s%s%s: now absent, found before (%s)\n", kind, sep, nm, a);
    else if (strcmp(d->what, "added") == 0)
        fprintf(f, "    %s%s%s added: %s\n", kind, sep, nm, b);
    else if (strcmp(d->what, "removed") == 0)
        fprintf(f, "    %s%s%s removed: %s\n", kind, sep, nm, a);
    else if (strcmp(d->kind, "file") == 0 || strcmp(d->kind, "header") == 0 ||
             strcmp(d->kind, "source") == 0 || strcmp(d->kind, "input") == 0)
        fprintf(f, "    %s%s%s: its content changed (%s then, %s now)\n", kind, sep, nm, a, b);
    else
        fprintf(f, "    %s%s%s: %s then, %s now\n", kind, sep, nm, a, b);
}

/* `in` is whether e's entry is still in the store (kc_tool_in_store_fn). */
static const char *cause_of(const struct kc_why_rec *e, size_t nd, int in)
{
    if (e == NULL)
        return "first";
    if (nd > 0)
        return "differs";
    if (strcmp(e->stored, "1") != 0)
        return "not-stored";
    return in == 1 ? "in-the-store" : "left-the-store";
}

static void report(FILE *f, const struct kc_why_rec *m, const struct kc_why_rec *e,
                   const struct diff *d, size_t nd, bool json, bool first, int in)
{
    char t[64], nm[KC_TOOL_PRINTABLE_MAX], st[KC_TOOL_PRINTABLE_MAX];
    char be[KC_TOOL_PRINTABLE_MAX], key[KC_TOOL_PRINTABLE_MAX];
    const char *cause = cause_of(e, nd, in);
    if (json) {
        fprintf(f, "%s\n  {\"backend\": ", first ? "" : ",");
        kc_tool_json_str(f, m->backend);
        fprintf(f, ", \"name\": ");
        kc_tool_json_str(f, m->name);
        fprintf(f, ", \"time_ns\": %llu, \"pid\": %ld, \"key\": ", (unsigned long long)m->time,
                m->pid);
        kc_tool_json_str(f, m->key);
        fprintf(f, ", \"compile_ms\": %.3f, \"stored\": ", m->compile_ms);
        kc_tool_json_str(f, m->stored);
        fprintf(f, ", \"remote_refused\": %llu, \"cause\": \"%s\"",
                (unsigned long long)m->remote_refused, cause);
        if (e != NULL) {
            fprintf(f, ", \"nearest\": {\"time_ns\": %llu, \"pid\": %ld, \"key\": ",
                    (unsigned long long)e->time, e->pid);
            kc_tool_json_str(f, e->key);
            fprintf(f, ", \"stored\": ");
            kc_tool_json_str(f, e->stored);
            fprintf(f, "}");
        }
        fprintf(f, ", \"differences\": [");
        for (size_t i = 0; i < nd; i++) {
            fprintf(f, "%s{\"what\": \"%s\", \"kind\": ", i ? ", " : "", d[i].what);
            kc_tool_json_str(f, d[i].kind);
            fprintf(f, ", \"name\": ");
            kc_tool_json_str(f, d[i].name);
            fprintf(f, ", \"then\": ");
            if (d[i].then)
                kc_tool_json_str(f, d[i].then);
            else
                fputs("null", f);
            fprintf(f, ", \"now\": ");
            if (d[i].now)
                kc_tool_json_str(f, d[i].now);
            else
                fputs("null", f);
            fputc('}', f);
        }
        fprintf(f, "]}");
        return;
    }
    /* (the key's first 16 characters, as they were written, escaped) */
    snprintf(st, sizeof st, "%.16s", m->key);
    fprintf(f, "%s miss: \"%s\" at %s (pid %ld), compiled in %.1f ms, key %s\n",
            kc_tool_printable(m->backend, be, sizeof be), kc_tool_printable(m->name, nm, sizeof nm),
            when(m->time, t, sizeof t), m->pid, m->compile_ms,
            kc_tool_printable(st, key, sizeof key));
    if (strcmp(m->stored, "1") != 0)
        fprintf(f, "  not stored: %s\n", kc_tool_printable(m->stored, st, sizeof st));
    if (m->remote_refused > 0)
        fprintf(f,
                "  the remote offered %llu entries this lookup refused: unsigned, or signed by "
                "a key not in KCACHE_REMOTE_TRUSTED_KEYS (check with kcache remote ping)\n",
                (unsigned long long)m->remote_refused);
    if (e == NULL) {
        fprintf(f,
                "  its first compile: no earlier %s compile of \"%s\" is recorded in this "
                "store (the last %d misses are kept)\n",
                be, nm, KC_WHY_KEEP);
        return;
    }
    snprintf(st, sizeof st, "%.16s", e->key);
    fprintf(f, "  the nearest earlier compile: \"%s\" at %s (pid %ld), key %s\n",
            kc_tool_printable(e->name, nm, sizeof nm), when(e->time, t, sizeof t), e->pid,
            kc_tool_printable(st, key, sizeof key));
    if (nd == 0) {
        if (strcmp(e->stored, "1") == 0 && in == 1)
            fprintf(f,
                    "  the same inputs, and its entry is still in the store (kcache show %s): "
                    "it was not served to this call\n",
                    kc_tool_printable(st, key, sizeof key));
        else if (strcmp(e->stored, "1") == 0)
            fprintf(f,
                    "  the same inputs: its entry has left the store since (evicted past "
                    "KCACHE_MAXSIZE, kcache gc or kcache clear)%s\n",
                    in < 0 ? " (the store could not be read to check)" : "");
        else
            fprintf(f, "  the same inputs: it was not stored (%s)\n",
                    kc_tool_printable(e->stored, st, sizeof st));
        return;
    }
    fprintf(f, "  what differs:\n");
    for (size_t i = 0; i < nd; i++)
        say(f, &d[i]);
}

/* Oldest first; records of the same time by their file's name. */
static int by_time(const void *x, const void *y)
{
    const struct kc_why_rec *a = x, *b = y;
    if (a->time != b->time)
        return a->time < b->time ? -1 : 1;
    return strcmp(a->file, b->file);
}

static bool hexprefix(const char *s)
{
    size_t n = strlen(s);
    if (n < 4)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!strchr("0123456789abcdefABCDEF", s[i]))
            return false;
    return true;
}

int kc_tool_why(const char *dir, int argc, char **argv, kc_tool_in_store_fn in_store, void *arg)
{
    bool json = false;
    long last = -1;
    const char *sel = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--json") == 0)
            json = true;
        else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            kc_tool_help(stdout, "why");
            return kc_tool_flush(stdout);
        } else if (strcmp(a, "--last") == 0 || strcmp(a, "-n") == 0) {
            char *end;
            if (i + 1 >= argc || (last = strtol(argv[i + 1], &end, 10)) <= 0 || *end != '\0')
                return kc_tool_usage_error("%s needs a number of misses (like 5)", a);
            i++;
        } else if (a[0] == '-')
            return kc_tool_usage_error("unknown option '%s' for 'why'", a);
        else if (sel != NULL)
            return kc_tool_usage_error("unexpected argument '%s' for 'why'", a);
        else
            sel = a;
    }
    if (dir == NULL || dir[0] == '\0') {
        kc_tool_err("no cache directory (no home directory); set KCACHE_DIR or use --dir");
        return KC_EXIT_RUNTIME;
    }
    struct kc_why_rec *v;
    size_t n;
    int rc = kc_why_read_all(dir, &v, &n);
    if (rc == -ENOENT) {
        if (json)
            fputs("[]\n", stdout);
        else
            printf("no miss is recorded in %s: run a program under kcache; each miss is "
                   "recorded there\n",
                   dir);
        return kc_tool_flush(stdout);
    }
    if (rc != 0) {
        kc_tool_err("cannot read the miss records in %s/%s: %s (it must be yours and private)", dir,
                    KC_WHY_DIR, strerror(-rc));
        return KC_EXIT_RUNTIME;
    }
    /* Oldest first by time (names are time-ordered within a clock). */
    qsort(v, n, sizeof *v, by_time);
    if (last < 0)
        last = 1;
    size_t *pick = calloc(n, sizeof *pick), np = 0;
    for (size_t i = n; pick != NULL && i-- > 0 && np < (size_t)last;) {
        bool ok = sel == NULL || strcmp(v[i].name, sel) == 0 ||
                  (hexprefix(sel) && (strncasecmp(v[i].key, sel, strlen(sel)) == 0 ||
                                      strncasecmp(v[i].base, sel, strlen(sel)) == 0));
        if (ok)
            pick[np++] = i;
    }
    if (np == 0 && sel != NULL) {
        free(pick);
        kc_why_recs_free(v, n);
        char nm[KC_TOOL_PRINTABLE_MAX];
        kc_tool_err("no recorded miss of a program named or a key starting '%s'; "
                    "kcache why --last 20 lists the recent ones",
                    kc_tool_printable(sel, nm, sizeof nm));
        return KC_EXIT_RUNTIME;
    }
    /* Every record indexed (each a nearest candidate), once. */
    struct idx *x = calloc(n, sizeof *x);
    for (size_t i = 0; x != NULL && i < n; i++)
        if (idx_make(&v[i], &x[i]) != 0) {
            for (size_t j = 0; j < i; j++)
                idx_free(&x[j]);
            free(x);
            x = NULL;
        }
    if (pick == NULL || x == NULL) {
        free(pick);
        free(x);
        kc_why_recs_free(v, n);
        kc_tool_err("out of memory");
        return KC_EXIT_RUNTIME;
    }
    if (json)
        fputc('[', stdout);
    for (size_t k = np; k-- > 0;) { /* oldest of them first */
        const struct idx *xm = &x[pick[k]];
        const struct idx *xe = nearest(x, pick[k]);
        const struct kc_why_rec *e = xe != NULL ? xe->r : NULL;
        /* (each input makes one difference at most, and each list an order) */
        struct diff *d = xe != NULL ? calloc(e->n + xm->r->n + 2, sizeof *d) : NULL;
        size_t nd = d != NULL ? differ(xe, xm, d, (size_t)-1) : 0;
        /* An entry said to have left the store is looked for there first:
         * one created before this miss was there when it missed (one this
         * miss stored again is not). */
        int in = e != NULL && nd == 0 && strcmp(e->stored, "1") == 0 && in_store != NULL
                     ? in_store(e->key, xm->r->time / 1000000000u, arg)
                     : 0;
        report(stdout, xm->r, e, d, nd, json, k == np - 1, in);
        free(d);
    }
    if (json)
        fputs(np ? "\n]\n" : "]\n", stdout);
    for (size_t i = 0; i < n; i++)
        idx_free(&x[i]);
    free(x);
    free(pick);
    kc_why_recs_free(v, n);
    return kc_tool_flush(stdout);
}
