/*
 * Compilers run as processes: a known CUDA compiler tool's run served whole.
 *
 * LD_PRELOAD is inherited, so the shim is inside every ptxas a program
 * starts (Triton on every kernel, XLA, nvcc). Before the tool's main runs,
 * kc__tool_start decides whether this process is one (a name comparison
 * first, nothing more in any other process), keys the run by everything
 * that decides its outputs, and on a hit writes the outputs, replays
 * standard output and standard error and exits with the stored status: the
 * tool never runs. On a miss the tool runs as a child of this process
 * (fork: the tool's main runs in the child), which is watched: its
 * standard streams are copied through as they come, every file it opens
 * is recorded (deps.c, every thread), and only a run that exited, read
 * nothing but its named inputs and wrote nothing but its named outputs is
 * stored. Anything else passes through with a reason and is never stored.
 *
 * A tool is described by a table: its names, the environment variables it
 * reads, its options (which take a value, which name the output, which
 * kcache refuses, which make the tool record its command line in what it
 * writes). A new tool is a table.
 */
#include "deps.h"
#include "flight.h"
#include "shim.h"
#include "toolrun.h"
#include "why.h"

#include "../common/buf.h"
#include "../common/clock.h"
#include "../common/config.h"
#include "../common/identity.h"
#include "../common/log.h"
#include "../common/why.h"
#include "../store/local/local.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BACKEND "tool"

/* ---- the tools ------------------------------------------------------------------------ */

enum opt_kind {
    O_FLAG,    /* no value: kept in the key as written */
    O_VAL,     /* a value: kept in the key as written */
    O_OUT,     /* a value, the output file: its path is not in the key */
    O_REFUSE,  /* kcache leaves the run to the tool (help, an options file, a
                  form it does not parse) */
    O_RECORDS, /* no value; the tool then records its command line in its
                  output (a witness: ptxas -g), so every argument is kept
                  as written */
};

struct opt {
    const char *lng, *shrt;
    enum opt_kind kind;
};

struct tool {
    const char *const *names; /* the executable's file names */
    const char *id;           /* in the namespace */
    const char *const *env;   /* variables the tool reads that change what
                                 it does (debugging knobs): a run with one
                                 set passes through */
    const char *const *inert; /* variables it reads that decide no output
                                 (a test checks that every getenv call of
                                 the tool names one of the two lists) */
    const struct opt *opts;
};

/* ptxas 12.x and 13.x (`ptxas --help`). The cache-modifier options
 * (-dlcm, ...) are refused: whether they take a value is not documented. */
static const struct opt ptxas_opts[] = {
    {"--Ofast-compile", "-Ofc", O_VAL},
    {"--allow-expensive-optimizations", "-allow-expensive-optimizations", O_VAL},
    {"--compile-as-tools-patch", "-astoolspatch", O_FLAG},
    {"--compile-only", "-c", O_FLAG},
    {"--compiler-annotations", "-annotate", O_FLAG},
    {"--def-load-cache", "-dlcm", O_REFUSE},
    {"--def-store-cache", "-dscm", O_REFUSE},
    {"--device-debug", "-g", O_RECORDS},
    {"--device-function-maxrregcount", "-func-maxrregcount", O_VAL},
    {"--device-stack-protector", "-device-stack-protector", O_VAL},
    {"--disable-optimizer-constants", "-disable-optimizer-consts", O_FLAG},
    {"--disable-warnings", "-w", O_FLAG},
    {"--dont-merge-basicblocks", "-no-bb-merge", O_FLAG},
    {"--entry", "-e", O_VAL},
    {"--extensible-whole-program", "-ewp", O_FLAG},
    {"--fmad", "-fmad", O_VAL},
    {"--force-load-cache", "-flcm", O_REFUSE},
    {"--force-store-cache", "-fscm", O_REFUSE},
    {"--g-tensor-memory-access-check", "-g-tmem-access-check", O_FLAG},
    {"--generate-line-info", "-lineinfo", O_FLAG},
    {"--gno-tensor-memory-access-check", "-gno-tmem-access-check", O_FLAG},
    {"--gpu-name", "-arch", O_VAL},
    {"--help", "-h", O_REFUSE},
    {"--input-as-string", "-ias", O_VAL},
    {"--legacy-bar-warp-wide-behavior", "-legacy-bar-warp-wide-behavior", O_FLAG},
    {"--list-version", "-version-ls", O_REFUSE},
    {"--machine", "-m", O_VAL},
    {"--make-errors-visible-at-exit", "-make-errors-visible-at-exit", O_FLAG},
    {"--maxntid", "-maxntid", O_VAL},
    {"--maxrregcount", "-maxrregcount", O_VAL},
    {"--minnctapersm", "-minnctapersm", O_VAL},
    {"--opt-level", "-O", O_VAL},
    {"--optimize-float-atomics", "-opt-fp-atomics", O_FLAG},
    {"--options-file", "-optf", O_REFUSE},
    {"--output-file", "-o", O_OUT},
    {"--override-directive-values", "-override-directive-values", O_FLAG},
    {"--position-independent-code", "-pic", O_VAL},
    {"--preserve-relocs", "-preserve-relocs", O_FLAG},
    {"--register-usage-level", "-regUsageLevel", O_VAL},
    /* Not in --help; Triton 3.9 passes it to every ptxas 12.x and 13.x. */
    {"--regAllocOptLevel", "-regAllocOptLevel", O_VAL},
    {"--return-at-end", "-ret-end", O_FLAG},
    {"--sanitize", "-sanitize", O_VAL},
    {"--sp-bounds-check", "-sp-bounds-check", O_FLAG},
    {"--split-compile", "-split-compile", O_VAL},
    {"--suppress-async-bulk-multicast-advisory-warning",
     "-suppress-async-bulk-multicast-advisory-warning", O_FLAG},
    {"--suppress-debug-info", "-suppress-debug-info", O_FLAG},
    {"--suppress-double-demote-warning", "-suppress-double-demote-warning", O_FLAG},
    {"--suppress-sparse-mma-advisory-info", "-suppress-sparse-mma-advisory-info", O_FLAG},
    {"--suppress-stack-size-warning", "-suppress-stack-size-warning", O_FLAG},
    {"--verbose", "-v", O_FLAG},
    {"--version", "-V", O_REFUSE},
    {"--warn-on-double-precision-use", "-warn-double-usage", O_FLAG},
    {"--warn-on-local-memory-usage", "-warn-lmem-usage", O_FLAG},
    {"--warn-on-spills", "-warn-spills", O_FLAG},
    {"--warning-as-error", "-Werror", O_FLAG},
    {NULL, NULL, O_FLAG},
};

static const char *const ptxas_names[] = {"ptxas", "ptxas-blackwell", NULL};
static const char *const ptxas_env[] = {"CAN_FINALIZE_DEBUG", "DUMP_KNOBS_TO_FILE", NULL};
/* ptxas 13.4: make's jobserver (how many threads work, not what they
 * make) and OpenSSL's CPU dispatch. */
static const char *const ptxas_inert[] = {"MAKEFLAGS", "OPENSSL_ia32cap", NULL};

static const struct tool tools[] = {
    {ptxas_names, "ptxas", ptxas_env, ptxas_inert, ptxas_opts},
};

/* The tool this executable's file name names, or NULL: the whole cost of
 * the check in every other process. */
static const struct tool *tool_named(const char *argv0)
{
    if (argv0 == NULL)
        return NULL;
    const char *base = strrchr(argv0, '/');
    base = base != NULL ? base + 1 : argv0;
    for (size_t t = 0; t < sizeof tools / sizeof tools[0]; t++)
        for (const char *const *n = tools[t].names; *n != NULL; n++)
            if (strcmp(base, *n) == 0)
                return &tools[t];
    return NULL;
}

/* ---- a run: its arguments parsed ------------------------------------------------------ */

#define MAX_FILES 8

struct run {
    const struct tool *tool;
    int argc;
    char **argv;
    const char *inputs[MAX_FILES];  /* positional arguments: files read */
    kc_digest in_digest[MAX_FILES]; /* their contents (run_key) */
    int n_inputs;
    kc_digest identity; /* the executable's */
    kc_digest base;     /* the run's key */
    const char *output; /* the output file */
    bool records_args;  /* the output records the command line */
    /* Per argument: 0 kept as written, 1 an input's path, 2 the output's
     * path (the whole argument, or the value after '='). */
    unsigned char *role;
};

static const struct opt *opt_find(const struct opt *opts, const char *a, size_t n)
{
    for (const struct opt *o = opts; o->lng != NULL; o++)
        if ((strlen(o->lng) == n && strncmp(a, o->lng, n) == 0) ||
            (strlen(o->shrt) == n && strncmp(a, o->shrt, n) == 0))
            return o;
    return NULL;
}

/* Parses the arguments. KC_PASS_* reason when the run is left to the tool,
 * or -1 when kcache can key it. */
static int parse(struct run *r)
{
    r->role = calloc((size_t)r->argc + 1, 1);
    if (r->role == NULL)
        return KC_PASS_internal;
    for (int i = 1; i < r->argc; i++) {
        const char *a = r->argv[i];
        if (a[0] != '-') {
            if (r->n_inputs == MAX_FILES)
                return KC_PASS_input;
            r->inputs[r->n_inputs++] = a;
            r->role[i] = 1;
            continue;
        }
        const char *eq = strchr(a, '=');
        size_t n = eq != NULL ? (size_t)(eq - a) : strlen(a);
        const struct opt *o = opt_find(r->tool->opts, a, n);
        const char *v = eq != NULL ? eq + 1 : NULL;
        if (o == NULL && a[1] != '-' && a[1] != '\0' && a[2] != '\0') {
            /* A one-letter option with its value attached: -O3, -m64. */
            o = opt_find(r->tool->opts, a, 2);
            if (o != NULL && o->kind != O_VAL && o->kind != O_OUT)
                o = NULL;
            v = a + 2;
        }
        if (o == NULL || o->kind == O_REFUSE)
            return KC_PASS_option;
        if (o->kind == O_FLAG || o->kind == O_RECORDS) {
            if (eq != NULL)
                return KC_PASS_option;
            r->records_args |= o->kind == O_RECORDS;
            continue;
        }
        /* A value: after '=', attached, or the next argument. */
        int vi = i;
        if (v == NULL) {
            if (i + 1 >= r->argc)
                return KC_PASS_option;
            v = r->argv[++i];
            vi = i;
        }
        if (o->kind == O_OUT) {
            if (r->output != NULL || v[0] == '\0')
                return KC_PASS_option;
            r->output = v;
            r->role[vi] = 2;
        }
    }
    /* One output, named; one input file at most (or the PTX given as a
     * string). */
    if (r->output == NULL || r->n_inputs > 1)
        return KC_PASS_input;
    return -1;
}

/* ---- the key ---------------------------------------------------------------------------- */

/* The content digest of a regular file `path`, read whole. 0, or negative
 * errno (-EINVAL: not a regular file). */
static int file_digest(const char *path, kc_digest *out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return -errno;
    struct stat st;
    int rc = fstat(fd, &st) != 0 ? -errno : !S_ISREG(st.st_mode) ? -EINVAL : 0;
    if (rc == 0)
        rc = kc__digest_fd(fd, &st, out);
    close(fd);
    return rc;
}

/* Whether fds a and b are one open file description (`2>&1`). */
bool kc__tool_same_stream(int a, int b)
{
    struct stat sa, sb;
    if (fstat(a, &sa) != 0 || fstat(b, &sb) != 0)
        return false;
    int fa = fcntl(a, F_GETFL), fb = fcntl(b, F_GETFL);
    if (sa.st_dev != sb.st_dev || sa.st_ino != sb.st_ino || fa != fb)
        return false;
    /* Same file: one description moves one offset. */
    off_t oa = lseek(a, 0, SEEK_CUR), ob = lseek(b, 0, SEEK_CUR);
    return oa == ob;
}

/* The run's key: the tool's identity and name, every argument in order
 * (an input's path replaced by its content, the output's path left out,
 * unless the output records the command line), the tool's variables, and
 * whether standard output and error are one stream. KC_PASS_* reason when
 * it cannot be keyed, or -1. */
static int run_key(struct run *r, const kc_digest *identity, bool merged, kc_digest *out)
{
    for (const char *const *e = r->tool->env; *e != NULL; e++) {
        const char *v = getenv(*e);
        if (v != NULL)
            return KC_PASS_option; /* the tool's debugging knobs */
    }
    struct kc__hasher *h = kc__hasher_new();
    if (h == NULL)
        return KC_PASS_internal;
    kc__hash_str(h, "kcache tool run 1");
    kc__hash_str(h, r->tool->id);
    kc__hash_bytes(h, identity, sizeof *identity);
    kc__hash_u64(h, (uint64_t)r->argc);
    kc__hash_u64(h, r->records_args);
    kc__hash_u64(h, merged);
    int why = -1, k = 0;
    for (int i = 1; i < r->argc && why < 0; i++) {
        const char *a = r->argv[i];
        if (r->role[i] == 1) {
            kc_digest d = {0};
            if (file_digest(a, &d) != 0)
                why = KC_PASS_input;
            r->in_digest[k++] = d;
            kc__hash_str(h, "input");
            kc__hash_bytes(h, &d, sizeof d);
            if (r->records_args)
                kc__hash_str(h, a);
        } else if (r->role[i] == 2) {
            const char *eq = strchr(a, '=');
            kc__hash_str(h, "output");
            /* The option's spelling stays: "-o X" or "--output-file=X". */
            if (eq != NULL && a[0] == '-')
                kc__hash_bytes(h, a, (size_t)(eq - a));
            if (r->records_args)
                kc__hash_str(h, a);
        } else {
            kc__hash_str(h, a);
        }
    }
    *out = kc__hash_digest(h);
    kc__hasher_free(h);
    r->identity = *identity;
    r->base = *out;
    return why;
}

/* The miss's record for `kcache why`: the tool, kcache's build, every
 * argument as keyed (an input by its content, shown by its path). */
static void why_record(const struct run *r, const kc_key *key, const char *why_not, uint64_t took)
{
    struct kc_why w = {0};
    const char *name = r->n_inputs > 0 ? r->inputs[0] : r->output;
    kc_why_begin(&w, BACKEND, name, &r->base);
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    kc_why_add(&w, "library", r->tool->id, &r->identity, exe);
    uint64_t b = kc__self_build();
    kc_digest bd = kc_digest_of(&b, sizeof b);
    char shown[64];
    snprintf(shown, sizeof shown, "build %016llx", (unsigned long long)b);
    kc_why_add(&w, "kcache", "", &bd, shown);
    for (int i = 1, k = 0; i < r->argc; i++) {
        if (r->role[i] == 1)
            kc_why_add(&w, "input", "", &r->in_digest[k++], r->argv[i]);
        else if (r->role[i] == 2 && !r->records_args)
            kc_why_add(&w, "option", "", NULL, "(the output)");
        else
            kc_why_add(&w, "option", "", NULL, r->argv[i]);
    }
    kc__why_finish(&w, &key->id, key->build, why_not, took, 0);
}

/* ---- records ---------------------------------------------------------------------------- */

/* A run's record: u64 magic, i32 exit status, u8 merged, blob standard
 * output, blob standard error, u8 whether the output file was written,
 * blob its bytes. Little-endian. */
#define TOOL_MAGIC 0x314c54434bull /* "KCTL" 1 */
#define MAX_STREAM (64u << 20)

struct record {
    int status;
    int merged;
    struct kc_buf out, err;
    int wrote;
    struct kc_buf file;
};

static void record_free(struct record *x)
{
    kc_buf_free(&x->out);
    kc_buf_free(&x->err);
    kc_buf_free(&x->file);
}

static void put_blob(struct kc_buf *b, const struct kc_buf *v)
{
    kc_buf_put_u64(b, v->len);
    kc_buf_add(b, v->p, v->len);
}

static int record_encode(const struct record *x, struct kc_buf *b)
{
    kc_buf_put_u64(b, TOOL_MAGIC);
    kc_buf_put_u32(b, (uint32_t)(int32_t)x->status);
    kc_buf_put_u8(b, (uint8_t)x->merged);
    put_blob(b, &x->out);
    put_blob(b, &x->err);
    kc_buf_put_u8(b, (uint8_t)x->wrote);
    put_blob(b, &x->file);
    return b->err ? -ENOMEM : 0;
}

static int get_blob(struct kc_rd *r, struct kc_buf *v)
{
    uint64_t n = kc_rd_get_u64(r);
    if (n > kc_rd_left(r))
        return -EINVAL;
    const unsigned char *p = kc_rd_take(r, (size_t)n);
    if (p == NULL && n > 0)
        return -EINVAL;
    kc_buf_add(v, p, (size_t)n);
    return v->err ? -ENOMEM : 0;
}

static int record_decode(const void *p, size_t n, struct record *x)
{
    memset(x, 0, sizeof *x);
    struct kc_rd r;
    kc_rd_init(&r, p, n);
    if (kc_rd_get_u64(&r) != TOOL_MAGIC)
        return -EINVAL;
    x->status = (int)(int32_t)kc_rd_get_u32(&r);
    x->merged = kc_rd_get_u8(&r);
    int rc = get_blob(&r, &x->out);
    if (rc == 0)
        rc = get_blob(&r, &x->err);
    x->wrote = kc_rd_get_u8(&r);
    if (rc == 0)
        rc = get_blob(&r, &x->file);
    if (rc == 0 && (kc_rd_end(&r) != 0 || x->status < 0 || x->status > 255 || x->merged > 1 ||
                    x->wrote > 1 || (x->merged && x->err.len != 0)))
        rc = -EINVAL;
    if (rc != 0)
        record_free(x);
    return rc;
}

/* ---- replay ------------------------------------------------------------------------------ */

/* This process's umask, read without changing it (/proc), else by umask(2)
 * (no other thread runs before main). */
mode_t kc__tool_umask(void)
{
    mode_t m = umask(022);
    umask(m);
    return m;
}

/* Writes `bytes` to `path` whole or not at all: a temporary file beside it,
 * renamed over it. Its mode is the one the tool's open(O_CREAT|O_TRUNC,
 * 0666) would leave: an existing file's own, else 0666 less the umask.
 * 0, or negative errno (nothing is left behind). */
int kc__tool_output_write(const char *path, const struct kc_buf *bytes)
{
    struct stat st;
    mode_t mode;
    if (stat(path, &st) == 0) {
        if (!S_ISREG(st.st_mode))
            return -EINVAL; /* /dev/stdout, a FIFO: the tool's own writes */
        mode = st.st_mode & 07777;
    } else if (errno == ENOENT) {
        mode = 0666 & ~kc__tool_umask();
    } else {
        return -errno;
    }
    char tmp[PATH_MAX];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.kcache-%ld-%llx", path, (long)getpid(),
                         (unsigned long long)kc_mono_ns()) >= sizeof tmp)
        return -ENAMETOOLONG;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -errno;
    int rc = kc__write_full(fd, bytes->p, bytes->len);
    if (rc == 0 && fchmod(fd, mode) != 0)
        rc = -errno;
    if (close(fd) != 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, path) != 0)
        rc = -errno;
    if (rc != 0)
        unlink(tmp);
    return rc;
}

/* Whether the directory `path` would be created in exists and this
 * process may create files there. */
bool kc__tool_output_dir_writable(const char *path)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (slash == NULL)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else if ((size_t)(slash - path) < sizeof dir)
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    else
        return false;
    struct stat st;
    return stat(dir, &st) == 0 && S_ISDIR(st.st_mode) && access(dir, W_OK | X_OK) == 0;
}

/* Serves the run from x: its output file, its streams, its status. Returns
 * only when nothing was written yet and the tool must run (a negative
 * errno); otherwise exits. */
static int replay(const struct run *r, const struct record *x, struct kc_counters *c)
{
    if (x->wrote) {
        int rc = kc__tool_output_write(r->output, &x->file);
        if (rc != 0)
            return rc;
    } else {
        /* The tool failed before writing: an output there now would be
         * the tool's to keep or remove, which the record does not say. */
        struct stat st;
        if (lstat(r->output, &st) == 0)
            return -EEXIST;
        /* A failure is the input's only where the output could have been
         * written (stored so): else the tool's own error is another. */
        if (!kc__tool_output_dir_writable(r->output))
            return -EACCES;
    }
    c->hits = 1;
    kc__count(BACKEND, c);
    (void)kc__write_full(STDOUT_FILENO, x->out.p, x->out.len);
    (void)kc__write_full(STDERR_FILENO, x->err.p, x->err.len);
    kc__exit(x->status);
}

/* ---- a miss: the tool runs as a child, watched ----------------------------------------- */

static pid_t child_pid = -1;

static void forward(int sig)
{
    if (child_pid > 0)
        kill(child_pid, sig);
}

/* In the child: what it opened, handed to the parent at exit. */
static struct kc__deps child_deps;
static int report_fd = -1;

static void child_report(void)
{
    kc__deps_end_process(); /* no thread adds to child_deps from here */
    struct kc_buf b = {0};
    kc_buf_put_u8(&b, child_deps.failed || child_deps.unkeyable);
    kc_buf_put_u64(&b, child_deps.n);
    for (size_t i = 0; i < child_deps.n; i++) {
        kc_buf_put_u8(&b, (uint8_t)child_deps.v[i].kind);
        kc_buf_put_u64(&b, strlen(child_deps.v[i].path));
        kc_buf_add(&b, child_deps.v[i].path, strlen(child_deps.v[i].path));
    }
    if (!b.err)
        (void)kc__write_full(report_fd, b.p, b.len);
    kc_buf_free(&b);
    close(report_fd);
}

/* Whether the paths name one file as the tool would open them (the same
 * string, or the same inode). */
bool kc__tool_same_path(const char *a, const char *b)
{
    if (strcmp(a, b) == 0)
        return true;
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* Checks the child's report: it opened its inputs and its output, and
 * nothing else that decides an output. Returns NULL when it did, else what
 * it did (for the log). */
static const char *report_check(const struct run *r, const struct kc_buf *rep, bool *wrote)
{
    struct kc_rd rd;
    kc_rd_init(&rd, rep->p, rep->len);
    if (rep->len == 0)
        return "the run left no report";
    if (kc_rd_get_u8(&rd) != 0)
        return "the run could not be followed";
    uint64_t n = kc_rd_get_u64(&rd);
    const char *bad = NULL;
    *wrote = false;
    for (uint64_t i = 0; i < n && bad == NULL; i++) {
        int kind = kc_rd_get_u8(&rd);
        uint64_t len = kc_rd_get_u64(&rd);
        if (len > kc_rd_left(&rd) || len >= PATH_MAX)
            return "a bad report";
        char path[PATH_MAX];
        memcpy(path, kc_rd_take(&rd, (size_t)len), (size_t)len);
        path[len] = '\0';
        if (kind == KC_DEP_WRITTEN) {
            if (kc__tool_same_path(path, r->output))
                *wrote = true;
            else
                bad = "it wrote a file other than its output";
            continue;
        }
        bool known = strcmp(path, r->output) == 0;
        for (int k = 0; k < r->n_inputs && !known; k++)
            known = kc__tool_same_path(path, r->inputs[k]);
        if (!known && kind == KC_DEP_FILE)
            bad = "it read a file other than its inputs";
        else if (!known)
            bad = "it looked for a file other than its inputs";
    }
    if (bad == NULL && kc_rd_end(&rd) != 0)
        return "a bad report";
    return bad;
}

/* Copies the watched child's pipes through (cap[i].to, -1: kept only)
 * and keeps their bytes, until every pipe is closed. */
void kc__tool_pump(pid_t pid, struct kc__capture *cap, int n, bool *out_broken, bool *err_broken)
{
    char buf[65536];
    for (;;) {
        struct pollfd pf[KC__PUMP_MAX];
        int map[KC__PUMP_MAX], np = 0;
        for (int i = 0; i < n; i++)
            if (cap[i].fd >= 0) {
                pf[np] = (struct pollfd){.fd = cap[i].fd, .events = POLLIN};
                map[np++] = i;
            }
        if (np == 0)
            break;
        if (poll(pf, (nfds_t)np, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        for (int k = 0; k < np; k++) {
            if (pf[k].revents == 0)
                continue;
            struct kc__capture *cp = &cap[map[k]];
            ssize_t got = read(cp->fd, buf, sizeof buf);
            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0) {
                close(cp->fd);
                cp->fd = -1;
                continue;
            }
            if (cp->to >= 0) {
                bool *broken = cp->to == STDOUT_FILENO ? out_broken : err_broken;
                int wrc = *broken ? 0 : kc__write_full(cp->to, buf, (size_t)got);
                if (wrc != 0)
                    *broken = true;
                /* The reader went away: the tool itself would have died
                 * of SIGPIPE writing there, so it does (and so do we). */
                if (wrc == -EPIPE)
                    kill(pid, SIGPIPE);
            }
            if (cp->b->len + (size_t)got > MAX_STREAM)
                cp->over = true;
            else
                kc_buf_add(cp->b, buf, (size_t)got);
        }
    }
}

/* Runs the tool in a child and waits for it, copying its streams through.
 * Returns in the child (0: the tool's main runs next). In this process,
 * exits with the child's status once it is stored (or not). */
static int supervise(const struct run *r, bool merged, struct kc_store *st,
                     const struct kc_store_ops *api, const char *ns, const kc_key *key, int flight,
                     bool rheld, struct kc_counters *c)
{
    int outp[2] = {-1, -1}, errp[2] = {-1, -1}, rep[2] = {-1, -1};
    pid_t parent = getpid(), pid = -1;
    if (pipe2(outp, O_CLOEXEC) == 0 && (merged || pipe2(errp, O_CLOEXEC) == 0) &&
        pipe2(rep, O_CLOEXEC) == 0) {
        fflush(NULL);
        pid = fork();
    }
    if (pid < 0) {
        int e = errno;
        int all[] = {outp[0], outp[1], errp[0], errp[1], rep[0], rep[1]};
        for (int i = 0; i < 6; i++)
            if (all[i] >= 0)
                close(all[i]);
        return -e;
    }
    if (pid == 0) {
        /* The child: the tool. It dies with this process. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        kc__flight_release(flight); /* the parent's to hold; this is a copy */
        dup2(outp[1], STDOUT_FILENO);
        dup2(merged ? outp[1] : errp[1], STDERR_FILENO);
        close(outp[0]);
        close(outp[1]);
        if (!merged) {
            close(errp[0]);
            close(errp[1]);
        }
        close(rep[0]);
        report_fd = rep[1];
        kc__tool_child();
        kc__deps_begin_process(&child_deps);
        atexit(child_report);
        return 0;
    }
    /* This process: the tool's streams copied through and kept. */
    close(outp[1]);
    if (!merged)
        close(errp[1]);
    close(rep[1]);
    child_pid = pid;
    struct sigaction sa = {.sa_handler = forward}, old[4];
    sigemptyset(&sa.sa_mask);
    const int fwd[4] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
    for (int i = 0; i < 4; i++)
        sigaction(fwd[i], &sa, &old[i]);
    signal(SIGPIPE, SIG_IGN);
    struct record x = {.merged = merged};
    struct kc_buf report = {0};
    struct kc__capture cap[3] = {{outp[0], STDOUT_FILENO, &x.out, false},
                                 {merged ? -1 : errp[0], STDERR_FILENO, &x.err, false},
                                 {rep[0], -1, &report, false}};
    uint64_t t0 = kc_mono_ns();
    char buf[65536];
    bool out_broken = false, err_broken = false;
    kc__tool_pump(pid, cap, 3, &out_broken, &err_broken);
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR)
        ;
    uint64_t took = kc_mono_ns() - t0;
    for (int i = 0; i < 4; i++)
        sigaction(fwd[i], &old[i], NULL);
    child_pid = -1;

    const char *why_not = NULL;
    bool wrote = false;
    if (!WIFEXITED(ws))
        why_not = "the tool was killed";
    else if (cap[0].over || cap[1].over || x.out.err || x.err.err || report.err)
        why_not = "its output was too large to keep";
    else if (out_broken || err_broken)
        why_not = "its standard streams could not be written";
    else
        why_not = report_check(r, &report, &wrote);
    if (why_not == NULL) {
        x.status = WEXITSTATUS(ws);
        if (x.status == 0 && !wrote)
            why_not = "it exited without writing its output";
        else if (x.status != 0 && wrote)
            why_not = "it failed after writing its output";
        else if (x.status != 0 && !kc__tool_output_dir_writable(r->output))
            why_not = "it failed where its output could not be written";
    }
    if (why_not == NULL && wrote) {
        x.wrote = 1;
        int fd = open(r->output, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
        struct stat fst;
        if (fd < 0 || fstat(fd, &fst) != 0 || !S_ISREG(fst.st_mode))
            why_not = "its output is not a regular file";
        else {
            for (;;) {
                ssize_t got = read(fd, buf, sizeof buf);
                if (got < 0 && errno == EINTR)
                    continue;
                if (got < 0)
                    why_not = "its output could not be read";
                if (got <= 0)
                    break;
                kc_buf_add(&x.file, buf, (size_t)got);
            }
            if (x.file.err)
                why_not = "its output was too large to keep";
        }
        if (fd >= 0)
            close(fd);
    }
    c->misses = 1;
    c->compile_ns = took;
    size_t stored_len = 0;
    if (why_not == NULL && st != NULL && !kc__config()->readonly) {
        struct kc_buf b = {0};
        int prc = record_encode(&x, &b) == 0
                      ? api->put(st, ns, key, NULL, KC_KIND_BLOB, b.p, b.len, took)
                      : -ENOMEM;
        if (prc == 0) {
            c->stores = 1;
            stored_len = b.len;
        } else if (prc != -EDQUOT) {
            c->errors = 1;
            kc_log_once(KC_LOG_WARN, "cannot store a %s run (%s)", r->tool->id, strerror(-prc));
        }
        kc_buf_free(&b);
    } else if (why_not != NULL) {
        kc_log(KC_LOG_DEBUG, "%s run not stored: %s", r->tool->id, why_not);
    }
    if (st != NULL && !kc__config()->readonly)
        why_record(r, key, c->stores ? NULL : why_not ? why_not : "not stored", took);
    /* The cluster's waiters are served once the owner uploads it. */
    kc__flight_remote_release(ns, key, rheld, c->stores != 0, stored_len);
    kc__flight_release(flight);
    record_free(&x);
    kc_buf_free(&report);
    kc__count(BACKEND, c);
    if (WIFSIGNALED(ws)) {
        /* Die as the tool died, so that the caller sees the same status. */
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

/* ---- the executable's identity --------------------------------------------------------- */

/* A memo of executables' identities in DIR/tools/ (private): ptxas has no
 * build-id, and digesting its 35-50 MB costs more than the rest of a hit.
 * A memo file is named by the executable's device, inode, size, mtime and
 * ctime (ns) and holds them with the identity: any change to the file
 * changes its ctime, which no user can set back. A file changed within
 * the last 2 s is not memoized (a second write could share the ctime). */
struct id_memo {
    uint64_t magic;
    uint64_t fp[5];
    kc_digest id;
};
#define ID_MEMO_MAGIC 0x314449544b43ull /* "KCTID1" */

int kc__tool_identity(const struct kc_config *cfg, kc_digest *out)
{
    struct stat st;
    if (stat("/proc/self/exe", &st) != 0)
        return -errno;
    uint64_t fp[5] = {(uint64_t)st.st_dev, (uint64_t)st.st_ino, (uint64_t)st.st_size,
                      (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec,
                      (uint64_t)st.st_ctim.tv_sec * 1000000000ull + (uint64_t)st.st_ctim.tv_nsec};
    kc_digest name = kc_digest_of(fp, sizeof fp);
    char hex[33], dir[PATH_MAX], path[PATH_MAX];
    kc__digest_hex(&name, hex);
    bool named = cfg->dir[0] == '/' &&
                 (size_t)snprintf(dir, sizeof dir, "%s/tools", cfg->dir) < sizeof dir &&
                 (size_t)snprintf(path, sizeof path, "%s/%s", dir, hex) < sizeof path;
    struct stat ds;
    bool private_dir = named && lstat(dir, &ds) == 0 && S_ISDIR(ds.st_mode) &&
                       ds.st_uid == geteuid() && (ds.st_mode & 077) == 0;
    if (private_dir) {
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        struct id_memo m;
        bool ok = fd >= 0 && read(fd, &m, sizeof m) == (ssize_t)sizeof m &&
                  m.magic == ID_MEMO_MAGIC && memcmp(m.fp, fp, sizeof fp) == 0;
        if (fd >= 0)
            close(fd);
        if (ok) {
            *out = m.id;
            return 0;
        }
    }
    int rc = kc__file_identity("/proc/self/exe", out);
    struct stat after;
    if (rc != 0 || stat("/proc/self/exe", &after) != 0 ||
        after.st_ctim.tv_sec != st.st_ctim.tv_sec || after.st_ctim.tv_nsec != st.st_ctim.tv_nsec ||
        !named || cfg->readonly)
        return rc;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (now.tv_sec - st.st_ctim.tv_sec < 2)
        return 0;
    if (!private_dir && (mkdir(dir, 0700) != 0 || lstat(dir, &ds) != 0 || !S_ISDIR(ds.st_mode) ||
                         ds.st_uid != geteuid() || (ds.st_mode & 077) != 0))
        return 0;
    struct id_memo m = {ID_MEMO_MAGIC, {0}, *out};
    memcpy(m.fp, fp, sizeof fp);
    char tmp[PATH_MAX];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.%ld", path, (long)getpid()) >= sizeof tmp)
        return 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return 0;
    bool ok = write(fd, &m, sizeof m) == (ssize_t)sizeof m;
    if (close(fd) != 0 || !ok || rename(tmp, path) != 0)
        unlink(tmp);
    return 0;
}

/* ---- the entry ------------------------------------------------------------------------- */

struct lookup {
    struct kc_store *st;
    const struct kc_store_ops *api;
    const char *ns;
    const kc_key *key;
    struct kc_counters *c;
    const struct tool *t;
    struct record x; /* what a lookup found */
};

/* Looks the run up in the chain (the remote too): 1 when found (in
 * l->x), 0 when not (a record that does not parse is purged). Also
 * kc__flight_remote's poll. */
static int lookup_once(void *arg)
{
    struct lookup *l = arg;
    void *body = NULL;
    size_t len = 0;
    struct kc_record_info info = {0};
    if (l->api->get(l->st, l->ns, l->key, &body, &len, &info) != 0)
        return 0;
    int drc = record_decode(body, len, &l->x);
    l->api->free(body);
    if (drc != 0) {
        kc_log(KC_LOG_WARN, "a cached %s run could not be read; running it", l->t->id);
        l->api->purge(l->st, l->ns, l->key);
        l->c->errors++;
        return 0;
    }
    l->c->saved_ns = info.saved_ns;
    return 1;
}

static void pass(struct kc_counters *c, int why)
{
    kc__pass_reason(BACKEND, (enum kc_pass_reason)why);
    c->passthrough = 1;
    kc__count(BACKEND, c);
}

/* The tool's namespace: "tool:<id>-<16 hex digits of its identity>-f1". */
static void tool_ns(const struct tool *t, const kc_digest *id, char *ns, size_t n)
{
    char hex[33];
    kc__digest_hex(id, hex);
    snprintf(ns, n, "tool:%s-%.16s-f1", t->id, hex);
}

void kc__tool_start(int argc, char **argv)
{
    const struct tool *t = argc > 0 && argv != NULL ? tool_named(argv[0]) : NULL;
    if (t == NULL)
        return;
    const struct kc_config *cfg = kc__config();
    if (cfg->disable || !cfg->tools)
        return;
    struct kc_counters c = {0};
    struct run r = {.tool = t, .argc = argc, .argv = argv};
    int why = parse(&r);
    if (why >= 0) {
        pass(&c, why);
        free(r.role);
        return;
    }
    /* The store first (its directory made, before the memo below goes
     * into it); without one the tool runs as it is. */
    const struct kc_store_ops *api = NULL;
    struct kc_store *st = kc__store(&api);
    if (st == NULL) {
        free(r.role);
        return;
    }
    /* The executable's identity: its build-id, else its contents. */
    kc_digest id;
    if (kc__tool_identity(cfg, &id) != 0) {
        pass(&c, KC_PASS_internal);
        free(r.role);
        return;
    }
    /* A closed standard stream would be taken by the pipes of a watched
     * run: such a run is left to the tool. */
    if (fcntl(STDOUT_FILENO, F_GETFD) < 0 || fcntl(STDERR_FILENO, F_GETFD) < 0) {
        pass(&c, KC_PASS_input);
        free(r.role);
        return;
    }
    bool merged = kc__tool_same_stream(STDOUT_FILENO, STDERR_FILENO);
    kc_digest kd;
    why = run_key(&r, &id, merged, &kd);
    if (why >= 0) {
        pass(&c, why);
        free(r.role);
        return;
    }
    char ns[96];
    tool_ns(t, &id, ns, sizeof ns);
    kc_key key = {.id = kd, .build = kc__self_build()};
    struct lookup lk = {st, api, ns, &key, &c, t, {0}};
    int flight = -1;
    bool rheld = false, found = false;
    for (int round = 0; !cfg->recache && round < 2 && !found; round++) {
        found = lookup_once(&lk) == 1;
        if (!found && round == 0) {
            /* Single flight: one process runs a missed key, the others
             * wait for it and are served its result; then one node of
             * those that share a remote. */
            bool waited = false;
            flight = kc__flight_acquire(&kd, &waited);
            if (flight < 0 && !waited)
                break;
        }
    }
    if (!found && !cfg->recache)
        found = kc__flight_remote(ns, &key, lookup_once, &lk, &rheld) == 1;
    if (found) {
        kc__flight_release(flight);
        int rrc = replay(&r, &lk.x, &c); /* exits on success */
        record_free(&lk.x);
        kc_log(KC_LOG_DEBUG, "a cached %s run cannot be replayed here (%s); running it", t->id,
               strerror(-rrc));
        pass(&c, rrc == -EEXIST ? KC_PASS_order : KC_PASS_input);
        free(r.role);
        return;
    }
    if (supervise(&r, merged, st, api, ns, &key, flight, rheld, &c) != 0) {
        /* No child could be made: the tool runs here, unwatched. */
        kc__flight_remote_release(ns, &key, rheld, false, 0);
        kc__flight_release(flight);
        pass(&c, KC_PASS_internal);
    }
    free(r.role);
}
