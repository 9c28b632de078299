/*
 * The NVRTC cache.
 *
 * Every program the host creates gets a shadow: its source, name, headers
 * and name expressions. nvrtcCompileProgram keys the request, and on a hit
 * the real program is left uncompiled and the shadow is "served": every
 * getter answers from the stored replay record, which holds exactly what
 * NVRTC's own getters returned when the artifact was compiled (return codes
 * included, and whether a size was written at all). Handles the shim does
 * not know, and programs not served, go to the real NVRTC untouched, so
 * invalid input gets NVRTC's own answer.
 *
 * Header files read from disk are covered by a manifest (deps.h): the key
 * of the request without them ("base") names a manifest listing, for each
 * set of files seen, the files' digests and the absent paths probed; the
 * artifact's key is the base plus the digests of the set that still holds.
 */
#include "codec.h"
#include "deps.h"
#include "flight.h"
#include "manifest.h"
#include "shim.h"
#include "why.h"
#include "../store/local/chain.h"
#include "../store/remote/remote.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define BACKEND "nvrtc"

/* ---- real functions ------------------------------------------------------ */

KC__HOT static nvrtcResult (*real_create)(nvrtcProgram *, const char *, const char *, int,
                                          const char *const *, const char *const *);
KC__HOT static nvrtcResult (*real_destroy)(nvrtcProgram *);
KC__HOT static nvrtcResult (*real_compile)(nvrtcProgram, int, const char *const *);
KC__HOT static nvrtcResult (*real_add_name)(nvrtcProgram, const char *);
KC__HOT static nvrtcResult (*real_lowered)(nvrtcProgram, const char *, const char **);
KC__HOT static nvrtcResult (*real_ptx_size)(nvrtcProgram, size_t *);
KC__HOT static nvrtcResult (*real_ptx)(nvrtcProgram, char *);
KC__HOT static nvrtcResult (*real_cubin_size)(nvrtcProgram, size_t *);
KC__HOT static nvrtcResult (*real_cubin)(nvrtcProgram, char *);
KC__HOT static nvrtcResult (*real_ltoir_size)(nvrtcProgram, size_t *);
KC__HOT static nvrtcResult (*real_ltoir)(nvrtcProgram, char *);
KC__HOT static nvrtcResult (*real_optix_size)(nvrtcProgram, size_t *);
KC__HOT static nvrtcResult (*real_optix)(nvrtcProgram, char *);
KC__HOT static nvrtcResult (*real_nvvm_size)(nvrtcProgram, size_t *); /* 11.x, 12.x */
KC__HOT static nvrtcResult (*real_nvvm)(nvrtcProgram, char *);
KC__HOT static nvrtcResult (*real_tileir_size)(nvrtcProgram, size_t *); /* 13.3+ */
KC__HOT static nvrtcResult (*real_tileir)(nvrtcProgram, char *);
KC__HOT static nvrtcResult (*real_log_size)(nvrtcProgram, size_t *);
KC__HOT static nvrtcResult (*real_log)(nvrtcProgram, char *);
KC__HOT static nvrtcResult (*real_pch_status)(nvrtcProgram);
KC__HOT static nvrtcResult (*real_pch_required)(nvrtcProgram, size_t *);
KC__HOT static nvrtcResult (*real_flow_callback)(nvrtcProgram, int (*)(void *, void *), void *);
KC__HOT static nvrtcResult (*real_version)(int *, int *);

/* Resolves a real function, or returns NVRTC_ERROR_INTERNAL_ERROR from the
 * wrapper when no real NVRTC is loaded (cannot happen for a host that got
 * the wrapper through the dynamic linker or dlsym). */
#define REAL_OR_FAIL(var, name)                                                                    \
    do {                                                                                           \
        if (var == NULL) {                                                                         \
            const struct kc__hook *h_ = kc__hook_find(name, KC_LIB_NVRTC);                         \
            var = (__typeof__(var))(h_ ? kc__hook_real(h_) : NULL);                                \
            if (var == NULL)                                                                       \
                return NVRTC_ERROR_INTERNAL_ERROR;                                                 \
        }                                                                                          \
    } while (0)

/* ---- shadows of the host's programs ------------------------------------------ */

/* The host's inputs to nvrtcCreateProgram (source, name, headers, include
 * names), copied at create: the host may free its buffers once create
 * returns, and a later miss or getter gives them to NVRTC. One block for
 * all of them (libmathdx's programs hold 1186 headers, 120 MB: one
 * allocation, huge pages, one unmap, instead of as many of each), made in
 * the same pass that hashes them for the key (prefix), and shared, never
 * written, by every copy of the program (prog_copy). */
struct inputs {
    unsigned refs; /* atomic */
    size_t mapped; /* > 0: block is an mmap of this many bytes; else malloc'd */
    void *map;     /* the mapping's start (block is aligned inside it) */
    char *block;
    /* The key's hash state after the inputs (base_key's prefix), or NULL:
     * NVRTC's identity was not known at create (hashed at compile then). */
    struct kc__hasher *prefix;
};

struct prog {
    nvrtcProgram h; /* the host's handle */
    /* NVRTC's program. When own, h is kcache's (the struct itself) and
     * NVRTC has not seen the program: real stays NULL until a call needs
     * it (a miss, a call no record answers), then is made from the inputs
     * recorded here. Otherwise real == h. */
    nvrtcProgram real;
    bool own;
    struct inputs *in; /* src, name, headers and include_names point into it */
    char *src, *name;
    int n_headers;
    char **headers, **include_names;
    int n_exprs;
    char **exprs;
    int has_callback;
    struct kc__replay *served; /* non-NULL: the last compile was served */
    /* A program's first compile only is keyed: a later one meets what the
     * earlier left (NVRTC keeps a cubin or LTO IR a compile did not
     * produce, and "compiled" for name expressions), so it runs on the
     * real program, after the served compile's options (served_opts) are
     * replayed there for real. */
    int compiles;
    bool replay_due; /* the first compile was served */
    int served_n;
    char **served_opts;
    /* Records no longer served whose lowered names the host may still
     * hold: nvrtcGetLoweredName's answer lives until nvrtcDestroyProgram,
     * whatever is compiled meanwhile (retire()). */
    struct retired *retired;
    struct prog *next;
};

struct retired {
    struct kc__replay *r;
    struct retired *next;
};

#define PROG_BUCKETS 1024
static struct prog *progs[PROG_BUCKETS];
KC__HOT static pthread_mutex_t progs_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t bucket(nvrtcProgram h)
{
    return ((uintptr_t)h >> 4) % PROG_BUCKETS;
}

static void opts_free(int n, char **v)
{
    for (int i = 0; v != NULL && i < n; i++)
        free(v[i]);
    free(v);
}

/* A copy of n options (none NULL), or NULL (out of memory, or n == 0). */
static char **opts_copy(int n, const char *const *o)
{
    char **v = n > 0 ? calloc((size_t)n, sizeof *v) : NULL;
    for (int i = 0; v != NULL && i < n; i++)
        if ((v[i] = strdup(o[i])) == NULL) {
            opts_free(i, v);
            v = NULL;
        }
    return v;
}

/* Big inputs get a mapping of their own, asked for huge pages: a fresh
 * process's first program faults its pages in 2 MiB at a time. */
#define INPUTS_MAP_MIN (4u << 20)
#define INPUTS_HUGE (2u << 20)

static void inputs_release(struct inputs *in)
{
    if (in == NULL || __atomic_sub_fetch(&in->refs, 1, __ATOMIC_ACQ_REL) > 0)
        return;
    if (in->mapped > 0)
        munmap(in->map, in->mapped);
    else
        free(in->block);
    kc__hasher_free(in->prefix);
    free(in);
}

/* A block of n bytes for inputs, or -ENOMEM. */
static int inputs_alloc(struct inputs *in, size_t n)
{
    if (n < INPUTS_MAP_MIN) {
        in->block = malloc(n);
        return in->block != NULL ? 0 : -ENOMEM;
    }
    /* Rounded up, and a huge page more, so an aligned start fits. */
    size_t len = ((n + INPUTS_HUGE - 1) & ~(size_t)(INPUTS_HUGE - 1)) + INPUTS_HUGE;
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return -ENOMEM;
    uintptr_t a = ((uintptr_t)m + INPUTS_HUGE - 1) & ~(uintptr_t)(INPUTS_HUGE - 1);
    (void)madvise((void *)a, len - (a - (uintptr_t)m), MADV_HUGEPAGE); /* a hint */
    in->map = m;
    in->mapped = len;
    in->block = (char *)a;
    return 0;
}

/* One string of the inputs into the block at *at (advanced), hashed into h
 * (NULL: copied only) as kc__hash_str would; NULL stays NULL. */
static char *inputs_put(struct kc__hasher *h, char **at, const char *s, size_t len)
{
    if (s == NULL) {
        if (h != NULL)
            kc__hash_u64(h, UINT64_MAX);
        return NULL;
    }
    char *d = *at;
    kc__hash_copy(h, d, s, len);
    d[len] = '\0';
    *at += len + 1;
    return d;
}

static void prog_free(struct prog *p)
{
    if (p == NULL)
        return;
    inputs_release(p->in);
    free(p->headers);
    free(p->include_names);
    for (int i = 0; i < p->n_exprs; i++)
        free(p->exprs[i]);
    free(p->exprs);
    kc__replay_free(p->served);
    while (p->retired != NULL) {
        struct retired *t = p->retired;
        p->retired = t->next;
        kc__replay_free(t->r);
        free(t);
    }
    opts_free(p->served_n, p->served_opts);
    free(p);
}

/* Takes p's served record away (p->served becomes NULL). The pointers
 * nvrtcGetLoweredName handed out from it stay valid until the program is
 * destroyed, as NVRTC's own do: a record that has lowered names is kept,
 * its outputs released. Called with progs_lock held (or p not yet
 * shared). */
static void retire(struct prog *p)
{
    struct kc__replay *r = p->served;
    p->served = NULL;
    if (r == NULL)
        return;
    bool named = false;
    for (uint32_t i = 0; i < r->n_names; i++)
        named |= r->names[i].name != NULL;
    struct retired *t = named ? malloc(sizeof *t) : NULL;
    if (t == NULL) {
        if (named) {
            /* Out of memory: the names are kept, unowned, rather than
             * freed under the host (a leak, never a dangling pointer). */
            r->n_names = 0;
            r->names = NULL;
        }
        kc__replay_free(r);
        return;
    }
    kc__replay_drop_outputs(r);
    t->r = r;
    t->next = p->retired;
    p->retired = t;
}

/* Finds the shadow of h. Called with progs_lock held. */
static struct prog *find_locked(nvrtcProgram h)
{
    struct prog *p = progs[bucket(h)];
    while (p != NULL && p->h != h)
        p = p->next;
    return p;
}

static void *sibling(const char *name);

/* NVRTC's program for p, created from the recorded inputs and name
 * expressions the first time a call needs one. NULL, with *err set to
 * NVRTC's answer, when NVRTC refuses (out of memory). progs_lock held. */
static nvrtcProgram real_prog_locked(struct prog *p, nvrtcResult *err)
{
    if (p->real != NULL || !p->own)
        return p->real;
    if (real_add_name == NULL)
        real_add_name = (__typeof__(real_add_name))sibling("nvrtcAddNameExpression");
    nvrtcProgram r = NULL;
    uint64_t t0 = kc__log_enabled(KC_LOG_DEBUG) ? kc_mono_ns() : 0;
    nvrtcResult rc = real_create(&r, p->src, p->name, p->n_headers, (const char *const *)p->headers,
                                 (const char *const *)p->include_names);
    if (rc != NVRTC_SUCCESS || r == NULL) {
        *err = rc != NVRTC_SUCCESS ? rc : NVRTC_ERROR_INTERNAL_ERROR;
        kc_log_once(KC_LOG_WARN, "NVRTC refused to create a program kcache had deferred (%d)",
                    (int)rc);
        return NULL;
    }
    for (int i = 0; i < p->n_exprs; i++)
        if (real_add_name != NULL)
            real_add_name(r, p->exprs[i]);
    p->real = r;
    if (t0 != 0)
        kc_log(KC_LOG_DEBUG, "nvrtc: NVRTC creates the program kcache kept (%s): %.3f ms",
               p->name != NULL ? p->name : "(no name)", (kc_mono_ns() - t0) / 1e6);
    return r;
}

/* kcache's handles the host destroyed lately: never given to NVRTC,
 * which would read freed memory as its own program (NVRTC itself
 * crashes on a program destroyed twice); they get NVRTC's answer to an
 * invalid program. progs_lock held for both. */
#define TOMBS 256
KC__HOT static nvrtcProgram tombs[TOMBS];
KC__HOT static unsigned tomb_next;

static void tomb_set(nvrtcProgram h, bool dead)
{
    /* Before the first destroy there is no tomb to clear (a fresh
     * process's first create reads none of the table). */
    for (unsigned i = 0; tomb_next != 0 && i < TOMBS; i++)
        if (tombs[i] == h) {
            tombs[i] = NULL;
            break;
        }
    if (dead)
        tombs[tomb_next++ % TOMBS] = h;
}

static bool tomb_is(nvrtcProgram h)
{
    for (unsigned i = 0; h != NULL && tomb_next != 0 && i < TOMBS; i++)
        if (tombs[i] == h)
            return true;
    return false;
}

/* The handle NVRTC knows for the host's h: h itself when it is not
 * kcache's. NULL with *err when NVRTC refused to create it, or h is a
 * handle of kcache's the host destroyed. */
static nvrtcProgram real_of(nvrtcProgram h, nvrtcResult *err)
{
    if (h == NULL)
        return h;
    pthread_mutex_lock(&progs_lock);
    struct prog *p = find_locked(h);
    nvrtcProgram r = p != NULL ? real_prog_locked(p, err) : h;
    if (p == NULL && tomb_is(h)) {
        r = NULL;
        *err = NVRTC_ERROR_INVALID_PROGRAM;
    }
    pthread_mutex_unlock(&progs_lock);
    return r;
}

/* real_of for a call that passes the handle on: the answer to give when
 * NVRTC could not be given one. */
#define REAL_HANDLE(h, var)                                                                        \
    nvrtcResult var##_err_ = NVRTC_SUCCESS;                                                        \
    nvrtcProgram var = real_of(h, &var##_err_);                                                    \
    if (h != NULL && var == NULL)                                                                  \
        return var##_err_;

static char *dup_or_null(const char *s, int *failed)
{
    if (s == NULL)
        return NULL;
    char *d = strdup(s);
    if (d == NULL)
        *failed = 1;
    return d;
}

static bool nvrtc_enabled(void)
{
    const struct kc_config *cfg = kc__config();
    return !cfg->disable && cfg->nvrtc;
}

/* The getters capture() calls, with the variables that hold them. */
#define NVRTC_GETTERS(X)                                                                           \
    X(real_ptx_size, "nvrtcGetPTXSize")                                                            \
    X(real_ptx, "nvrtcGetPTX")                                                                     \
    X(real_cubin_size, "nvrtcGetCUBINSize")                                                        \
    X(real_cubin, "nvrtcGetCUBIN")                                                                 \
    X(real_ltoir_size, "nvrtcGetLTOIRSize")                                                        \
    X(real_ltoir, "nvrtcGetLTOIR")                                                                 \
    X(real_optix_size, "nvrtcGetOptiXIRSize")                                                      \
    X(real_optix, "nvrtcGetOptiXIR")                                                               \
    X(real_nvvm_size, "nvrtcGetNVVMSize")                                                          \
    X(real_nvvm, "nvrtcGetNVVM")                                                                   \
    X(real_tileir_size, "nvrtcGetTileIRSize")                                                      \
    X(real_tileir, "nvrtcGetTileIR")                                                               \
    X(real_log_size, "nvrtcGetProgramLogSize")                                                     \
    X(real_log, "nvrtcGetProgramLog")                                                              \
    X(real_lowered, "nvrtcGetLoweredName")                                                         \
    X(real_add_name, "nvrtcAddNameExpression")                                                     \
    X(real_pch_status, "nvrtcGetPCHCreateStatus")                                                  \
    X(real_pch_required, "nvrtcGetPCHHeapSizeRequired")

enum {
#define X(var, name) G_##var,
    NVRTC_GETTERS(X)
#undef X
        N_GETTERS
};
_Static_assert(N_GETTERS <= 32, "one bit per getter");

/* The getters a program kcache keeps needs NVRTC to have. */
#define GETTERS_NEEDED                                                                             \
    (1u << G_real_ptx_size | 1u << G_real_ptx | 1u << G_real_log_size | 1u << G_real_log |         \
     1u << G_real_lowered | 1u << G_real_add_name)

/* Where each getter's real function is kept (its hook's `real`). */
static void **const getter_slots[N_GETTERS] = {
#define X(var, name) (void **)&var,
    NVRTC_GETTERS(X)
#undef X
};

/* kc__unknown_export's callback: the getters among the hooked exports
 * (complete unless an unknown export stopped the walk, and then no
 * program is kept or keyed). */
static void getter_exported(const struct kc__hook *h, void *arg)
{
    uint32_t *bits = arg;
    for (int i = 0; i < N_GETTERS; i++)
        if (h->real == getter_slots[i])
            *bits |= 1u << i;
}

/* ---- NVRTC's identity ----------------------------------------------------------- */

struct identity {
    int ready;
    int major;
    kc_digest digest;
    char ns[96];
    char unknown[128]; /* an entry point it exports that kcache does not know, or "" */
    uint32_t getters;  /* the getters it exports (getters_exported) */
};

/* Exports of NVRTC that are not hooks and touch no program's outputs. */
static const char *const nvrtc_inert[] = {
    "nvrtcGetErrorString",
    "nvrtcGetNumSupportedArchs",
    "nvrtcGetSupportedArchs",
    "nvrtcGetPCHHeapSize",
    "nvrtcSetPCHHeapSize",
    "nvrtcInstallBundledHeaders",
    "nvrtcRemoveBundledHeaders",
    "nvrtcGetBundledHeadersInfo",
    "__nvrtcCPEx",
    "__nvrtcNvvmHandle",
    NULL,
};

KC__HOT static struct identity ident;
KC__HOT static pthread_mutex_t ident_lock = PTHREAD_MUTEX_INITIALIZER;

/* NVRTC's identity: version, build-ids of libnvrtc and libnvrtc-builtins. */
static const struct identity *nvrtc_identity(void)
{
    if (__atomic_load_n(&ident.ready, __ATOMIC_ACQUIRE))
        return &ident;
    pthread_mutex_lock(&ident_lock);
    if (!ident.ready) {
        int major = 0, minor = 0;
        if (real_version == NULL)
            real_version = (__typeof__(real_version))sibling("nvrtcVersion");
        if (real_version != NULL)
            real_version(&major, &minor);
        if (kc__nvrtc_namespace((const void *)real_compile, major, minor, KC_FORMAT_VERSION,
                                ident.ns, sizeof ident.ns, &ident.digest) != 0) {
            pthread_mutex_unlock(&ident_lock);
            return NULL;
        }
        /* Forward safety: an entry point this build does not know may be a
         * getter a record could not answer. */
        char what[32];
        snprintf(what, sizeof what, "NVRTC %d.%d", major, minor);
        ident.getters = 0;
        kc__unknown_export((const void *)real_compile, KC_LIB_NVRTC, nvrtc_inert, what,
                           ident.unknown, getter_exported, &ident.getters);
        ident.major = major;
        __atomic_store_n(&ident.ready, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&ident_lock);
    return &ident;
}

/* The loaded NVRTC's major version (0 when unknown). */
static int nvrtc_major(void)
{
    const struct identity *id = nvrtc_identity();
    return id != NULL ? id->major : 0;
}

/* A record's lowered_null_name_rc when the NULL name was not probed. */
#define KC_LOWERED_NOT_PROBED (-0x4b43)

/* ---- keys ------------------------------------------------------------------------- */

/* Options whose effect is not just the output: PCH creation or use, time
 * traces written to disk. Such compiles pass through uncached. */
static bool side_effect_option(const char *o)
{
    static const char *bad[] = {"-pch", "--pch", "-create-pch", "--create-pch", "-use-pch",
                                "--use-pch", "-pch-dir", "--pch-dir", "-time", "--time",
                                "-fdevice-time-trace", "--fdevice-time-trace",
                                /* NVRTC 12.9+'s own cache (in the driver's
                                 * compute cache) writes its state into the
                                 * log: the first compile of a process logs
                                 * its set-up, later ones "already
                                 * initialized", and hits or misses. */
                                "-enable-cache-trace", "--enable-cache-trace"};
    if (o == NULL)
        return false;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        size_t n = strlen(bad[i]);
        if (strncmp(o, bad[i], n) == 0 && (o[n] == '\0' || o[n] == '=' || o[n] == '-'))
            return true;
    }
    return false;
}

/* Options with which NVRTC records the directory it runs in (measured, for
 * every option of NVRTC 13.0: docs/internals.md): line info and debug
 * info (the PTX's .file lines, the cubin's debug sections) join it with a
 * relative program name, in-memory header names and headers found through
 * relative paths; -G's compile unit and the LTO and OptiX IR hold it even
 * for an absolute name. NVRTC takes none of them with a value. */
static bool records_cwd(const char *o)
{
    static const char *const opts[] = {
        "-lineinfo", "--generate-line-info", "-G",        "--device-debug",
        "-dlto",     "--dlink-time-opt",     "-optix-ir", "--optix-ir"};
    for (size_t i = 0; i < sizeof opts / sizeof *opts; i++)
        if (strcmp(o, opts[i]) == 0)
            return true;
    return false;
}

/* Whether the request names the working directory itself (an option, the
 * program's name, source or headers hold it): then a path under it that
 * the compile named may be absolute as given, not made from a relative
 * one (kc__deps_note_cwd). */
static bool names_cwd(nvrtcProgram prog, int n_opts, const char *const *opts)
{
    char cwd[PATH_MAX];
    if (kc__cwd(cwd, sizeof cwd) != 0)
        return true;
    bool named = false;
    for (int i = 0; i < n_opts && !named; i++)
        named = strstr(opts[i], cwd) != NULL;
    pthread_mutex_lock(&progs_lock);
    const struct prog *p = find_locked(prog);
    if (p == NULL)
        named = true;
    for (int i = 0; p != NULL && !named && i < p->n_headers; i++)
        named = (p->headers[i] != NULL && strstr(p->headers[i], cwd) != NULL) ||
                (p->include_names[i] != NULL && strstr(p->include_names[i], cwd) != NULL);
    if (p != NULL && !named)
        named = (p->name != NULL && strstr(p->name, cwd) != NULL) ||
                (p->src != NULL && strstr(p->src, cwd) != NULL);
    pthread_mutex_unlock(&progs_lock);
    return named;
}

/* The request's key without the header files read (the manifest's name):
 * everything that decides the output, the working directory (kc__cwd)
 * included when an option makes NVRTC record it. -ENOENT when that directory cannot be
 * named (removed, too long): such compiles pass through. */
static const char *bundled_key_option(const char *o);

/* The key's first fields, before the program's inputs. */
static void key_head(struct kc__hasher *h, const struct identity *id)
{
    kc__hash_str(h, "kcache-nvrtc");
    kc__hash_u64(h, KC_FORMAT_VERSION);
    kc__hash_bytes(h, &id->digest, sizeof id->digest);
}

static int base_key(const struct prog *p, int n_opts, const char *const *opts, kc_digest *out)
{
    char cwd[PATH_MAX];
    cwd[0] = 0;
    for (int i = 0; i < n_opts && cwd[0] == 0; i++)
        if (records_cwd(opts[i]) && kc__cwd(cwd, sizeof cwd) != 0)
            return -ENOENT;
    const struct identity *id = nvrtc_identity();
    /* The inputs were hashed as create copied them (the same fields, in
     * the same order, with the same identity: it is read once). */
    const struct kc__hasher *prefix = p->in != NULL ? p->in->prefix : NULL;
    struct kc__hasher *h = prefix != NULL ? kc__hasher_dup(prefix) : kc__hasher_new();
    if (h == NULL || id == NULL) {
        kc__hasher_free(h);
        return -ENOMEM;
    }
    if (prefix == NULL) {
        key_head(h, id);
        kc__hash_str(h, p->src);
        kc__hash_str(h, p->name);
        kc__hash_u64(h, (uint64_t)p->n_headers);
        for (int i = 0; i < p->n_headers; i++) {
            kc__hash_str(h, p->headers[i]);
            kc__hash_str(h, p->include_names[i]);
        }
    }
    kc__hash_u64(h, (uint64_t)n_opts);
    for (int i = 0; i < n_opts; i++)
        kc__hash_str(h, bundled_key_option(opts[i]));
    kc__hash_u64(h, (uint64_t)p->n_exprs);
    for (int i = 0; i < p->n_exprs; i++)
        kc__hash_str(h, p->exprs[i]);
    if (cwd[0] != 0) {
        kc__hash_str(h, "cwd");
        kc__hash_str(h, cwd);
    }
    *out = kc__hash_digest(h);
    kc__hasher_free(h);
    return 0;
}

/* ---- NVRTC's bundled headers (13.3+) -------------------------------------------------- */

/* --use-bundled-headers=DIR installs the headers NVRTC carries in
 * libnvrtc-builtins into DIR (when its version marker is not there yet) and
 * adds -I DIR -I DIR/cccl. The headers are NVRTC's own, covered by its
 * identity, so DIR is not part of the key, unless an output names it:
 * measured with 13.5, line info (.file lines) and debug info name DIR's
 * headers, a diagnostic in one of them names its path in the log, and
 * __FILE__ in one of them (CCCL's device assertions) puts the path in the
 * PTX as bytes and in the LTO-IR, which is opaque. Those records are kept
 * under the base with DIR ("base1"); the others under the base without it,
 * which a fresh DIR per process (nvmath-python's) finds. Only the
 * "--use-bundled-headers=DIR" form exists (13.5 answers INVALID_OPTION to
 * "--use-bundled-headers" "DIR" and to "-use-bundled-headers=DIR"). */
#define BUNDLED_OPT "--use-bundled-headers="

static struct kc__replay *capture(const struct prog *p, nvrtcResult compile_rc);

struct bundled {
    const char *dir;   /* the request's DIR (in the host's options), or NULL */
    int opt;           /* its option */
    bool keyed;        /* every output may name DIR (line or debug info): base1 only */
    kc_digest base1;   /* the base with DIR */
    struct prog *copy; /* the program, for the witness compile */
    /* NVRTC's map of what DIR holds, when the shim's own install filled
     * it from empty in this call (kc__pristine_get), else NULL. */
    const struct kc__pristine *pristine;
    /* DIR as an earlier call of the process filled it: then pristine is
     * its map, answering for files proved unchanged since. */
    bool recalled;
    struct kc__pristine_proof proof;
    /* The lookups' checks of the headers read below DIR: how many, how
     * many of them the pristine map answered, how many were read. */
    uint64_t checked, mapped, read;
};

static const char *bundled_dir_of(const char *o)
{
    size_t n = sizeof BUNDLED_OPT - 1;
    return o != NULL && strncmp(o, BUNDLED_OPT, n) == 0 && o[n] != '\0' ? o + n : NULL;
}

/* An option as base_key hashes it: DIR left out. */
static const char *bundled_key_option(const char *o)
{
    return bundled_dir_of(o) != NULL ? BUNDLED_OPT "(bundled)" : o;
}

/* Finds the bundled headers option of a request. False when the request
 * cannot be cached: more than one. */
static bool bundled_find(int n, const char *const *opts, struct bundled *b)
{
    static const char *const lines[] = {"-lineinfo", "--generate-line-info", "-G",
                                        "--device-debug"};
    memset(b, 0, sizeof *b);
    bool info = false;
    for (int i = 0; i < n; i++) {
        const char *d = bundled_dir_of(opts[i]);
        if (d != NULL) {
            if (b->dir != NULL)
                return false;
            b->dir = d;
            b->opt = i;
        }
        for (size_t j = 0; j < sizeof lines / sizeof *lines; j++) {
            size_t l = strlen(lines[j]);
            if (strncmp(opts[i], lines[j], l) == 0 && (opts[i][l] == '\0' || opts[i][l] == '='))
                info = true;
        }
    }
    b->keyed = b->dir != NULL && info;
    return true;
}

static void bundled_base(struct bundled *b, const kc_digest *base)
{
    struct kc__hasher *h = kc__hasher_new();
    if (h == NULL) {
        b->keyed = true; /* base1 = base: never a record without DIR */
        b->base1 = *base;
        return;
    }
    kc__hash_bytes(h, base, sizeof *base);
    kc__hash_str(h, "bundled-headers-dir");
    kc__hash_str(h, b->dir);
    b->base1 = kc__hash_digest(h);
    kc__hasher_free(h);
}

/* A deep copy of a shadow's program (no handle, no record). */
static struct prog *prog_copy(const struct prog *p)
{
    struct prog *c = calloc(1, sizeof *c);
    int failed = c == NULL;
    if (failed)
        return NULL;
    /* The inputs are shared, not copied (never written once made). */
    c->in = p->in;
    if (c->in != NULL)
        __atomic_add_fetch(&c->in->refs, 1, __ATOMIC_RELAXED);
    c->src = p->src;
    c->name = p->name;
    c->headers = calloc(p->n_headers + 1, sizeof *c->headers);
    c->include_names = calloc(p->n_headers + 1, sizeof *c->include_names);
    c->exprs = calloc(p->n_exprs + 1, sizeof *c->exprs);
    failed |= c->headers == NULL || c->include_names == NULL || c->exprs == NULL;
    if (!failed) {
        c->n_headers = p->n_headers;
        memcpy(c->headers, p->headers, p->n_headers * sizeof *c->headers);
        memcpy(c->include_names, p->include_names, p->n_headers * sizeof *c->include_names);
    }
    for (int i = 0; i < p->n_exprs && !failed; i++, c->n_exprs++)
        c->exprs[i] = dup_or_null(p->exprs[i], &failed);
    if (failed) {
        prog_free(c);
        return NULL;
    }
    return c;
}

KC__HOT static nvrtcResult (*real_install)(const char *, unsigned int, const char **);
KC__HOT static nvrtcResult (*real_remove)(const char *, const char **);

/* Installs NVRTC's headers into dir as the compile would (only when they
 * are not there): a hit leaves DIR as the compile leaves it, and the
 * manifest's headers below DIR are checked there. */
static nvrtcResult bundled_install(const char *dir)
{
    if (real_install == NULL)
        real_install = (__typeof__(real_install))sibling("nvrtcInstallBundledHeaders");
    if (real_install == NULL)
        return NVRTC_ERROR_INTERNAL_ERROR;
    uint64_t t0 = kc_mono_ns();
    nvrtcResult rc = real_install(dir, 0, NULL);
    if (kc__log_enabled(KC_LOG_DEBUG))
        kc_log(KC_LOG_DEBUG, "nvrtc: bundled headers in %s: %d, %.1f ms", dir, (int)rc,
               (kc_mono_ns() - t0) / 1e6);
    return rc;
}

static bool outputs_equal(const struct kc__replay *a, const struct kc__replay *b)
{
    if (a->compile_rc != b->compile_rc || a->n_names != b->n_names)
        return false;
    for (int i = 0; i < N_OUT; i++) {
        const struct kc__output *x = &a->out[i], *y = &b->out[i];
        if (x->size_rc != y->size_rc || x->size != y->size || x->get_rc != y->get_rc ||
            x->nbytes != y->nbytes || (x->nbytes && memcmp(x->bytes, y->bytes, x->nbytes) != 0))
            return false;
    }
    for (uint32_t i = 0; i < a->n_names; i++)
        if (a->names[i].rc != b->names[i].rc || a->names[i].is_null != b->names[i].is_null ||
            (a->names[i].name && strcmp(a->names[i].name, b->names[i].name) != 0))
            return false;
    return true;
}

/* Whether an output we can read names dir: as text (log, PTX, line info,
 * the raw bytes of a cubin) or as the PTX initializer of a string
 * ("{47, 116, 109, 112, ...}"). */
static bool bundled_named(const struct kc__replay *r, const char *dir)
{
    size_t n = strlen(dir);
    /* At most 64 bytes of DIR, each ", 255" at the most. */
    char dec[5 * 64 + 8];
    size_t w = 0;
    for (size_t i = 0; i < n && i < 64 && w < sizeof dec; i++)
        w += (size_t)snprintf(dec + w, sizeof dec - w, i ? ", %u" : "%u",
                              (unsigned)(unsigned char)dir[i]);
    for (int i = 0; i < N_OUT; i++) {
        const struct kc__output *o = &r->out[i];
        if (o->nbytes >= n && memmem(o->bytes, o->nbytes, dir, n) != NULL)
            return true;
        if (i == OUT_PTX && o->nbytes > 0 && memmem(o->bytes, o->nbytes, dec, strlen(dec)) != NULL)
            return true;
    }
    return false;
}

/* The witness: the same request compiled with its headers installed in
 * another directory (made here, removed after). Whether every output is the
 * same: then none depends on DIR. Needed when an output is opaque
 * (LTO-IR, OptiX IR, Tile IR, NVVM, a cubin): 13.5's LTO-IR is encrypted,
 * and a __FILE__ of DIR's headers in it cannot be seen. */
static bool bundled_witness(const struct bundled *b, int n, const char *const *opts,
                            const struct kc__replay *r)
{
    const char *tmp = getenv("TMPDIR");
    char dir[PATH_MAX], opt[PATH_MAX + 32];
    if (b->copy == NULL ||
        (size_t)snprintf(dir, sizeof dir, "%s/kcache-bundled-XXXXXX",
                         tmp && tmp[0] == '/' ? tmp : "/tmp") >= sizeof dir ||
        mkdtemp(dir) == NULL)
        return false;
    bool same = false;
    const char **o = calloc(n, sizeof *o);
    nvrtcProgram h = NULL;
    struct prog *c = b->copy;
    if (o == NULL || bundled_install(dir) != NVRTC_SUCCESS ||
        real_create(&h, c->src, c->name, c->n_headers, (const char *const *)c->headers,
                    (const char *const *)c->include_names) != NVRTC_SUCCESS)
        goto done;
    for (int i = 0; i < n; i++)
        o[i] = opts[i];
    snprintf(opt, sizeof opt, BUNDLED_OPT "%s", dir);
    o[b->opt] = opt;
    for (int i = 0; i < c->n_exprs; i++)
        real_add_name(h, c->exprs[i]);
    nvrtcResult rc = real_compile(h, n, o);
    struct prog w = *c;
    w.h = w.real = h;
    struct kc__replay *r2 = capture(&w, rc);
    same = r2 != NULL && outputs_equal(r, r2);
    kc__replay_free(r2);
done:
    if (real_destroy == NULL)
        real_destroy = (__typeof__(real_destroy))sibling("nvrtcDestroyProgram");
    if (h != NULL && real_destroy != NULL)
        real_destroy(&h);
    free(o);
    if (real_remove == NULL)
        real_remove = (__typeof__(real_remove))sibling("nvrtcRemoveBundledHeaders");
    if (real_remove != NULL)
        real_remove(dir, NULL);
    if (rmdir(dir) != 0 && errno != ENOENT)
        kc_log_once(KC_LOG_WARN, "cannot remove %s (%s)", dir, strerror(errno));
    return same;
}

/* The base a compile's record is kept under. */
static const kc_digest *bundled_store_base(const struct bundled *b, const kc_digest *base, int n,
                                           const char *const *opts, const struct kc__replay *r)
{
    if (b->dir == NULL)
        return base;
    if (b->keyed || bundled_named(r, b->dir))
        return &b->base1;
    bool opaque = false;
    for (int i = 0; i < N_OUT; i++)
        if (i != OUT_PTX && i != OUT_LOG && r->out[i].nbytes > 1)
            opaque = true;
    if (opaque && !bundled_witness(b, n, opts, r)) {
        kc_log(KC_LOG_DEBUG, "nvrtc: an output depends on the bundled headers' directory");
        return &b->base1;
    }
    return base;
}

/* ---- manifests ----------------------------------------------------------------------- */

/* ---- capture ------------------------------------------------------------------------------ */

typedef nvrtcResult (*size_fn)(nvrtcProgram, size_t *);
typedef nvrtcResult (*get_fn)(nvrtcProgram, char *);

struct nv_pair {
    nvrtcProgram h;
    size_fn sz;
    get_fn g;
};

static int nv_size(void *ctx, size_t *n)
{
    const struct nv_pair *p = ctx;
    return p->sz(p->h, n);
}

static int nv_get(void *ctx, char *buf)
{
    const struct nv_pair *p = ctx;
    return p->g(p->h, buf);
}

static void capture_output(nvrtcProgram h, size_fn sz, get_fn g, struct kc__output *o)
{
    if (sz == NULL || g == NULL) {
        o->size_rc = o->get_rc = NVRTC_ERROR_INTERNAL_ERROR;
        return;
    }
    o->size_null_rc = sz(h, NULL);
    o->get_null_rc = g(h, NULL);
    struct nv_pair np = {h, sz, g};
    kc__capture_pair(&(struct kc__pair){nv_size, nv_get, &np}, NVRTC_SUCCESS,
                     NVRTC_ERROR_OUT_OF_MEMORY, o);
}

static struct kc__replay *capture(const struct prog *p, nvrtcResult compile_rc)
{
    struct kc__replay *r = calloc(1, sizeof *r);
    if (r == NULL)
        return NULL;
    nvrtcProgram h = p->real;
    r->compile_rc = compile_rc;
    capture_output(h, real_ptx_size, real_ptx, &r->out[OUT_PTX]);
    capture_output(h, real_cubin_size, real_cubin, &r->out[OUT_CUBIN]);
    capture_output(h, real_ltoir_size, real_ltoir, &r->out[OUT_LTOIR]);
    capture_output(h, real_optix_size, real_optix, &r->out[OUT_OPTIX]);
    capture_output(h, real_log_size, real_log, &r->out[OUT_LOG]);
    capture_output(h, real_nvvm_size, real_nvvm, &r->out[OUT_NVVM]);
    capture_output(h, real_tileir_size, real_tileir, &r->out[OUT_TILEIR]);
    r->names = calloc(p->n_exprs ? p->n_exprs : 1, sizeof *r->names);
    if (r->names == NULL)
        goto fail;
    for (int i = 0; i < p->n_exprs; i++) {
        struct kc__lowered *l = &r->names[i];
        r->n_names++;
        /* Whether NVRTC set the out-parameter, to a name or to NULL, or
         * left it as it was (a sentinel tells). */
        const char *const unset = (const char *)(uintptr_t)0x5a5a5a5a5a5a5a5aull;
        const char *out = unset;
        l->expr = strdup(p->exprs[i]);
        l->rc = real_lowered(h, p->exprs[i], &out);
        l->is_null = out == unset ? KC_LOWERED_UNTOUCHED : out == NULL;
        if (out == unset)
            out = NULL;
        l->name = out ? strdup(out) : NULL;
        if (l->expr == NULL || (out != NULL && l->name == NULL))
            goto fail;
    }
    const char *out = NULL;
    r->lowered_unknown_rc = real_lowered(h, "__kcache_not_a_name_expression__", &out);
    /* NVRTC 11.x throws (std::logic_error: the process aborts) on a NULL
     * name and writes through a NULL result: never probed there, and a
     * served program asks the real one, which does the same. */
    bool probe = nvrtc_major() >= 12;
    r->lowered_null_name_rc = probe ? (int)real_lowered(h, NULL, &out) : KC_LOWERED_NOT_PROBED;
    r->lowered_null_out_rc =
        probe ? (int)real_lowered(h, p->n_exprs ? p->exprs[0] : "__kcache_not_a_name_expression__",
                                  NULL)
              : KC_LOWERED_NOT_PROBED;
    r->pch_status_rc = real_pch_status ? real_pch_status(h) : NVRTC_ERROR_INTERNAL_ERROR;
    if (real_pch_required != NULL) {
        size_t n = (size_t)0x5a5a5a5a5a5a5a5aull;
        r->pch_required_rc = real_pch_required(h, &n);
        r->pch_required_set = n != (size_t)0x5a5a5a5a5a5a5a5aull;
        r->pch_required_null_rc = real_pch_required(h, NULL);
        r->pch_required = r->pch_required_set ? n : 0;
    } else {
        r->pch_required_rc = NVRTC_ERROR_INTERNAL_ERROR;
    }
    /* Last, because on an uncompiled program it would add a name. */
    r->add_after_rc = compile_rc == NVRTC_SUCCESS || compile_rc == NVRTC_ERROR_COMPILATION
                          ? real_add_name(h, "__kcache_probe__")
                          : NVRTC_SUCCESS;
    return r;
fail:
    kc__replay_free(r);
    return NULL;
}

/* A function of the NVRTC that real_compile came from, found even when the
 * host dlopen'd it privately and never asked for this one. */
static void *sibling(const char *name)
{
    const struct kc__hook *h = kc__hook_find(name, KC_LIB_NVRTC);
    void *p = h ? kc__hook_real(h) : NULL;
    if (p != NULL || real_compile == NULL)
        return p;
    Dl_info info;
    if (dladdr((void *)real_compile, &info) == 0 || info.dli_fname == NULL)
        return NULL;
    void *lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (lib == NULL)
        return NULL;
    p = kc__real_dlsym(lib, name);
    dlclose(lib);
    if (p != NULL && h != NULL) {
        void *expected = NULL;
        __atomic_compare_exchange_n(h->real, &expected, p, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE);
    }
    return p;
}

/* Which getters (1 << G_*) the loaded NVRTC exports: read once, with its
 * identity, from its dynamic symbol table, so that a hit asks the loader
 * for none of them and a name this release lacks (nvrtcGetNVVM in 13,
 * nvrtcGetTileIR before 13.3) is not looked for in every loaded object at
 * every compile. */
static uint32_t getters_exported(void)
{
    const struct identity *id = nvrtc_identity();
    return id != NULL ? id->getters : 0;
}

static bool getters_present(void)
{
    return (getters_exported() & GETTERS_NEEDED) == GETTERS_NEEDED;
}

/* Resolves every real getter capture() needs (a miss; a hit needs none),
 * each one the loaded NVRTC exports, once. */
static bool resolve_getters(void)
{
    static int done;
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    if (!__atomic_load_n(&done, __ATOMIC_ACQUIRE)) {
        uint32_t have = getters_exported();
        pthread_mutex_lock(&lock);
#define X(var, name)                                                                               \
    if (var == NULL && (have & 1u << G_##var) != 0)                                                \
        var = (__typeof__(var))sibling(name);
        NVRTC_GETTERS(X)
#undef X
        __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&lock);
    }
    return real_ptx_size && real_ptx && real_log_size && real_log && real_lowered && real_add_name;
}

/* ---- the hooks ------------------------------------------------------------------------------ */

/* Whether programs may be kept as kcache's until a call needs NVRTC's:
 * every function that takes a program is resolved, and NVRTC exports
 * none that kcache does not hook. */
static bool own_ok(void)
{
    if (!kc__config()->nvrtc_defer)
        return false;
#define H(var, name)                                                                               \
    if (var == NULL) {                                                                             \
        const struct kc__hook *h_ = kc__hook_find(name, KC_LIB_NVRTC);                             \
        var = (__typeof__(var))(h_ ? kc__hook_real(h_) : NULL);                                    \
    }
    H(real_compile, "nvrtcCompileProgram");
    H(real_destroy, "nvrtcDestroyProgram");
#undef H
    if (real_compile == NULL || real_destroy == NULL || !getters_present())
        return false;
    const struct identity *id = nvrtc_identity();
    return id != NULL && id->unknown[0] == '\0';
}

/* A program with this many headers or more (libmathdx's hold 1,186, 123
 * MB) is copied in one pass over the host's memory: into a reserved
 * mapping, each string's length taken right before it is copied and
 * hashed, so the copy reads it from cache. Sizing the block first read
 * all 123 MB once more (10-12 ms of an nvmath FFT hit's create, issue 50).
 * The reservation is address space only (PROT_NONE: no commit charge,
 * where overcommit is strict), made writable INPUTS_GROW at a time as the
 * copy reaches it. Inputs past it (or a refusal) take the two passes. */
#define INPUTS_ONE_PASS_HEADERS 16
#define INPUTS_RESERVE (1ull << 30)
#define INPUTS_GROW (32u << 20)

/* The one-pass copy (above) of p's inputs into in, hashed into h (NULL:
 * copied only). 0; -ENOSPC (past the reservation) or -ENOMEM, with
 * nothing of in made (p's header arrays may be). */
static int inputs_one_pass(struct prog *p, struct inputs *in, struct kc__hasher *h, const char *src,
                           const char *name, int nh, const char *const *headers,
                           const char *const *names)
{
    size_t len = INPUTS_RESERVE + INPUTS_HUGE;
    void *m = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return -ENOMEM;
    uintptr_t a = ((uintptr_t)m + INPUTS_HUGE - 1) & ~(uintptr_t)(INPUTS_HUGE - 1);
    (void)madvise((void *)a, len - (a - (uintptr_t)m), MADV_HUGEPAGE); /* a hint */
    char *at = (char *)a, *rw = (char *)a, *end = (char *)m + len;
    bool fits = true;
    /* n bytes from at writable: whole INPUTS_GROW steps of the reservation. */
#define ROOM(n)                                                                                    \
    ({                                                                                             \
        size_t need_ = (n);                                                                        \
        if (need_ >= (size_t)(end - at)) {                                                         \
            fits = false;                                                                          \
        } else if (need_ > (size_t)(rw - at)) {                                                    \
            size_t grow_ =                                                                         \
                (need_ - (size_t)(rw - at) + INPUTS_GROW - 1) / INPUTS_GROW * INPUTS_GROW;         \
            if (grow_ > (size_t)(end - rw))                                                        \
                grow_ = (size_t)(end - rw);                                                        \
            if (mprotect(rw, grow_, PROT_READ | PROT_WRITE) != 0)                                  \
                fits = false;                                                                      \
            else                                                                                   \
                rw += grow_;                                                                       \
        }                                                                                          \
        fits;                                                                                      \
    })
#define PUT(s)                                                                                     \
    ({                                                                                             \
        const char *s_ = (s);                                                                      \
        size_t n_ = s_ != NULL ? strlen(s_) : 0;                                                   \
        fits &&ROOM(n_ + 1) ? inputs_put(h, &at, s_, n_) : NULL;                                   \
    })
    p->src = PUT(src);
    p->name = PUT(name);
    if (h != NULL)
        kc__hash_u64(h, (uint64_t)nh);
    for (int i = 0; i < nh && fits; i++) {
        p->headers[i] = PUT(headers[i]);
        p->include_names[i] = PUT(names != NULL ? names[i] : NULL);
    }
#undef PUT
#undef ROOM
    if (!fits) {
        munmap(m, len);
        p->src = p->name = NULL;
        return -ENOSPC;
    }
    /* The reservation past the used huge pages goes back (rw is whole
     * steps from a huge page: past the used ones). */
    uintptr_t used = ((uintptr_t)at + INPUTS_HUGE - 1) & ~(uintptr_t)(INPUTS_HUGE - 1);
    if (used < (uintptr_t)end && munmap((void *)used, (uintptr_t)end - used) == 0)
        len = used - (uintptr_t)m;
    in->map = m;
    in->mapped = len;
    in->block = (char *)a;
    return 0;
}

/* The key's hasher with its head, for create to hash the inputs into;
 * NULL when NVRTC's identity is not known yet (the compile hashes them
 * then) or out of memory (the same). */
static struct kc__hasher *inputs_hasher(void)
{
    const struct identity *id = __atomic_load_n(&ident.ready, __ATOMIC_ACQUIRE) ? &ident : NULL;
    struct kc__hasher *h = id != NULL ? kc__hasher_new() : NULL;
    if (h != NULL)
        key_head(h, id);
    return h;
}

/* p's inputs: one copy of the host's (n headers and include names; NULL
 * ones stay NULL), hashed for the key as they are copied when NVRTC's
 * identity is known already (a program kcache keeps: own_ok asked for it).
 * 0, or -ENOMEM (what was made is p's: prog_free frees it). */
static int inputs_make(struct prog *p, const char *src, const char *name, int n,
                       const char *const *headers, const char *const *names)
{
    int nh = n > 0 && headers != NULL ? n : 0;
    struct inputs *in = calloc(1, sizeof *in);
    if (in == NULL)
        return -ENOMEM;
    in->refs = 1;
    p->in = in;
    if (nh > 0) {
        p->headers = calloc(nh, sizeof *p->headers);
        p->include_names = calloc(nh, sizeof *p->include_names);
        if (p->headers == NULL || p->include_names == NULL)
            return -ENOMEM;
    }
    in->prefix = inputs_hasher();
    if (nh >= INPUTS_ONE_PASS_HEADERS) {
        if (inputs_one_pass(p, in, in->prefix, src, name, nh, headers, names) == 0) {
            p->n_headers = nh;
            return 0;
        }
        /* Past the reservation, hashed in part: the two passes, afresh. */
        kc__hasher_free(in->prefix);
        in->prefix = inputs_hasher();
    }
    size_t *len = malloc((2 * (size_t)nh + 2) * sizeof *len);
    if (len == NULL)
        return -ENOMEM;
    /* The lengths first: the block is sized, and each string's length is
     * hashed before its bytes. */
    len[0] = src != NULL ? strlen(src) : 0;
    len[1] = name != NULL ? strlen(name) : 0;
    size_t total = len[0] + len[1] + 2;
    for (int i = 0; i < nh; i++) {
        const char *in_name = names != NULL ? names[i] : NULL;
        len[2 + 2 * i] = headers[i] != NULL ? strlen(headers[i]) : 0;
        len[3 + 2 * i] = in_name != NULL ? strlen(in_name) : 0;
        total += len[2 + 2 * i] + len[3 + 2 * i] + 2;
    }
    if (inputs_alloc(in, total) != 0) {
        free(len);
        return -ENOMEM;
    }
    struct kc__hasher *h = in->prefix;
    char *at = in->block;
    p->src = inputs_put(h, &at, src, len[0]);
    p->name = inputs_put(h, &at, name, len[1]);
    if (h != NULL)
        kc__hash_u64(h, (uint64_t)nh);
    for (int i = 0; i < nh; i++) {
        p->headers[i] = inputs_put(h, &at, headers[i], len[2 + 2 * i]);
        p->include_names[i] = inputs_put(h, &at, names != NULL ? names[i] : NULL, len[3 + 2 * i]);
    }
    p->n_headers = nh;
    free(len);
    return 0;
}

KC_EXPORT nvrtcResult nvrtcCreateProgram(nvrtcProgram *prog, const char *src, const char *name,
                                         int numHeaders, const char *const *headers,
                                         const char *const *includeNames)
{
    REAL_OR_FAIL(real_create, "nvrtcCreateProgram");
    /* KCACHE_LOG=debug: the hook's own time (scripts/bench's nvmath rows
     * and split of the first hit, which includes reading the
     * configuration: the clock is read before the level is known). */
    uint64_t t0 = kc_mono_ns();
    if (kc__guard_held() || !nvrtc_enabled())
        return real_create(prog, src, name, numHeaders, headers, includeNames);
    if (!kc__log_enabled(KC_LOG_DEBUG))
        t0 = 0;
    uint64_t t_cfg = t0 != 0 ? kc_mono_ns() : 0, t_nvrtc = 0;
    /* A program NVRTC would accept is kept here and NVRTC creates it only
     * when a call needs it (a hit never does); anything else gets NVRTC's
     * own answer. So does every program while the loaded NVRTC exports an
     * entry point kcache does not know (it could be given kcache's
     * handle). */
    bool own = prog != NULL && src != NULL && numHeaders >= 0 &&
               (numHeaders == 0 || (headers != NULL && includeNames != NULL)) && own_ok();
    for (int i = 0; own && i < numHeaders; i++)
        own = headers[i] != NULL && includeNames[i] != NULL;
    uint64_t t_own = t0 != 0 ? kc_mono_ns() : 0;
    nvrtcResult rc = NVRTC_SUCCESS;
    if (!own) {
        rc = real_create(prog, src, name, numHeaders, headers, includeNames);
        if (rc != NVRTC_SUCCESS || *prog == NULL)
            return rc;
        t_nvrtc = t0 != 0 ? kc_mono_ns() - t_own : 0;
    }
    struct prog *p = calloc(1, sizeof *p);
    bool failed = p == NULL || inputs_make(p, src, name, numHeaders, headers, includeNames) != 0;
    if (!failed) {
        p->own = own;
        p->h = own ? (nvrtcProgram)p : *prog;
        p->real = own ? NULL : *prog;
    }
    if (failed) {
        prog_free(p);
        kc_log_once(KC_LOG_WARN, "out of memory; NVRTC programs pass through uncached");
        return own ? real_create(prog, src, name, numHeaders, headers, includeNames) : rc;
    }
    if (own)
        *prog = p->h;
    pthread_mutex_lock(&progs_lock);
    if (own)
        tomb_set(p->h, false);
    kc__touch_for_write(&progs[bucket(p->h)]);
    struct prog *stale = find_locked(p->h);
    if (stale != NULL) {
        /* A handle NVRTC reused after a destroy we did not see. */
        struct prog **pp = &progs[bucket(p->h)];
        while (*pp != stale)
            pp = &(*pp)->next;
        *pp = stale->next;
    }
    p->next = progs[bucket(p->h)];
    progs[bucket(p->h)] = p;
    pthread_mutex_unlock(&progs_lock);
    prog_free(stale);
    /* NVRTC's own create ran only when kcache did not keep the program;
     * a kept one's is timed when a miss makes NVRTC create it. */
    char nv[64] = "NVRTC's create deferred to a miss (none on a hit)";
    if (!own)
        snprintf(nv, sizeof nv, "%.3f ms of it NVRTC's", t_nvrtc / 1e6);
    if (t0 != 0)
        kc_log(KC_LOG_DEBUG,
               "nvrtc create: %.3f ms in the hook, %s (configuration %.1f us, NVRTC's identity "
               "and entry points %.1f us)",
               (kc_mono_ns() - t0) / 1e6, nv, (t_cfg - t0) / 1e3, (t_own - t_cfg) / 1e3);
    return rc;
}

KC_EXPORT nvrtcResult nvrtcDestroyProgram(nvrtcProgram *prog)
{
    REAL_OR_FAIL(real_destroy, "nvrtcDestroyProgram");
    struct prog *p = NULL;
    if (prog != NULL && *prog != NULL) {
        pthread_mutex_lock(&progs_lock);
        p = find_locked(*prog);
        if (p != NULL) {
            struct prog **pp = &progs[bucket(*prog)];
            while (*pp != p)
                pp = &(*pp)->next;
            *pp = p->next;
            if (p->own)
                tomb_set(p->h, true);
        }
        bool dead = p == NULL && tomb_is(*prog);
        pthread_mutex_unlock(&progs_lock);
        if (dead)
            return NVRTC_ERROR_INVALID_PROGRAM;
    }
    uint64_t t0 = p != NULL && kc__log_enabled(KC_LOG_DEBUG) ? kc_mono_ns() : 0;
    /* NVRTC's destroy runs unless kcache kept the program and NVRTC never
     * created it. */
    bool ran = p == NULL || !p->own || p->real != NULL;
    nvrtcResult rc;
    if (p != NULL && p->own) {
        /* kcache's handle: NVRTC's program, if a call made one, goes too;
         * the host's handle is cleared as NVRTC clears its own. */
        rc = p->real != NULL ? real_destroy(&p->real) : NVRTC_SUCCESS;
        *prog = NULL;
    } else {
        rc = real_destroy(prog);
    }
    if (rc != NVRTC_SUCCESS && p != NULL && !p->own) {
        pthread_mutex_lock(&progs_lock);
        p->next = progs[bucket(p->h)];
        progs[bucket(p->h)] = p;
        pthread_mutex_unlock(&progs_lock);
        return rc;
    }
    uint64_t t1 = t0 != 0 ? kc_mono_ns() : 0;
    prog_free(p);
    if (t0 != 0 && ran)
        kc_log(KC_LOG_DEBUG, "nvrtc destroy: %.3f ms in the hook, %.3f ms of it NVRTC's",
               (kc_mono_ns() - t0) / 1e6, (t1 - t0) / 1e6);
    else if (t0 != 0)
        kc_log(KC_LOG_DEBUG, "nvrtc destroy: %.3f ms in the hook; NVRTC never created it",
               (kc_mono_ns() - t0) / 1e6);
    return rc;
}

/* Records a name expression in p's shadow. progs_lock held. */
static bool expr_add(struct prog *p, const char *name)
{
    char **v = realloc(p->exprs, (p->n_exprs + 1) * sizeof *v);
    char *s = strdup(name);
    if (v != NULL)
        p->exprs = v;
    if (v == NULL || s == NULL) {
        free(s);
        return false;
    }
    p->exprs[p->n_exprs++] = s;
    return true;
}

KC_EXPORT nvrtcResult nvrtcAddNameExpression(nvrtcProgram prog, const char *name)
{
    REAL_OR_FAIL(real_add_name, "nvrtcAddNameExpression");
    pthread_mutex_lock(&progs_lock);
    struct prog *p = find_locked(prog);
    nvrtcResult rc = NVRTC_SUCCESS;
    if (p != NULL && p->served != NULL && name != NULL) {
        rc = (nvrtcResult)p->served->add_after_rc;
        pthread_mutex_unlock(&progs_lock);
        return rc;
    }
    /* A name added to a program NVRTC has not seen is only recorded:
     * NVRTC answers success to any name before a compile. */
    if (p != NULL && p->own && p->real == NULL && name != NULL && p->compiles == 0 &&
        expr_add(p, name)) {
        pthread_mutex_unlock(&progs_lock);
        return NVRTC_SUCCESS;
    }
    nvrtcProgram h = p != NULL ? real_prog_locked(p, &rc) : prog;
    if (p == NULL && tomb_is(prog))
        h = NULL, rc = NVRTC_ERROR_INVALID_PROGRAM;
    pthread_mutex_unlock(&progs_lock);
    if ((p != NULL || rc != NVRTC_SUCCESS) && h == NULL)
        return rc;
    rc = real_add_name(h, name);
    if (rc != NVRTC_SUCCESS || name == NULL)
        return rc;
    pthread_mutex_lock(&progs_lock);
    p = find_locked(prog);
    if (p != NULL && !expr_add(p, name))
        p->has_callback = 1; /* cannot key it any more: pass through */
    pthread_mutex_unlock(&progs_lock);
    return rc;
}

KC_EXPORT nvrtcResult nvrtcSetFlowCallback(nvrtcProgram prog, int (*callback)(void *, void *),
                                           void *payload)
{
    REAL_OR_FAIL(real_flow_callback, "nvrtcSetFlowCallback");
    REAL_HANDLE(prog, h);
    nvrtcResult rc = real_flow_callback(h, callback, payload);
    if (rc == NVRTC_SUCCESS) {
        pthread_mutex_lock(&progs_lock);
        struct prog *p = find_locked(prog);
        if (p != NULL)
            p->has_callback = callback != NULL;
        pthread_mutex_unlock(&progs_lock);
    }
    return rc;
}

/* Compiles for real, recording the headers read. */
static nvrtcResult compile_tracked(nvrtcProgram prog, int n, const char *const *opts,
                                   struct kc__deps *deps, uint64_t *ns)
{
    uint64_t t0 = kc_mono_ns();
    kc__deps_begin(deps);
    nvrtcResult rc = real_compile(prog, n, opts);
    kc__deps_end();
    *ns = kc_mono_ns() - t0;
    return rc;
}

/* The outputs (1 << OUT_*) whose getters the loaded NVRTC has. */
static uint32_t nvrtc_outputs(void)
{
    uint32_t m = (1u << N_OUT_V3) - 1, have = getters_exported();
    if ((have & (1u << G_real_nvvm_size | 1u << G_real_nvvm)) != 0)
        m |= 1u << OUT_NVVM;
    if ((have & (1u << G_real_tileir_size | 1u << G_real_tileir)) != 0)
        m |= 1u << OUT_TILEIR;
    return m;
}

/* KCACHE_LOG=debug only: when each step of the last lookup of this thread
 * ended (kc_mono_ns), for the "nvrtc hit split" line (scripts/bench's
 * split of a fresh process's first hit). */
enum { STEP_MANIFEST, STEP_RECORD, STEP_DECODE, N_STEPS };
static __thread uint64_t step_at[N_STEPS];

static void step_mark(int step)
{
    if (kc__log_enabled(KC_LOG_DEBUG))
        step_at[step] = kc_mono_ns();
}

/* Looks the request up; on a hit marks the program served, sets *rc to the
 * compile's recorded result and counts the hit. Returns whether it hit;
 * *stale (may be NULL): on a miss, whether a manifest was found that lists
 * no dependency set holding here. */
static bool try_serve(nvrtcProgram prog, struct kc_store *st, const struct kc_store_ops *api,
                      const char *ns, uint64_t build, const kc_digest *base,
                      struct bundled *bundled, nvrtcResult *rc, struct kc_counters *c, bool *stale)
{
    const struct kc_config *cfg = kc__config();
    kc_digest result;
    struct kc__mcheck mc = {0};
    if (bundled != NULL)
        mc = (struct kc__mcheck){bundled->dir, bundled->pristine,
                                 bundled->recalled ? &bundled->proof : NULL};
    int lrc = kc__manifest_lookup(st, api, ns, base, &mc, &result);
    if (bundled != NULL) {
        bundled->checked += mc.checked;
        bundled->mapped += mc.mapped;
        bundled->read += mc.read;
    }
    step_mark(STEP_MANIFEST);
    if (stale != NULL)
        *stale = lrc == -ESTALE;
    if (lrc != 0)
        return false;
    kc_key key = {.id = result, .build = build};
    void *body = NULL;
    size_t len = 0;
    struct kc_record_info info = {0};
    int grc = api->get(st, ns, &key, &body, &len, &info);
    if (grc != 0 && !cfg->readonly) {
        /* The seed's take_by_source: an earlier build's artifact of the
         * same request is moved under this build's key. */
        kc_key found;
        if (api->take_by_source(st, ns, &result, build, &body, &len, &found, &info) == 0) {
            grc = 0;
            /* It keeps the compile time it saves (a hit reports it). */
            api->put(st, ns, &key, &result, KC_KIND_NVRTC, body, len, info.saved_ns);
        }
    }
    if (grc != 0)
        return false;
    step_mark(STEP_RECORD);
    /* The record keeps the body (the store's malloc'd bytes, api->free
     * being free) and serves its outputs from it. */
    struct kc__replay *r = kc__replay_decode_body(body, len);
    step_mark(STEP_DECODE);
    if (r != NULL && (r->missing & nvrtc_outputs()) != 0) {
        /* An earlier layout's record, without a getter this NVRTC has: a
         * miss, and the compile replaces it. */
        kc__replay_free(r);
        return false;
    }
    if (r == NULL) {
        kc_log(KC_LOG_WARN, "a cached NVRTC result could not be read; recompiling");
        api->purge(st, ns, &key);
        c->errors++;
        return false;
    }
    pthread_mutex_lock(&progs_lock);
    struct prog *p = find_locked(prog);
    if (p != NULL) {
        *rc = r->compile_rc;
        retire(p);
        p->served = r;
        r = NULL;
    }
    pthread_mutex_unlock(&progs_lock);
    if (r != NULL) {
        kc__replay_free(r); /* destroyed meanwhile by another thread */
        return false;
    }
    c->hits = 1;
    c->saved_ns = info.saved_ns;
    return true;
}

/* try_serve for a request: with bundled headers, the record without DIR
 * first, then the one with it. */
static bool serve(nvrtcProgram prog, struct kc_store *st, const struct kc_store_ops *api,
                  const char *ns, uint64_t build, const kc_digest *base, struct bundled *b,
                  nvrtcResult *rc, struct kc_counters *c, bool *stale)
{
    if (b->dir == NULL)
        return try_serve(prog, st, api, ns, build, base, NULL, rc, c, stale);
    bool s0 = false;
    if (!b->keyed && try_serve(prog, st, api, ns, build, base, b, rc, c, &s0))
        return true;
    bool hit = try_serve(prog, st, api, ns, build, &b->base1, b, rc, c, stale);
    if (stale != NULL && !b->keyed)
        *stale = *stale && s0;
    return hit;
}

/* try_serve's arguments, for the cluster-wide wait's polls. */
struct serve_poll {
    nvrtcProgram prog;
    struct kc_store *st;
    const struct kc_store_ops *api;
    const char *ns;
    uint64_t build;
    const kc_digest *base;
    struct bundled *b;
    nvrtcResult *rc;
    struct kc_counters *c;
};

/* kc__flight_remote's poll: 1 served; -1 when the manifest now found
 * lists only other headers (stop waiting: compile); 0 not yet. */
static int serve_poll(void *arg)
{
    struct serve_poll *a = arg;
    bool stale = false;
    if (serve(a->prog, a->st, a->api, a->ns, a->build, a->base, a->b, a->rc, a->c, &stale))
        return 1;
    return stale ? -1 : 0;
}

/* A miss's record (why.h): what went into base_key, input by input.
 * progs_lock held. */
static void why_record(struct kc_why *w, const struct prog *p, int n, const char *const *opts,
                       const kc_digest *base)
{
    kc_why_begin(w, BACKEND, p->name ? p->name : "", base);
    int major = 0, minor = 0;
    if (real_version != NULL)
        real_version(&major, &minor);
    char v[48];
    snprintf(v, sizeof v, "NVRTC %d.%d", major, minor);
    kc__why_library(w, BACKEND, (const void *)real_compile, &nvrtc_identity()->digest, v);
    kc_why_data(w, "source", "", p->src, p->src ? strlen(p->src) : 0);
    kc_why_add(w, "program", "", NULL, p->name ? p->name : "(none)");
    for (int i = 0; i < p->n_headers; i++)
        kc_why_data(w, "header", p->include_names[i] ? p->include_names[i] : "(unnamed)",
                    p->headers[i], p->headers[i] ? strlen(p->headers[i]) : 0);
    for (int i = 0; i < n; i++) {
        const char *k = bundled_key_option(opts[i]);
        kc_digest d = kc_digest_of(k, strlen(k));
        kc_why_add(w, "option", "", &d, opts[i]);
    }
    for (int i = 0; i < p->n_exprs; i++)
        kc_why_add(w, "expression", "", NULL, p->exprs[i]);
    char cwd[PATH_MAX];
    for (int i = 0; i < n; i++)
        if (records_cwd(opts[i]) && kc__cwd(cwd, sizeof cwd) == 0) {
            kc_why_add(w, "cwd", "", NULL, cwd);
            break;
        }
}

KC_EXPORT nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int numOptions,
                                          const char *const *options)
{
    REAL_OR_FAIL(real_compile, "nvrtcCompileProgram");
    if (!kc__guard_enter()) {
        REAL_HANDLE(prog, h);
        return real_compile(h, numOptions, options);
    }
    uint64_t t_enter = kc_mono_ns();
    uint64_t t_key = 0, t_store = 0; /* KCACHE_LOG=debug: the hit split */
    nvrtcResult herr = NVRTC_SUCCESS;
    nvrtcProgram h;

    struct kc_counters c = {0};
    nvrtcResult rc;
    const struct kc_config *cfg = kc__config();

    /* A copy of the shadow's identity, so the lock is not held while
     * compiling. */
    pthread_mutex_lock(&progs_lock);
    struct prog *p = find_locked(prog);
    /* Why it passes through, when it does (the stats line's reasons). */
    enum kc_pass_reason why = KC_PASS_internal;
    bool cacheable = p != NULL && numOptions >= 0 && (numOptions == 0 || options != NULL);
    if (!cacheable)
        why = KC_PASS_input;
    else if (p->has_callback)
        cacheable = false, why = KC_PASS_option;
    for (int i = 0; cacheable && i < numOptions; i++)
        if (options[i] == NULL || side_effect_option(options[i]))
            cacheable = false, why = options[i] == NULL ? KC_PASS_input : KC_PASS_option;
    struct bundled bh = {0};
    if (cacheable && !bundled_find(numOptions, options, &bh))
        cacheable = false, why = KC_PASS_option;
    /* A later compile of one program: the real program is brought to the
     * state the earlier ones left, then compiles itself. */
    int replay_n = 0;
    char **replay = NULL;
    bool replay_due = false;
    /* (A compile NVRTC refuses as invalid input changes nothing.) */
    if (p != NULL && why != KC_PASS_input && p->compiles++ > 0) {
        if (cacheable)
            cacheable = false, why = KC_PASS_order;
        replay_due = p->replay_due;
        replay_n = p->served_n, replay = p->served_opts;
        p->replay_due = false, p->served_n = 0, p->served_opts = NULL;
        retire(p);
    }
    kc_digest base = {0};
    bool keyed = cacheable && base_key(p, numOptions, options, &base) == 0;
    if (keyed && nvrtc_identity()->unknown[0] != '\0')
        keyed = false, why = KC_PASS_unknown_export;
    if (keyed && bh.dir != NULL)
        bundled_base(&bh, &base);
    pthread_mutex_unlock(&progs_lock);

    if (p == NULL || !nvrtc_enabled()) {
        /* Not a program we shadow (invalid handle, or caching off). */
        prog_free(bh.copy);
        h = real_of(prog, &herr);
        rc = prog != NULL && h == NULL ? herr : real_compile(h, numOptions, options);
        kc__guard_exit();
        return rc;
    }
    /* The compile installs the bundled headers first, whatever follows
     * (13.5 does even for an invalid option): so does a hit, and the
     * manifest's headers below DIR are checked there. A DIR empty and
     * private before this install holds only what it wrote. */
    struct stat dir_st;
    bool fresh_dir = keyed && bh.dir != NULL && kc__bundled_empty(bh.dir, &dir_st);
    if (keyed && !getters_present())
        keyed = false;
    /* An empty DIR is filled from the store's copy of the install, when it
     * has one: a copy or reflink per file, not NVRTC's own install. One
     * another process installs into, or has, is not this call's from empty:
     * NVRTC's install waits for it, and the headers are checked as read. */
    int fill = keyed && fresh_dir && cfg->dir[0] != '\0'
                   ? kc__pristine_fill(cfg->dir, &nvrtc_identity()->digest, bh.dir, cfg->readonly,
                                       &bh.pristine)
                   : -ENOENT;
    bool filled = fill == 0;
    if (fill == -EBUSY)
        fresh_dir = false;
    if (keyed && bh.dir != NULL && !filled && bundled_install(bh.dir) != NVRTC_SUCCESS)
        keyed = false, why = KC_PASS_refused;
    /* When DIR held NVRTC's bytes: right after the fill (later calls prove
     * a file unchanged since by its ctime). */
    struct timespec filled_at = {0, 0};
    if (keyed && fresh_dir)
        kc__pristine_clock(&filled_at);
    if (!keyed) {
        c.passthrough = 1;
        kc__pass_reason(BACKEND, why);
        h = real_of(prog, &herr);
        if (h != NULL && replay_due) /* its answers are the served ones, given already */
            (void)real_compile(h, replay_n, (const char *const *)replay);
        opts_free(replay_n, replay);
        rc = h == NULL ? herr : real_compile(h, numOptions, options);
        goto out;
    }

    t_key = kc__log_enabled(KC_LOG_DEBUG) ? kc_mono_ns() : 0;
    const struct kc_store_ops *api = NULL;
    struct kc_store *st = kc__store(&api);
    const struct identity *id = nvrtc_identity();
    const char *ns = id->ns;
    uint64_t build = kc__self_build();
    t_store = t_key != 0 ? kc_mono_ns() : 0;
    if (st != NULL && fresh_dir && !filled && kc__bundled_same(bh.dir, &dir_st)) {
        bh.pristine = kc__pristine_get(cfg->dir, &id->digest, bh.dir, cfg->readonly);
        if (bh.pristine != NULL && !cfg->readonly)
            kc__pristine_keep(cfg->dir, &id->digest, bh.dir, bh.pristine);
    }
    if (st != NULL && bh.pristine != NULL && fresh_dir)
        kc__pristine_remember(bh.dir, &dir_st, bh.pristine, &filled_at);
    else if (st != NULL && bh.dir != NULL && !fresh_dir)
        bh.recalled = kc__pristine_recall(bh.dir, &bh.pristine, &bh.proof);

    uint64_t refused0 = st != NULL ? kc__why_refused() : 0;
    if (st != NULL && !cfg->recache && serve(prog, st, api, ns, build, &base, &bh, &rc, &c, NULL))
        goto out;

    /* Single flight: one process compiles a missed request, the others
     * wait for it and are served its result. Look again once the lock is
     * held: the holder may have finished just before. */
    int flight = -1;
    bool rheld = false, stale = false;
    kc_key mk = kc__manifest_key(&base);
    if (st != NULL) {
        bool waited = false;
        flight = kc__flight_acquire(&base, &waited);
        if ((flight >= 0 || waited) && !cfg->recache &&
            serve(prog, st, api, ns, build, &base, &bh, &rc, &c, &stale)) {
            kc__flight_release(flight);
            goto out;
        }
        /* Cluster-wide: one node compiles, the others are served its
         * result through the remote (its manifest's key names the lock).
         * A manifest none of whose sets holds here came from a node whose
         * headers differ: nothing to wait for. */
        struct serve_poll sp = {prog, st, api, ns, build, &base, &bh, &rc, &c};
        if (!stale && kc__flight_remote(ns, &mk, serve_poll, &sp, &rheld) == 1) {
            kc__flight_release(flight);
            goto out;
        }
        if (stale)
            kc__flight_remote_skipped(&mk);
    }

    /* Miss: compile for real, then capture and store (with the real
     * getters, looked up now: a hit needs none). */
    bool getters = resolve_getters();
    pthread_mutex_lock(&progs_lock);
    p = find_locked(prog);
    if (p != NULL)
        retire(p);
    pthread_mutex_unlock(&progs_lock);

    struct kc__deps deps = {.bundled = bh.dir};
    uint64_t took = 0;
    bool stored = false;
    size_t stored_len = 0;
    /* NVRTC sees the program now, for the first time when kcache kept it. */
    h = real_of(prog, &herr);
    if (h == NULL) {
        rc = herr;
        c.errors = 1;
        kc__flight_remote_release(ns, &mk, rheld, false, 0);
        kc__flight_release(flight);
        goto out;
    }
    rc = compile_tracked(h, numOptions, options, &deps, &took);
    c.misses = 1;
    c.compile_ns = took;
    /* What went into the key, for `kcache why`. */
    struct kc_why wrec = {0};
    kc_key why_key = {.id = base, .build = build};
    const char *why_not = "NVRTC answered an error";
    pthread_mutex_lock(&progs_lock);
    p = find_locked(prog);
    if (p != NULL && st != NULL)
        why_record(&wrec, p, numOptions, options, &base);
    pthread_mutex_unlock(&progs_lock);
    if (kc__log_enabled(KC_LOG_DEBUG)) {
        size_t files = 0;
        for (size_t i = 0; i < deps.n; i++)
            files += deps.v[i].kind == KC_DEP_FILE;
        kc_log(KC_LOG_DEBUG,
               "nvrtc miss: compiled in %.1f ms, %zu files read, %zu other paths seen", took / 1e6,
               files, deps.n - files);
    }
    if ((rc == NVRTC_SUCCESS || rc == NVRTC_ERROR_COMPILATION) && st != NULL && !cfg->readonly) {
        why_not = NULL;
        if (deps.writes || deps.unkeyable) {
            /* A file it wrote, or read and kcache cannot key: uncached. */
            c.misses = 0;
            c.passthrough = 1;
            kc__pass_reason(BACKEND, deps.writes ? KC_PASS_writes : KC_PASS_unkeyable);
        } else if (kc__deps_finish(&deps) != 0) {
            kc_log(KC_LOG_DEBUG, "a header changed during the compile; not cached");
            why_not = "a header changed during the compile";
        } else if (kc__deps_note_cwd(&deps, names_cwd(prog, numOptions, options)) != 0) {
            c.errors = 1;
            why_not = "out of memory";
        } else {
            pthread_mutex_lock(&progs_lock);
            p = find_locked(prog);
            struct kc__replay *r = p != NULL && getters ? capture(p, rc) : NULL;
            /* The witness's copy, made only now: a hit never needs it
             * (libmathdx's programs hold 120 MB of headers). Without it
             * (out of memory) the record is kept under base1. */
            if (r != NULL && bh.dir != NULL)
                bh.copy = prog_copy(p);
            pthread_mutex_unlock(&progs_lock);
            struct kc_buf b = {0};
            if (r != NULL && kc__replay_encode(r, &b) == 0) {
                uint64_t t0 = kc_mono_ns();
                const kc_digest *sbase = bundled_store_base(&bh, &base, numOptions, options, r);
                took += kc_mono_ns() - t0; /* the witness compile, if any */
                kc_digest result = kc__manifest_result_id(sbase, deps.v, deps.n);
                kc_key key = {.id = result, .build = build};
                int prc = api->put(st, ns, &key, &result, KC_KIND_NVRTC, b.p, b.len, took);
                if (prc == 0)
                    prc = kc__manifest_add(st, api, ns, sbase, &result, &deps);
                if (prc == 0) {
                    c.stores = 1;
                    stored = true;
                    stored_len = b.len;
                    why_key = key;
                } else {
                    why_not = prc == -EDQUOT ? "the spool was full (KCACHE_MAXSIZE)"
                                             : "the store refused it";
                    c.errors = 1;
                    if (prc != -EDQUOT) /* a full spool: the store has warned */
                        kc_log_once(KC_LOG_WARN,
                                    "cannot store an NVRTC result (%s); "
                                    "continuing uncached",
                                    strerror(-prc));
                }
            } else {
                c.errors = 1;
                why_not = "out of memory";
                kc_log_once(KC_LOG_WARN, "cannot capture an NVRTC result; continuing uncached");
            }
            kc_buf_free(&b);
            kc__replay_free(r);
        }
    } else if (st != NULL && cfg->readonly)
        why_not = "the store is read-only";
    if (c.misses != 0 && wrec.b.len != 0) {
        kc__why_deps(&wrec, &deps);
        kc__why_finish(&wrec, &why_key.id, why_key.build, why_not, took, refused0);
    } else
        kc_why_free(&wrec);
    kc__deps_free(&deps);
    kc__flight_remote_release(ns, &mk, rheld, stored, stored_len);
    kc__flight_release(flight);
out:
    if (c.hits != 0) {
        /* Served: what a later compile of this program replays first. */
        char **copy = opts_copy(numOptions, options);
        pthread_mutex_lock(&progs_lock);
        p = find_locked(prog);
        if (p != NULL && (copy != NULL || numOptions == 0)) {
            opts_free(p->served_n, p->served_opts);
            p->replay_due = true, p->served_n = numOptions, p->served_opts = copy;
            copy = NULL;
        }
        pthread_mutex_unlock(&progs_lock);
        opts_free(numOptions, copy);
    }
    prog_free(bh.copy);
    uint64_t t_count = kc__log_enabled(KC_LOG_DEBUG) ? kc_mono_ns() : 0;
    kc__count(BACKEND, &c);
    if (c.hits != 0 && t_count != 0 && t_key != 0 && t_store != 0)
        /* The first hit of a process by step (scripts/bench section 1). */
        kc_log(KC_LOG_DEBUG,
               "nvrtc hit split: key %.1f us, store %.1f us, manifest %.1f us, record %.1f us, "
               "decode %.1f us, served %.1f us, count %.1f us",
               (t_key - t_enter) / 1e3, (t_store - t_key) / 1e3,
               (step_at[STEP_MANIFEST] - t_store) / 1e3,
               (step_at[STEP_RECORD] - step_at[STEP_MANIFEST]) / 1e3,
               (step_at[STEP_DECODE] - step_at[STEP_RECORD]) / 1e3,
               (t_count - step_at[STEP_DECODE]) / 1e3, (kc_mono_ns() - t_count) / 1e3);
    if (bh.checked != 0 && kc__log_enabled(KC_LOG_DEBUG))
        kc_log(KC_LOG_DEBUG,
               "nvrtc: headers below the bundled headers directory: %llu checked, %llu by "
               "NVRTC's own map, %llu read",
               (unsigned long long)bh.checked, (unsigned long long)bh.mapped,
               (unsigned long long)bh.read);
    if (kc__log_enabled(KC_LOG_DEBUG))
        kc_log(KC_LOG_DEBUG, "nvrtc %s: %.3f ms in the hook, %.3f ms of it compiling",
               c.hits     ? "hit"
               : c.misses ? "miss"
                          : "pass-through",
               (kc_mono_ns() - t_enter) / 1e6, c.compile_ns / 1e6);
    kc__guard_exit();
    return rc;
}

/* ---- getters: served programs answer from the record ----------------------------------------- */

static nvrtcResult serve_size(nvrtcProgram prog, size_t *ret, int which, size_fn real)
{
    pthread_mutex_lock(&progs_lock);
    struct prog *p = find_locked(prog);
    if (p == NULL || p->served == NULL) {
        pthread_mutex_unlock(&progs_lock);
        REAL_HANDLE(prog, h);
        return real(h, ret);
    }
    const struct kc__output *o = &p->served->out[which];
    nvrtcResult rc = ret == NULL ? (nvrtcResult)o->size_null_rc : (nvrtcResult)o->size_rc;
    size_t size = o->size;
    int set = o->size_set;
    pthread_mutex_unlock(&progs_lock);
    if (set && ret != NULL)
        *ret = size;
    return rc;
}

static nvrtcResult serve_get(nvrtcProgram prog, char *dst, int which, get_fn real)
{
    pthread_mutex_lock(&progs_lock);
    struct prog *p = find_locked(prog);
    if (p == NULL || p->served == NULL) {
        pthread_mutex_unlock(&progs_lock);
        REAL_HANDLE(prog, h);
        return real(h, dst);
    }
    const struct kc__output *o = &p->served->out[which];
    if (dst == NULL) {
        nvrtcResult rc = o->get_null_rc;
        pthread_mutex_unlock(&progs_lock);
        return rc;
    }
    if (o->nbytes > 0)
        memcpy(dst, o->bytes, o->nbytes);
    nvrtcResult rc = o->get_rc;
    pthread_mutex_unlock(&progs_lock);
    return rc;
}

#define GETTERS(Size, Get, which, real_size_var, real_get_var)                                     \
    KC_EXPORT nvrtcResult Size(nvrtcProgram prog, size_t *ret)                                     \
    {                                                                                              \
        REAL_OR_FAIL(real_size_var, #Size);                                                        \
        return serve_size(prog, ret, which, real_size_var);                                        \
    }                                                                                              \
    KC_EXPORT nvrtcResult Get(nvrtcProgram prog, char *dst)                                        \
    {                                                                                              \
        REAL_OR_FAIL(real_get_var, #Get);                                                          \
        return serve_get(prog, dst, which, real_get_var);                                          \
    }

GETTERS(nvrtcGetPTXSize, nvrtcGetPTX, OUT_PTX, real_ptx_size, real_ptx)
GETTERS(nvrtcGetCUBINSize, nvrtcGetCUBIN, OUT_CUBIN, real_cubin_size, real_cubin)
GETTERS(nvrtcGetLTOIRSize, nvrtcGetLTOIR, OUT_LTOIR, real_ltoir_size, real_ltoir)
GETTERS(nvrtcGetOptiXIRSize, nvrtcGetOptiXIR, OUT_OPTIX, real_optix_size, real_optix)
GETTERS(nvrtcGetProgramLogSize, nvrtcGetProgramLog, OUT_LOG, real_log_size, real_log)
/* Not in this toolkit's nvrtc.h: declared as the releases that have them
 * declare them (12.9's nvrtc.h, 13.5's). */
nvrtcResult nvrtcGetNVVMSize(nvrtcProgram prog, size_t *nvvmSizeRet);
nvrtcResult nvrtcGetNVVM(nvrtcProgram prog, char *nvvm);
nvrtcResult nvrtcGetTileIRSize(nvrtcProgram prog, size_t *TileIRSizeRet);
nvrtcResult nvrtcGetTileIR(nvrtcProgram prog, char *TileIR);
GETTERS(nvrtcGetNVVMSize, nvrtcGetNVVM, OUT_NVVM, real_nvvm_size, real_nvvm)
GETTERS(nvrtcGetTileIRSize, nvrtcGetTileIR, OUT_TILEIR, real_tileir_size, real_tileir)

KC_EXPORT nvrtcResult nvrtcGetLoweredName(nvrtcProgram prog, const char *expr, const char **out)
{
    REAL_OR_FAIL(real_lowered, "nvrtcGetLoweredName");
    pthread_mutex_lock(&progs_lock);
    struct prog *p = find_locked(prog);
    if (p == NULL || p->served == NULL) {
        pthread_mutex_unlock(&progs_lock);
        REAL_HANDLE(prog, h);
        return real_lowered(h, expr, out);
    }
    const struct kc__replay *r = p->served;
    nvrtcResult rc;
    if ((expr == NULL && r->lowered_null_name_rc == KC_LOWERED_NOT_PROBED) ||
        (expr != NULL && out == NULL && r->lowered_null_out_rc == KC_LOWERED_NOT_PROBED)) {
        pthread_mutex_unlock(&progs_lock);
        REAL_HANDLE(prog, h);
        return real_lowered(h, expr, out);
    } else if (expr == NULL) {
        rc = r->lowered_null_name_rc;
    } else if (out == NULL) {
        rc = r->lowered_null_out_rc;
    } else {
        /* A name never added: NVRTC answers its code and sets the result
         * to NULL (every release, 11.8 to 13.5: test nvrtc-handles). */
        rc = r->lowered_unknown_rc;
        const struct kc__lowered *l = NULL;
        for (uint32_t i = 0; i < r->n_names && l == NULL; i++)
            if (strcmp(r->names[i].expr, expr) == 0)
                l = &r->names[i];
        if (l == NULL)
            *out = NULL;
        else if (l->is_null != KC_LOWERED_UNTOUCHED) {
            rc = l->rc;
            /* Lives in the record until the program is destroyed, even
             * when the program is compiled again (retire()). */
            *out = l->is_null ? NULL : l->name;
        } else
            rc = l->rc;
    }
    pthread_mutex_unlock(&progs_lock);
    return rc;
}

KC_EXPORT nvrtcResult nvrtcGetPCHCreateStatus(nvrtcProgram prog)
{
    REAL_OR_FAIL(real_pch_status, "nvrtcGetPCHCreateStatus");
    pthread_mutex_lock(&progs_lock);
    struct prog *p = find_locked(prog);
    int served = p != NULL && p->served != NULL;
    nvrtcResult rc = served ? (nvrtcResult)p->served->pch_status_rc : NVRTC_SUCCESS;
    pthread_mutex_unlock(&progs_lock);
    if (served)
        return rc;
    REAL_HANDLE(prog, h);
    return real_pch_status(h);
}

KC_EXPORT nvrtcResult nvrtcGetPCHHeapSizeRequired(nvrtcProgram prog, size_t *size)
{
    REAL_OR_FAIL(real_pch_required, "nvrtcGetPCHHeapSizeRequired");
    pthread_mutex_lock(&progs_lock);
    struct prog *p = find_locked(prog);
    if (p == NULL || p->served == NULL) {
        pthread_mutex_unlock(&progs_lock);
        REAL_HANDLE(prog, h);
        return real_pch_required(h, size);
    }
    nvrtcResult rc = size == NULL ? (nvrtcResult)p->served->pch_required_null_rc
                                  : (nvrtcResult)p->served->pch_required_rc;
    int set = p->served->pch_required_set && size != NULL;
    size_t v = p->served->pch_required;
    pthread_mutex_unlock(&progs_lock);
    if (set)
        *size = v;
    return rc;
}

#define HOOK(name, var)                                                                            \
    {                                                                                              \
#name, (void *)name, (void **)&var, KC_LIB_NVRTC                                           \
    }
const struct kc__hook kc__nvrtc_hooks[] = {
    HOOK(nvrtcCreateProgram, real_create),
    HOOK(nvrtcDestroyProgram, real_destroy),
    HOOK(nvrtcCompileProgram, real_compile),
    HOOK(nvrtcAddNameExpression, real_add_name),
    HOOK(nvrtcGetLoweredName, real_lowered),
    HOOK(nvrtcGetPTXSize, real_ptx_size),
    HOOK(nvrtcGetPTX, real_ptx),
    HOOK(nvrtcGetCUBINSize, real_cubin_size),
    HOOK(nvrtcGetCUBIN, real_cubin),
    HOOK(nvrtcGetLTOIRSize, real_ltoir_size),
    HOOK(nvrtcGetLTOIR, real_ltoir),
    HOOK(nvrtcGetOptiXIRSize, real_optix_size),
    HOOK(nvrtcGetOptiXIR, real_optix),
    HOOK(nvrtcGetNVVMSize, real_nvvm_size),
    HOOK(nvrtcGetNVVM, real_nvvm),
    HOOK(nvrtcGetTileIRSize, real_tileir_size),
    HOOK(nvrtcGetTileIR, real_tileir),
    HOOK(nvrtcGetProgramLogSize, real_log_size),
    HOOK(nvrtcGetProgramLog, real_log),
    HOOK(nvrtcGetPCHCreateStatus, real_pch_status),
    HOOK(nvrtcGetPCHHeapSizeRequired, real_pch_required),
    HOOK(nvrtcSetFlowCallback, real_flow_callback),
    {"nvrtcVersion", NULL, (void **)&real_version, KC_LIB_NVRTC},
    {NULL, NULL, NULL, 0},
};

/* The family of NVRTC (hook.h). */
KC__FAMILY(nvrtc, KC_LIB_NVRTC, kc__nvrtc_hooks, NULL, NULL);
