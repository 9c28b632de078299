/*
 * nvcc served whole: the run keyed by nvcc's identity, its arguments as
 * written, the working directory and the environment its tree reads that
 * changes outputs, plus a manifest (manifest.h) of everything the tree
 * read, probed and executed (tree.h), checked on a lookup as NVRTC checks
 * headers. A hit writes the recorded outputs, replays the streams and
 * exits with the stored status before nvcc's main runs: no child starts.
 * A miss runs nvcc in a watched child (as tool.c's supervise) whose whole
 * tree reports; it is stored only when every program reported, nothing
 * read could not be keyed, and every file written that is still there
 * afterwards is one the arguments name as an output (-o, -MF). Files the
 * tree wrote and removed (nvcc's tmpxft_ files) are neither inputs nor
 * outputs.
 */
#include "flight.h"
#include "manifest.h"
#include "shim.h"
#include "toolrun.h"
#include "tree.h"
#include "why.h"

#include "../common/buf.h"
#include "../common/clock.h"
#include "../common/config.h"
#include "../common/identity.h"
#include "../common/log.h"
#include "../store/local/local.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define BACKEND "tool"
#define NVCC_MAGIC 0x3143564e434bull /* "KCNVC1" */
#define MAX_OUTPUTS 8

/* Variables nvcc or a program it runs reads that change an output. */
static const char *const keyed_env[] = {
    "PATH",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    "NVCC_PREPEND_FLAGS",
    "NVCC_APPEND_FLAGS",
    "NVCC_CCBIN",
    "CPATH",
    "C_INCLUDE_PATH",
    "CPLUS_INCLUDE_PATH",
    "OBJC_INCLUDE_PATH",
    "GCC_EXEC_PREFIX",
    "COMPILER_PATH",
    "LIBRARY_PATH",
    "SOURCE_DATE_EPOCH",
    "GCC_COMPARE_DEBUG",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "CUDA_PATH",
    NULL,
};

/* Variables that make a program of the tree write a file the arguments do
 * not name: such a run passes through. */
static const char *const refused_env[] = {"DEPENDENCIES_OUTPUT", "SUNPRO_DEPENDENCIES", NULL};

/* Options whose files kcache does not keep. */
static const char *const refused_opts[] = {
    "--keep",      "-keep", "--keep-dir", "-keep-dir", "--save-temps",
    "-save-temps", "--run", "-run",       NULL,
};

struct nvrun {
    int argc;
    char **argv;
    const char *outputs[MAX_OUTPUTS];
    int n_outputs;
    kc_digest base;
};

static bool named(const char *a, const char *const *list)
{
    for (const char *const *o = list; *o != NULL; o++)
        if (strcmp(a, *o) == 0)
            return true;
    return false;
}

/* The value of output option `a` (-o X, -o=X, -oX; --output-file X or =X;
 * -MF, --dependency-output), advancing *i past it, or NULL. */
static const char *output_of(struct nvrun *r, int *i)
{
    static const char *const opts[] = {"-o", "--output-file", "-MF", "--dependency-output", NULL};
    const char *a = r->argv[*i];
    for (const char *const *o = opts; *o != NULL; o++) {
        size_t n = strlen(*o);
        if (strncmp(a, *o, n) != 0)
            continue;
        if (a[n] == '\0')
            return *i + 1 < r->argc ? r->argv[++*i] : NULL;
        if (a[n] == '=')
            return a + n + 1;
        if (n == 2 || n == 3) /* -ofile, -MFfile */
            return a + n;
    }
    return NULL;
}

/* KC_PASS_* reason and *why when nvcc is left to run as it is, or -1. */
static int parse(struct nvrun *r, const char **why)
{
    for (int i = 1; i < r->argc; i++) {
        const char *a = r->argv[i];
        if (strcmp(a, "-") == 0) {
            *why = "a source read from standard input (not a file the tree opens)";
            return KC_PASS_input;
        }
        if (named(a, refused_opts) || strncmp(a, "--keep-dir=", 11) == 0) {
            *why = "an option that keeps nvcc's temporary files";
            return KC_PASS_option;
        }
        const char *out = output_of(r, &i);
        if (out != NULL) {
            if (r->n_outputs == MAX_OUTPUTS || out[0] == '\0') {
                *why = "more outputs than kcache keeps";
                return KC_PASS_option;
            }
            r->outputs[r->n_outputs++] = out;
        }
    }
    for (const char *const *e = refused_env; *e != NULL; e++)
        if (getenv(*e) != NULL) {
            *why = "a variable that makes the host compiler write a dependency file";
            return KC_PASS_option;
        }
    return -1;
}

static kc_digest run_key(const struct nvrun *r, const kc_digest *id, const char *cwd, bool merged)
{
    struct kc__hasher *h = kc__hasher_new();
    kc_digest d = {0};
    if (h == NULL)
        return d;
    kc__hash_str(h, "kcache nvcc tree 1");
    kc__hash_bytes(h, id, sizeof *id);
    /* Where it lies: nvcc finds nvcc.profile, its headers and its
     * programs beside its executable. */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    kc__hash_str(h, exe);
    kc__hash_u64(h, (uint64_t)r->argc);
    for (int i = 0; i < r->argc; i++)
        kc__hash_str(h, i == 0 ? "nvcc" : r->argv[i]);
    kc__hash_str(h, cwd);
    kc__hash_u64(h, merged);
    for (const char *const *e = keyed_env; *e != NULL; e++) {
        const char *v = getenv(*e);
        kc__hash_str(h, *e);
        kc__hash_u64(h, v != NULL);
        kc__hash_str(h, v != NULL ? v : "");
    }
    /* LC_* beyond the named ones. */
    for (char **e = environ; *e != NULL; e++)
        if (strncmp(*e, "LC_", 3) == 0)
            kc__hash_str(h, *e);
    d = kc__hash_digest(h);
    kc__hasher_free(h);
    return d;
}

/* ---- records -------------------------------------------------------------------------- */

struct nvrec {
    int status, merged;
    struct kc_buf out, err;
    int n;
    char *path[MAX_OUTPUTS];
    struct kc_buf file[MAX_OUTPUTS];
};

static void rec_free(struct nvrec *x)
{
    kc_buf_free(&x->out);
    kc_buf_free(&x->err);
    for (int i = 0; i < x->n; i++) {
        free(x->path[i]);
        kc_buf_free(&x->file[i]);
    }
    memset(x, 0, sizeof *x);
}

static int rec_encode(const struct nvrec *x, struct kc_buf *b)
{
    kc_buf_put_u64(b, NVCC_MAGIC);
    kc_buf_put_u32(b, (uint32_t)x->status);
    kc_buf_put_u8(b, (uint8_t)x->merged);
    kc_buf_put_blob(b, x->out.p, x->out.len);
    kc_buf_put_blob(b, x->err.p, x->err.len);
    kc_buf_put_u32(b, (uint32_t)x->n);
    for (int i = 0; i < x->n; i++) {
        kc_buf_put_blob(b, x->path[i], strlen(x->path[i]));
        kc_buf_put_blob(b, x->file[i].p, x->file[i].len);
    }
    return b->err ? -ENOMEM : 0;
}

static int rec_decode(const void *p, size_t n, struct nvrec *x)
{
    memset(x, 0, sizeof *x);
    struct kc_rd r;
    kc_rd_init(&r, p, n);
    if (kc_rd_get_u64(&r) != NVCC_MAGIC)
        return -EINVAL;
    x->status = (int)kc_rd_get_u32(&r);
    x->merged = kc_rd_get_u8(&r);
    int rc = kc_rd_get_blob(&r, &x->out);
    if (rc == 0)
        rc = kc_rd_get_blob(&r, &x->err);
    uint32_t k = kc_rd_get_u32(&r);
    if (k > MAX_OUTPUTS)
        rc = -EINVAL;
    for (uint32_t i = 0; rc == 0 && i < k; i++) {
        struct kc_buf pb = {0};
        rc = kc_rd_get_blob(&r, &pb);
        if (rc == 0)
            rc = kc_rd_get_blob(&r, &x->file[i]);
        kc_buf_add(&pb, "", 1);
        x->path[i] = (char *)pb.p;
        x->n = (int)i + 1;
        if (rc == 0 && pb.err)
            rc = -ENOMEM;
    }
    if (rc == 0 && (kc_rd_end(&r) != 0 || x->status < 0 || x->status > 255 || x->merged > 1))
        rc = -EINVAL;
    if (rc != 0)
        rec_free(x);
    return rc;
}

/* ---- replay ------------------------------------------------------------------------------ */

static bool is_output(const struct nvrun *r, const char *p)
{
    for (int i = 0; i < r->n_outputs; i++)
        if (strcmp(r->outputs[i], p) == 0)
            return true;
    return false;
}

/* Serves the run: outputs, streams, status. Returns (negative errno) only
 * when the run must go on as nvcc; else exits. */
static int replay(const struct nvrun *r, const struct nvrec *x, struct kc_counters *c)
{
    for (int i = 0; i < x->n; i++)
        if (!is_output(r, x->path[i]))
            return -EINVAL;
    /* A named output the record does not hold: nvcc failed before writing
     * it; one there now is nvcc's to keep or remove. */
    for (int i = 0; i < r->n_outputs; i++) {
        bool held = false;
        for (int k = 0; k < x->n; k++)
            held |= strcmp(x->path[k], r->outputs[i]) == 0;
        struct stat st;
        if (!held &&
            (lstat(r->outputs[i], &st) == 0 || !kc__tool_output_dir_writable(r->outputs[i])))
            return -EEXIST;
    }
    /* nvcc's outputs are written in place (-cubin, -ptx, -fatbin) or
     * replaced (-c: GNU as unlinks an object first): served only where
     * both leave the same, checked for all before any is written. */
    struct kc__out_how how[MAX_OUTPUTS];
    for (int i = 0; i < x->n; i++) {
        int rc = kc__tool_output_how(x->path[i], false, &how[i]);
        if (rc != 0)
            return rc;
    }
    for (int i = 0; i < x->n; i++) {
        int rc = kc__tool_output_put(x->path[i], &x->file[i], &how[i]);
        if (rc != 0)
            return rc;
    }
    c->hits = 1;
    kc__count(BACKEND, c);
    (void)kc__write_full(STDOUT_FILENO, x->out.p, x->out.len);
    (void)kc__write_full(STDERR_FILENO, x->err.p, x->err.len);
    kc__exit(x->status);
}

/* ---- a miss: nvcc runs as a child, its tree watched -------------------------------------- */

static pid_t child_pid = -1;
static volatile sig_atomic_t signalled; /* a signal was forwarded: never stored */

static void forward(int sig)
{
    signalled = 1;
    if (child_pid > 0)
        kill(child_pid, sig);
}

/* Reads a whole regular file. 0 or an error message. */
static const char *slurp(const char *path, struct kc_buf *b)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    struct stat st;
    const char *why = NULL;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        why = "an output is not a regular file";
    char buf[65536];
    while (why == NULL) {
        ssize_t got = read(fd, buf, sizeof buf);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            why = "an output could not be read";
        if (got <= 0)
            break;
        kc_buf_add(b, buf, (size_t)got);
    }
    if (why == NULL && b->err)
        why = "an output was too large to keep";
    if (fd >= 0)
        close(fd);
    return why;
}

/* What the tree did, checked: NULL when the run can be stored (x holds its
 * outputs), else why not. */
static const char *tree_check(const struct nvrun *r, struct kc__ptree *t, struct nvrec *x,
                              int *reason)
{
    *reason = KC_PASS_unkeyable;
    if (t->why != NULL)
        return t->why;
    *reason = KC_PASS_writes;
    for (size_t i = 0; i < t->n_written; i++) {
        const char *w = t->written[i];
        struct stat st;
        if (strcmp(w, "/dev/null") == 0 || lstat(w, &st) != 0)
            continue; /* a temporary file: created and removed */
        int k = 0;
        while (k < r->n_outputs && !kc__tool_same_path(w, r->outputs[k]))
            k++;
        if (k == r->n_outputs)
            return "it wrote a file its arguments do not name as an output";
    }
    *reason = -1;
    /* The named outputs that exist now and were written: kept. */
    for (int k = 0; k < r->n_outputs; k++) {
        bool wrote = false;
        for (size_t i = 0; i < t->n_written && !wrote; i++)
            wrote = kc__tool_same_path(t->written[i], r->outputs[k]);
        struct stat st;
        if (!wrote) {
            if (lstat(r->outputs[k], &st) == 0)
                return "a named output is there but the tree did not write it";
            continue;
        }
        if (lstat(r->outputs[k], &st) != 0)
            continue;
        if (x->status != 0)
            return "it failed after writing an output";
        x->path[x->n] = strdup(r->outputs[k]);
        if (x->path[x->n] == NULL)
            return "no memory";
        const char *why = slurp(r->outputs[k], &x->file[x->n++]);
        if (why != NULL)
            return why;
    }
    if (x->status != 0)
        for (int k = 0; k < r->n_outputs; k++)
            if (!kc__tool_output_dir_writable(r->outputs[k]))
                return "it failed where its output could not be written";
    for (size_t i = 0; i < t->reads.n; i++) {
        const struct kc__dep *d = &t->reads.v[i];
        if (d->kind == KC_DEP_FILE && !S_ISREG(d->st.st_mode))
            return "the tree read a file that is not a regular file";
    }
    int rc = kc__deps_finish(&t->reads);
    if (rc == -ESTALE)
        return "a file the tree read changed under it";
    if (rc != 0)
        return "the files the tree read could not be digested";
    return NULL;
}

static void why_record(const struct nvrun *r, const kc_digest *id, const kc_key *key,
                       const char *why_not, uint64_t took)
{
    struct kc_why w = {0};
    kc_why_begin(&w, BACKEND, r->n_outputs > 0 ? r->outputs[0] : "nvcc", &r->base);
    kc_why_add(&w, "library", "nvcc", id, r->argv[0]);
    for (int i = 1; i < r->argc; i++)
        kc_why_add(&w, "option", "", NULL, r->argv[i]);
    kc__why_finish(&w, &key->id, key->build, why_not, took, 0);
}

static int supervise(const struct nvrun *r, bool merged, struct kc_store *st,
                     const struct kc_store_ops *api, const char *ns, const kc_digest *id,
                     int flight, struct kc_counters *c)
{
    const struct kc_config *cfg = kc__config();
    char dir[PATH_MAX];
    int trc = kc__ptree_open(cfg->dir, dir, sizeof dir);
    if (trc != 0)
        return trc;
    int outp[2] = {-1, -1}, errp[2] = {-1, -1};
    pid_t parent = getpid(), pid = -1;
    if (pipe2(outp, O_CLOEXEC) == 0 && (merged || pipe2(errp, O_CLOEXEC) == 0)) {
        fflush(NULL);
        pid = fork();
    }
    if (pid < 0) {
        int e = errno;
        int all[] = {outp[0], outp[1], errp[0], errp[1]};
        for (int i = 0; i < 4; i++)
            if (all[i] >= 0)
                close(all[i]);
        kc__ptree_remove(dir);
        return -e;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        kc__flight_release(flight);
        dup2(outp[1], STDOUT_FILENO);
        dup2(merged ? outp[1] : errp[1], STDERR_FILENO);
        close(outp[0]);
        close(outp[1]);
        if (!merged) {
            close(errp[0]);
            close(errp[1]);
        }
        kc__tool_child();
        kc__ptree_child(dir);
        return 0;
    }
    close(outp[1]);
    if (!merged)
        close(errp[1]);
    child_pid = pid;
    struct sigaction sa = {.sa_handler = forward}, old[4];
    sigemptyset(&sa.sa_mask);
    const int fwd[4] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
    for (int i = 0; i < 4; i++)
        sigaction(fwd[i], &sa, &old[i]);
    signal(SIGPIPE, SIG_IGN);
    struct nvrec x = {.merged = merged};
    struct kc__capture cap[2] = {{outp[0], STDOUT_FILENO, &x.out, false},
                                 {merged ? -1 : errp[0], STDERR_FILENO, &x.err, false}};
    uint64_t t0 = kc_mono_ns();
    bool out_broken = false, err_broken = false;
    kc__tool_pump(pid, cap, 2, &out_broken, &err_broken);
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR)
        ;
    uint64_t took = kc_mono_ns() - t0;
    for (int i = 0; i < 4; i++)
        sigaction(fwd[i], &old[i], NULL);
    child_pid = -1;

    const char *why_not = NULL;
    int reason = -1; /* a tree kcache cannot account for: counted as passed through */
    struct kc__ptree t = {0};
    if (!WIFEXITED(ws) || signalled)
        why_not = "nvcc was killed, or signalled";
    else if (cap[0].over || cap[1].over || x.out.err || x.err.err)
        why_not = "its output was too large to keep";
    else if (out_broken || err_broken)
        why_not = "its standard streams could not be written";
    else if (kc__ptree_collect(dir, &t) != 0)
        why_not = "its tree's reports could not be read";
    if (why_not == NULL) {
        x.status = WEXITSTATUS(ws);
        why_not = tree_check(r, &t, &x, &reason);
    }
    kc__ptree_remove(dir);
    if (why_not != NULL && reason >= 0) {
        kc__pass_reason(BACKEND, (enum kc_pass_reason)reason);
        c->passthrough = 1;
    } else {
        c->misses = 1;
    }
    c->compile_ns = took;
    kc_key key = {.id = r->base, .build = kc__self_build()};
    if (why_not == NULL && !cfg->readonly) {
        kc_digest result = kc__manifest_result_id(&r->base, t.reads.v, t.reads.n);
        key.id = result;
        struct kc_buf b = {0};
        int prc = rec_encode(&x, &b) == 0
                      ? api->put(st, ns, &key, NULL, KC_KIND_BLOB, b.p, b.len, took)
                      : -ENOMEM;
        if (prc == 0)
            prc = kc__manifest_add(st, api, ns, &r->base, &result, &t.reads);
        if (prc == 0)
            c->stores = 1;
        else if (prc != -EDQUOT) {
            c->errors = 1;
            kc_log_once(KC_LOG_WARN, "cannot store an nvcc run (%s)", strerror(-prc));
        }
        kc_buf_free(&b);
    } else if (why_not != NULL) {
        kc_log(KC_LOG_DEBUG, "nvcc run not stored: %s", why_not);
    }
    if (!cfg->readonly)
        why_record(r, id, &key, c->stores ? NULL : why_not ? why_not : "not stored", took);
    kc__flight_release(flight);
    rec_free(&x);
    kc__ptree_free(&t);
    kc__count(BACKEND, c);
    if (WIFSIGNALED(ws)) {
        int sig = WTERMSIG(ws);
        signal(sig, SIG_DFL);
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, sig);
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        kill(getpid(), sig);
        _exit(128 + sig);
    }
    kc__exit(WIFEXITED(ws) ? WEXITSTATUS(ws) : 1);
}

/* ---- the entry ------------------------------------------------------------------------- */

static void pass(struct kc_counters *c, int reason, const char *why)
{
    kc_log(KC_LOG_DEBUG, "nvcc passes through: %s", why);
    kc__pass_reason(BACKEND, (enum kc_pass_reason)reason);
    c->passthrough = 1;
    kc__count(BACKEND, c);
}

/* Looks the run up: 1 with *x found, 0 not. */
static int lookup(struct kc_store *st, const struct kc_store_ops *api, const char *ns,
                  const kc_digest *base, struct nvrec *x, struct kc_counters *c)
{
    kc_digest result;
    if (kc__manifest_lookup(st, api, ns, base, NULL, &result) != 0)
        return 0;
    kc_key key = {.id = result, .build = kc__self_build()};
    void *body = NULL;
    size_t len = 0;
    struct kc_record_info info = {0};
    if (api->get(st, ns, &key, &body, &len, &info) != 0)
        return 0;
    int rc = rec_decode(body, len, x);
    api->free(body);
    if (rc != 0) {
        api->purge(st, ns, &key);
        c->errors++;
        return 0;
    }
    c->saved_ns = info.saved_ns;
    return 1;
}

void kc__nvcc_start(int argc, char **argv)
{
    if (argc < 1 || argv == NULL || argv[0] == NULL)
        return;
    const char *base = strrchr(argv[0], '/');
    base = base != NULL ? base + 1 : argv[0];
    if (strcmp(base, "nvcc") != 0)
        return;
    const struct kc_config *cfg = kc__config();
    if (cfg->disable || !cfg->tools || !cfg->nvcc)
        return;
    struct kc_counters c = {0};
    struct nvrun r = {.argc = argc, .argv = argv};
    const char *why = NULL;
    int reason = parse(&r, &why);
    if (reason < 0 && (isatty(STDOUT_FILENO) || isatty(STDERR_FILENO))) {
        reason = KC_PASS_input;
        why = "a terminal on standard output or error (the host compiler colours it)";
    }
    if (reason < 0 && (fcntl(STDOUT_FILENO, F_GETFD) < 0 || fcntl(STDERR_FILENO, F_GETFD) < 0)) {
        reason = KC_PASS_input;
        why = "a closed standard stream";
    }
    if (reason >= 0) {
        pass(&c, reason, why);
        return;
    }
    const struct kc_store_ops *api = NULL;
    struct kc_store *st = kc__store(&api);
    if (st == NULL)
        return;
    kc_digest id;
    char cwd[PATH_MAX];
    if (kc__tool_identity(cfg, &id) != 0 || getcwd(cwd, sizeof cwd) == NULL) {
        pass(&c, KC_PASS_internal, "no identity or working directory");
        return;
    }
    bool merged = kc__tool_same_stream(STDOUT_FILENO, STDERR_FILENO);
    r.base = run_key(&r, &id, cwd, merged);
    char ns[96], hex[33];
    kc__digest_hex(&id, hex);
    snprintf(ns, sizeof ns, "tool:nvcc-%.16s-f1", hex);
    struct nvrec x = {0};
    int flight = -1;
    bool found = false;
    for (int round = 0; !cfg->recache && round < 2 && !found; round++) {
        found = lookup(st, api, ns, &r.base, &x, &c) == 1;
        if (!found && round == 0) {
            bool waited = false;
            flight = kc__flight_acquire(&r.base, &waited);
            if (flight < 0 && !waited)
                break;
        }
    }
    if (found) {
        kc__flight_release(flight);
        int rrc = replay(&r, &x, &c); /* exits on success */
        rec_free(&x);
        pass(&c, rrc == -EEXIST ? KC_PASS_order : KC_PASS_input,
             rrc == -ENOTSUP ? "an output there now that nvcc writes through or replaces (a "
                               "link, another owner, a mode or attributes of its own)"
                             : "a stored run cannot be replayed here");
        return;
    }
    if (supervise(&r, merged, st, api, ns, &id, flight, &c) != 0) {
        kc__flight_release(flight);
        pass(&c, KC_PASS_internal, "no watched child");
    }
}
