/*
 * why.c: `kcache why`: for a recent miss, the input that made it one. The
 * shim writes a record of each miss's inputs (common/why.h); this compares
 * a miss with the nearest earlier record of the same library (fewest
 * inputs differing, the same program name first, the latest first) and
 * names what differs.
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

static bool listed(const char *kind)
{
    return strcmp(kind, "option") == 0 || strcmp(kind, "expression") == 0;
}

static const struct kc_why_input *find(const struct kc_why_rec *r, const char *kind,
                                       const char *name)
{
    for (size_t i = 0; i < r->n; i++)
        if (strcmp(r->in[i].kind, kind) == 0 && strcmp(r->in[i].name, name) == 0)
            return &r->in[i];
    return NULL;
}

/* How many of r's inputs of `kind` have `digest`. */
static int count(const struct kc_why_rec *r, const char *kind, const char *digest)
{
    int n = 0;
    for (size_t i = 0; i < r->n; i++)
        n += strcmp(r->in[i].kind, kind) == 0 && strcmp(r->in[i].digest, digest) == 0;
    return n;
}

struct diff {
    const char *what; /* changed, added, removed, found, gone, order */
    const char *kind, *name;
    const char *then, *now;
};

/* The differences from e (earlier) to m: into *out (malloc'd), their count. */
static size_t differ(const struct kc_why_rec *e, const struct kc_why_rec *m, struct diff **out)
{
    /* (each input makes one difference at most, and each list an order) */
    struct diff *v = calloc(e->n + m->n + 2, sizeof *v);
    size_t n = 0;
    *out = v;
    if (v == NULL)
        return 0;
    for (size_t i = 0; i < m->n; i++) {
        const struct kc_why_input *a = &m->in[i];
        if (listed(a->kind))
            continue; /* (below) */
        const struct kc_why_input *b = find(e, a->kind, a->name);
        if (b == NULL)
            v[n++] = (struct diff){"added", a->kind, a->name, NULL, a->shown};
        else if (strcmp(a->digest, b->digest) != 0) {
            const char *w = "changed";
            if (strcmp(a->kind, "file") == 0 && strcmp(b->shown, "absent") == 0)
                w = "found";
            else if (strcmp(a->kind, "file") == 0 && strcmp(a->shown, "absent") == 0)
                w = "gone";
            v[n++] = (struct diff){w, a->kind, a->name, b->shown, a->shown};
        }
    }
    for (size_t i = 0; i < e->n; i++) {
        const struct kc_why_input *b = &e->in[i];
        if (!listed(b->kind) && find(m, b->kind, b->name) == NULL)
            v[n++] = (struct diff){"removed", b->kind, b->name, b->shown, NULL};
    }
    /* Options and name expressions: as lists (one added, one removed, or
     * the same ones in another order). */
    static const char *const kinds[] = {"option", "expression"};
    for (size_t k = 0; k < 2; k++) {
        size_t before = n;
        for (size_t i = 0; i < m->n; i++) {
            const struct kc_why_input *a = &m->in[i];
            if (strcmp(a->kind, kinds[k]) != 0)
                continue;
            bool first = true;
            for (size_t j = 0; j < i; j++)
                first = first && !(strcmp(m->in[j].kind, kinds[k]) == 0 &&
                                   strcmp(m->in[j].digest, a->digest) == 0);
            int d = count(m, kinds[k], a->digest) - count(e, kinds[k], a->digest);
            if (first && d > 0)
                v[n++] = (struct diff){"added", kinds[k], "", NULL, a->shown};
        }
        for (size_t i = 0; i < e->n; i++) {
            const struct kc_why_input *b = &e->in[i];
            if (strcmp(b->kind, kinds[k]) != 0)
                continue;
            bool first = true;
            for (size_t j = 0; j < i; j++)
                first = first && !(strcmp(e->in[j].kind, kinds[k]) == 0 &&
                                   strcmp(e->in[j].digest, b->digest) == 0);
            if (first && count(e, kinds[k], b->digest) > count(m, kinds[k], b->digest))
                v[n++] = (struct diff){"removed", kinds[k], "", b->shown, NULL};
        }
        if (n == before) { /* the same ones: in the same order? */
            size_t ia = 0, ib = 0;
            bool same = true;
            while (same) {
                while (ia < m->n && strcmp(m->in[ia].kind, kinds[k]) != 0)
                    ia++;
                while (ib < e->n && strcmp(e->in[ib].kind, kinds[k]) != 0)
                    ib++;
                if (ia == m->n || ib == e->n)
                    break;
                same = strcmp(m->in[ia++].digest, e->in[ib++].digest) == 0;
            }
            if (!same)
                v[n++] = (struct diff){"order", kinds[k], "", NULL, NULL};
        }
    }
    *out = v;
    return n;
}

/* The nearest earlier record of m's library, or NULL. */
static const struct kc_why_rec *nearest(const struct kc_why_rec *v, size_t at)
{
    const struct kc_why_rec *m = &v[at], *best = NULL;
    size_t best_score = (size_t)-1;
    for (size_t i = 0; i < at; i++) {
        const struct kc_why_rec *e = &v[i];
        if (strcmp(e->backend, m->backend) != 0 || e->time > m->time)
            continue;
        struct diff *d;
        size_t score = differ(e, m, &d) * 2 + (strcmp(e->name, m->name) != 0);
        free(d);
        if (score <= best_score) /* (later ones win ties: oldest first) */
            best = e, best_score = score;
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

static void say(FILE *f, const struct diff *d)
{
    char a[KC_TOOL_PRINTABLE_MAX], b[KC_TOOL_PRINTABLE_MAX], nm[KC_TOOL_PRINTABLE_MAX];
    kc_tool_printable(d->name, nm, sizeof nm);
    kc_tool_printable(d->then ? d->then : "", a, sizeof a);
    kc_tool_printable(d->now ? d->now : "", b, sizeof b);
    const char *sep = d->name[0] ? " " : "";
    if (strcmp(d->what, "order") == 0)
        fprintf(f, "    the %ss are the same, in another order\n", d->kind);
    else if (strcmp(d->what, "found") == 0)
        fprintf(f, "    %s%s%s: now found (%s), absent before\n", label(d->kind), sep, nm, b);
    else if (strcmp(d->what, "gone") == 0)
        fprintf(f, "    %s%s%s: now absent, found before (%s)\n", label(d->kind), sep, nm, a);
    else if (strcmp(d->what, "added") == 0)
        fprintf(f, "    %s%s%s added: %s\n", label(d->kind), sep, nm, b);
    else if (strcmp(d->what, "removed") == 0)
        fprintf(f, "    %s%s%s removed: %s\n", label(d->kind), sep, nm, a);
    else if (strcmp(d->kind, "file") == 0 || strcmp(d->kind, "header") == 0 ||
             strcmp(d->kind, "source") == 0 || strcmp(d->kind, "input") == 0)
        fprintf(f, "    %s%s%s: its content changed (%s then, %s now)\n", label(d->kind), sep, nm,
                a, b);
    else
        fprintf(f, "    %s%s%s: %s then, %s now\n", label(d->kind), sep, nm, a, b);
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++)
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20 || *p >= 0x7f)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    fputc('"', f);
}

static const char *cause_of(const struct kc_why_rec *e, size_t nd)
{
    if (e == NULL)
        return "first";
    if (nd > 0)
        return "differs";
    return strcmp(e->stored, "1") == 0 ? "left-the-store" : "not-stored";
}

static void report(FILE *f, const struct kc_why_rec *m, const struct kc_why_rec *e,
                   const struct diff *d, size_t nd, bool json, bool first)
{
    char t[64], nm[KC_TOOL_PRINTABLE_MAX], st[KC_TOOL_PRINTABLE_MAX];
    const char *cause = cause_of(e, nd);
    if (json) {
        fprintf(f, "%s\n  {\"backend\": ", first ? "" : ",");
        json_str(f, m->backend);
        fprintf(f, ", \"name\": ");
        json_str(f, m->name);
        fprintf(f, ", \"time_ns\": %llu, \"pid\": %ld, \"key\": ", (unsigned long long)m->time,
                m->pid);
        json_str(f, m->key);
        fprintf(f, ", \"compile_ms\": %.3f, \"stored\": ", m->compile_ms);
        json_str(f, m->stored);
        fprintf(f, ", \"remote_refused\": %llu, \"cause\": \"%s\"",
                (unsigned long long)m->remote_refused, cause);
        if (e != NULL) {
            fprintf(f, ", \"nearest\": {\"time_ns\": %llu, \"pid\": %ld, \"key\": ",
                    (unsigned long long)e->time, e->pid);
            json_str(f, e->key);
            fprintf(f, ", \"stored\": ");
            json_str(f, e->stored);
            fprintf(f, "}");
        }
        fprintf(f, ", \"differences\": [");
        for (size_t i = 0; i < nd; i++) {
            fprintf(f, "%s{\"what\": \"%s\", \"kind\": ", i ? ", " : "", d[i].what);
            json_str(f, d[i].kind);
            fprintf(f, ", \"name\": ");
            json_str(f, d[i].name);
            fprintf(f, ", \"then\": ");
            if (d[i].then)
                json_str(f, d[i].then);
            else
                fputs("null", f);
            fprintf(f, ", \"now\": ");
            if (d[i].now)
                json_str(f, d[i].now);
            else
                fputs("null", f);
            fputc('}', f);
        }
        fprintf(f, "]}");
        return;
    }
    fprintf(f, "%s miss: \"%s\" at %s (pid %ld), compiled in %.1f ms, key %.16s\n", m->backend,
            kc_tool_printable(m->name, nm, sizeof nm), when(m->time, t, sizeof t), m->pid,
            m->compile_ms, m->key);
    if (strcmp(m->stored, "1") != 0)
        fprintf(f, "  not stored: %s\n", kc_tool_printable(m->stored, st, sizeof st));
    if (m->remote_refused > 0)
        fprintf(f,
                "  the remote offered %llu entries this lookup refused: unsigned, or signed by "
                "a key not in KCACHE_REMOTE_TRUSTED_KEYS (check with kcache remote ping)\n",
                (unsigned long long)m->remote_refused);
    if (e == NULL) {
        fprintf(f,
                "  its first compile: no earlier %s compile is recorded in this store (the "
                "last %d misses are kept)\n",
                m->backend, KC_WHY_KEEP);
        return;
    }
    fprintf(f, "  the nearest earlier compile: \"%s\" at %s (pid %ld), key %.16s\n",
            kc_tool_printable(e->name, nm, sizeof nm), when(e->time, t, sizeof t), e->pid, e->key);
    if (nd == 0) {
        if (strcmp(e->stored, "1") == 0)
            fprintf(f, "  the same inputs: its entry has left the store since (evicted past "
                       "KCACHE_MAXSIZE, kcache gc or kcache clear)\n");
        else
            fprintf(f, "  the same inputs: it was not stored (%s)\n",
                    kc_tool_printable(e->stored, st, sizeof st));
        return;
    }
    fprintf(f, "  what differs:\n");
    for (size_t i = 0; i < nd; i++)
        say(f, &d[i]);
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

int kc_tool_why(const char *dir, int argc, char **argv)
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
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && v[j - 1].time > v[j].time; j--) {
            struct kc_why_rec t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
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
    if (json)
        fputc('[', stdout);
    for (size_t k = np; k-- > 0;) { /* oldest of them first */
        const struct kc_why_rec *m = &v[pick[k]];
        const struct kc_why_rec *e = nearest(v, pick[k]);
        struct diff *d = NULL;
        size_t nd = e ? differ(e, m, &d) : 0;
        report(stdout, m, e, d, nd, json, k == np - 1);
        free(d);
    }
    if (json)
        fputs(np ? "\n]\n" : "]\n", stdout);
    free(pick);
    kc_why_recs_free(v, n);
    return kc_tool_flush(stdout);
}
