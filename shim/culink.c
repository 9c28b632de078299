/*
 * The driver's linker cached: cuLinkCreate[_v2], cuLinkAddData[_v2],
 * cuLinkAddFile[_v2], cuLinkComplete, cuLinkDestroy (CuPy's -rdc programs,
 * cuda.core's Linker without nvJitLink, Numba).
 *
 * A link state's session (linker.h) keys the link as the driver JIT's
 * namespace does (compute capability of the current context's device,
 * driver version, libcuda's build-id), with the link's code-affecting JIT
 * options and every input in order. On a hit cuLinkComplete returns the
 * stored cubin (kept until cuLinkDestroy, as the driver keeps its own) and
 * fills the log buffers given to cuLinkCreate as the driver filled them:
 * the text, a NUL, the size option overwritten with what the driver left
 * there. The log buffers' sizes are part of the key, so a stored log is
 * always cut where the driver cut it. Options the cache cannot replay
 * (pointer-valued ones, outputs other than the logs and the wall time)
 * make the link pass through.
 *
 * The shim's own module-load JIT (driver.c) calls the real cuLink*
 * functions, which it finds in libcuda itself (kc__cu_real), and with the
 * re-entry guard held; these hooks are never on that path.
 */
#include "driver.h"
#include "linker.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Declared here whatever cuda.h maps under __CUDA_API_VERSION_INTERNAL. */
CUresult cuLinkCreate_v2(unsigned int numOptions, CUjit_option *options, void **optionValues,
                         CUlinkState *stateOut);
CUresult cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void *data, size_t size,
                          const char *name, unsigned int numOptions, CUjit_option *options,
                          void **optionValues);
CUresult cuLinkAddFile_v2(CUlinkState state, CUjitInputType type, const char *path,
                          unsigned int numOptions, CUjit_option *options, void **optionValues);

typedef CUresult (*create_fn)(unsigned, CUjit_option *, void **, CUlinkState *);
typedef CUresult (*add_fn)(CUlinkState, CUjitInputType, void *, size_t, const char *, unsigned,
                           CUjit_option *, void **);
typedef CUresult (*add_file_fn)(CUlinkState, CUjitInputType, const char *, unsigned, CUjit_option *,
                                void **);
typedef CUresult (*complete_fn)(CUlinkState, void **, size_t *);
typedef CUresult (*destroy_fn)(CUlinkState);

static void *real_create, *real_create_v2, *real_add, *real_add_v2, *real_add_file,
    *real_add_file_v2, *real_complete, *real_destroy;

static void *real_of(void **slot, const char *name)
{
    void *p = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (p != NULL)
        return p;
    const struct kc__hook *h = kc__hook_find(name, KC_LIB_CUDA);
    return h != NULL ? kc__hook_real(h) : NULL;
}
#define REAL(var, name) real_of(&var, name)

/* ---- options ---------------------------------------------------------------- */

/* The host's log buffers and where the driver writes back, kept with the
 * session: the option arrays stay the host's until cuLinkDestroy. */
struct cl_priv {
    void **vals;
    struct kc__jit_logs lg;
};

/* Sorts cuLinkCreate's options into the logs and code-affecting ones, and
 * hashes the latter with the log buffers' sizes. False: not cacheable. */
static bool parse_create(unsigned n, CUjit_option *opt, void **val, struct cl_priv *p,
                         struct kc__hasher *h)
{
    memset(p, 0, sizeof *p);
    kc__jit_logs_init(&p->lg);
    p->vals = val;
    if (n > 64 || (n > 0 && (opt == NULL || val == NULL)))
        return false;
    for (unsigned i = 0; i < n; i++) {
        if (kc__jit_log_option(&p->lg, opt[i], val[i], i))
            continue;
        if (!kc__jit_code_option(opt[i]))
            return false;
        kc__hash_u64(h, (uint64_t)opt[i]);
        kc__hash_u64(h, (uint64_t)(unsigned)(uintptr_t)val[i]);
    }
    kc__hash_u64(h, p->lg.info_buf != NULL);
    kc__hash_u64(h, p->lg.info_idx >= 0 ? p->lg.info_size : UINT64_MAX);
    kc__hash_u64(h, p->lg.error_buf != NULL);
    kc__hash_u64(h, p->lg.error_idx >= 0 ? p->lg.error_size : UINT64_MAX);
    return true;
}

/* An input's own options: only code-affecting integers can be deferred. */
static bool input_options_usual(unsigned n, CUjit_option *opt, void **val)
{
    if (n > 16 || (n > 0 && (opt == NULL || val == NULL)))
        return false;
    for (unsigned i = 0; i < n; i++)
        if (!kc__jit_code_option(opt[i]))
            return false;
    return true;
}

/* ---- the device and driver: the JIT namespace ---------------------------------- */

static struct {
    CUresult (*ctx_get_current)(CUcontext *);
    CUresult (*ctx_get_device)(CUdevice *);
    CUresult (*device_attr)(int *, CUdevice_attribute, CUdevice);
    CUresult (*driver_version)(int *);
    void *link_create;
    add_fn link_add;
    add_file_fn link_add_file;
    complete_fn link_complete;
    int ok;
} cl;
static pthread_once_t cl_once = PTHREAD_ONCE_INIT;

static void cl_resolve(void)
{
    const struct kc__cu_need need[] = {
        {"cuCtxGetCurrent", &cl.ctx_get_current},  {"cuCtxGetDevice", &cl.ctx_get_device},
        {"cuDeviceGetAttribute", &cl.device_attr}, {"cuDriverGetVersion", &cl.driver_version},
        {"cuLinkCreate_v2", &cl.link_create},      {"cuLinkAddData_v2", &cl.link_add},
        {"cuLinkAddFile_v2", &cl.link_add_file},   {"cuLinkComplete", &cl.link_complete},
    };
    cl.ok = kc__cu_real_all(need, sizeof need / sizeof *need);
}

/* The JIT namespace of the current context's device, as driver.c names it
 * ("jit:" and the digest of capability, driver version and libcuda's
 * build-id), and that identity hashed into h. 0 or -1. */
static int device_identity(char *ns, size_t len, struct kc__hasher *h)
{
    pthread_once(&cl_once, cl_resolve);
    if (!cl.ok)
        return -1;
    CUcontext c = NULL;
    CUdevice dev = 0;
    int major = 0, minor = 0, version = 0;
    kc_digest lib;
    if (cl.ctx_get_current(&c) != CUDA_SUCCESS || c == NULL ||
        cl.ctx_get_device(&dev) != CUDA_SUCCESS ||
        cl.device_attr(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) ||
        cl.device_attr(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev) ||
        cl.driver_version(&version) != CUDA_SUCCESS ||
        kc__loaded_identity(cl.link_create, &lib) != 0)
        return -1;
    kc_digest fp;
    if (kc__jit_namespace(major, minor, version, &lib, ns, len, &fp) != 0)
        return -1;
    kc__hash_bytes(h, &fp, sizeof fp);
    return 0;
}

/* ---- the engine's operations ---------------------------------------------------- */

static int cl_add(struct kc__link_sess *s, const struct kc__link_input *in)
{
    pthread_once(&cl_once, cl_resolve);
    if (in->by_file && in->data != NULL) {
        /* A file's bytes as read at the add, under its path, as the driver
         * adds a file it reads (PTX as text: with its NUL). */
        add_fn f = cl.link_add;
        size_t size = in->type == CU_JIT_INPUT_PTX ? in->size + 1 : in->size;
        return f ? f(s->h, in->type, (void *)in->data, size, in->name, in->n_opt,
                     (CUjit_option *)in->opt, in->val)
                 : CUDA_ERROR_NOT_INITIALIZED;
    }
    if (in->by_file) {
        add_file_fn f = in->real != NULL ? (add_file_fn)in->real : cl.link_add_file;
        return f ? f(s->h, in->type, in->name, in->n_opt, (CUjit_option *)in->opt, in->val)
                 : CUDA_ERROR_NOT_INITIALIZED;
    }
    add_fn f = in->real != NULL ? (add_fn)in->real : cl.link_add;
    return f ? f(s->h, in->type, (void *)in->data, in->size, in->name, in->n_opt,
                 (CUjit_option *)in->opt, in->val)
             : CUDA_ERROR_NOT_INITIALIZED;
}

static void cl_complete_quietly(struct kc__link_sess *s)
{
    pthread_once(&cl_once, cl_resolve);
    void *cubin = NULL;
    size_t size = 0;
    if (cl.link_complete != NULL)
        cl.link_complete(s->h, &cubin, &size);
}

/* What the host sees of a link state: the log buffers given to
 * cuLinkCreate and the values the driver writes back (the logs' sizes,
 * which bound its next write, and the wall time). The catch-up of a served
 * link writes them again; the host had them from the store already. */
struct cl_seen {
    void *val[3];
    char *info, *error;
};

static void *cl_quiet_begin(struct kc__link_sess *s)
{
    const struct cl_priv *p = s->priv;
    struct cl_seen *q = calloc(1, sizeof *q);
    if (q == NULL)
        return NULL;
    const int idx[3] = {p->lg.info_idx, p->lg.error_idx, p->lg.wall_idx};
    for (int i = 0; i < 3; i++)
        if (idx[i] >= 0)
            q->val[i] = p->vals[idx[i]];
    if ((p->lg.info_buf != NULL && p->lg.info_size > 0 &&
         (q->info = malloc(p->lg.info_size)) == NULL) ||
        (p->lg.error_buf != NULL && p->lg.error_size > 0 &&
         (q->error = malloc(p->lg.error_size)) == NULL)) {
        free(q->info);
        free(q);
        return NULL;
    }
    if (q->info != NULL)
        memcpy(q->info, p->lg.info_buf, p->lg.info_size);
    if (q->error != NULL)
        memcpy(q->error, p->lg.error_buf, p->lg.error_size);
    return q;
}

static void cl_quiet_end(struct kc__link_sess *s, void *saved)
{
    const struct cl_priv *p = s->priv;
    struct cl_seen *q = saved;
    if (q == NULL)
        return;
    const int idx[3] = {p->lg.info_idx, p->lg.error_idx, p->lg.wall_idx};
    for (int i = 0; i < 3; i++)
        if (idx[i] >= 0)
            p->vals[idx[i]] = q->val[i];
    if (q->info != NULL)
        memcpy(p->lg.info_buf, q->info, p->lg.info_size);
    if (q->error != NULL)
        memcpy(p->lg.error_buf, q->error, p->lg.error_size);
    free(q->info);
    free(q->error);
    free(q);
}

static const struct kc__link_ops cl_ops = {
    .what = "cuLink",
    .success = CUDA_SUCCESS,
    .add = cl_add,
    .complete_quietly = cl_complete_quietly,
    .quiet_begin = cl_quiet_begin,
    .quiet_end = cl_quiet_end,
};

/* The driver's verdicts on its inputs are replayed; nothing else. */
static bool cl_cacheable(CUresult rc)
{
    return rc == CUDA_SUCCESS || rc == CUDA_ERROR_INVALID_PTX || rc == CUDA_ERROR_INVALID_IMAGE ||
           rc == CUDA_ERROR_NO_BINARY_FOR_GPU || rc == CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
}

/* ---- the hooks ---------------------------------------------------------------------- */

static CUresult do_create(create_fn real, unsigned n, CUjit_option *opt, void **val,
                          CUlinkState *out)
{
    if (real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (kc__guard_held() || !kc__link_enabled())
        return real(n, opt, val, out);
    kc__guard_enter();
    CUresult rc = real(n, opt, val, out);
    if (rc != CUDA_SUCCESS || out == NULL || *out == NULL)
        goto done;
    struct cl_priv *p = malloc(sizeof *p);
    struct kc__hasher *h = kc__link_hasher("cuLink");
    char ns[64];
    bool cacheable = p != NULL && h != NULL && device_identity(ns, sizeof ns, h) == 0 &&
                     parse_create(n, opt, val, p, h);
    if (p != NULL && h != NULL) {
        kc_digest p0 = kc__hash_digest(h);
        if (!cacheable)
            snprintf(ns, sizeof ns, "jit:unknown");
        /* Not cacheable: no device identity, or JIT options kcache does
         * not take (parse_create). */
        kc__link_new(*out, &cl_ops, ns, &p0, cacheable, KC_PASS_option, p);
        p = NULL;
    }
    free(p);
    kc__hasher_free(h);
done:
    kc__guard_exit();
    return rc;
}

KC_EXPORT CUresult cuLinkCreate_v2(unsigned int numOptions, CUjit_option *options,
                                   void **optionValues, CUlinkState *stateOut)
{
    return do_create((create_fn)REAL(real_create_v2, "cuLinkCreate_v2"), numOptions, options,
                     optionValues, stateOut);
}

KC_EXPORT CUresult cuLinkCreate(unsigned int numOptions, CUjit_option *options, void **optionValues,
                                CUlinkState *stateOut)
{
    return do_create((create_fn)REAL(real_create, "cuLinkCreate"), numOptions, options,
                     optionValues, stateOut);
}

static bool type_usual(CUjitInputType t)
{
    return t >= CU_JIT_INPUT_CUBIN && t <= CU_JIT_INPUT_LIBRARY;
}

static CUresult do_add(add_fn real, CUlinkState state, CUjitInputType type, void *data, size_t size,
                       const char *name, unsigned n, CUjit_option *opt, void **val)
{
    if (real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct kc__link_sess *s = kc__guard_held() ? NULL : kc__link_get(state, &cl_ops);
    if (s == NULL)
        return real(state, type, data, size, name, n, opt, val);
    kc__guard_enter();
    struct kc__link_input in = {.type = type,
                                .name = (char *)name,
                                .data = data,
                                .size = size,
                                .n_opt = n,
                                .opt = (int *)opt,
                                .val = val,
                                .real = (void *)real};
    bool usual = data != NULL && size > 0 && type_usual(type) && input_options_usual(n, opt, val);
    CUresult rc = kc__link_add(s, &in, usual);
    kc__guard_exit();
    kc__link_put(s);
    return rc;
}

KC_EXPORT CUresult cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void *data, size_t size,
                                    const char *name, unsigned int numOptions,
                                    CUjit_option *options, void **optionValues)
{
    return do_add((add_fn)REAL(real_add_v2, "cuLinkAddData_v2"), state, type, data, size, name,
                  numOptions, options, optionValues);
}

KC_EXPORT CUresult cuLinkAddData(CUlinkState state, CUjitInputType type, void *data, size_t size,
                                 const char *name, unsigned int numOptions, CUjit_option *options,
                                 void **optionValues)
{
    return do_add((add_fn)REAL(real_add, "cuLinkAddData"), state, type, data, size, name,
                  numOptions, options, optionValues);
}

static CUresult do_add_file(add_file_fn real, CUlinkState state, CUjitInputType type,
                            const char *path, unsigned n, CUjit_option *opt, void **val)
{
    if (real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct kc__link_sess *s = kc__guard_held() ? NULL : kc__link_get(state, &cl_ops);
    if (s == NULL)
        return real(state, type, path, n, opt, val);
    kc__guard_enter();
    struct kc__link_input in = {.by_file = 1,
                                .type = type,
                                .name = (char *)path,
                                .n_opt = n,
                                .opt = (int *)opt,
                                .val = val,
                                .real = (void *)real};
    bool usual =
        path != NULL && path[0] != 0 && type_usual(type) && input_options_usual(n, opt, val);
    CUresult rc = kc__link_add(s, &in, usual);
    kc__guard_exit();
    kc__link_put(s);
    return rc;
}

KC_EXPORT CUresult cuLinkAddFile_v2(CUlinkState state, CUjitInputType type, const char *path,
                                    unsigned int numOptions, CUjit_option *options,
                                    void **optionValues)
{
    return do_add_file((add_file_fn)REAL(real_add_file_v2, "cuLinkAddFile_v2"), state, type, path,
                       numOptions, options, optionValues);
}

KC_EXPORT CUresult cuLinkAddFile(CUlinkState state, CUjitInputType type, const char *path,
                                 unsigned int numOptions, CUjit_option *options,
                                 void **optionValues)
{
    return do_add_file((add_file_fn)REAL(real_add_file, "cuLinkAddFile"), state, type, path,
                       numOptions, options, optionValues);
}

/* Fills a log buffer as the driver did: the stored text cut to the buffer
 * (the key holds its size), a NUL, and the size option's value. */
static void log_replay(char *buf, size_t size, int idx, void **vals, const struct kc__lout *o)
{
    if (buf != NULL && size > 0) {
        size_t n = o->nbytes < size - 1 ? o->nbytes : size - 1;
        if (n > 0)
            memcpy(buf, o->bytes, n);
        buf[n] = 0;
    }
    if (idx >= 0 && o->size_set)
        vals[idx] = (void *)(uintptr_t)o->size;
}

/* What the driver left in a log buffer and its size option. */
static int log_capture(const char *buf, size_t size, int idx, void *const *vals, struct kc__lout *o)
{
    if (buf != NULL && size > 0) {
        size_t n = strnlen(buf, size);
        if (n == size)
            n = size - 1; /* no NUL: replayed with one, as the rule has it */
        o->bytes = malloc(n + 1);
        if (o->bytes == NULL)
            return -ENOMEM;
        memcpy(o->bytes, buf, n);
        o->bytes[n] = 0;
        o->nbytes = n;
    }
    if (idx >= 0) {
        o->size_set = 1;
        o->size = (uint64_t)(uintptr_t)vals[idx];
    }
    return 0;
}

static struct kc__lrec *capture(const struct cl_priv *p, CUresult rc, bool written, void *cubin,
                                size_t size)
{
    struct kc__lrec *r = calloc(1, sizeof *r);
    if (r == NULL)
        return NULL;
    r->api = KC_LREC_CULINK;
    r->complete_rc = rc;
    struct kc__lout *c = &r->out[LOUT_CUBIN];
    c->size_set = written;
    c->size = size;
    if (written && cubin != NULL && size > 0 && size < (1ull << 34)) {
        c->bytes = malloc(size + 1);
        if (c->bytes == NULL)
            goto fail;
        memcpy(c->bytes, cubin, size);
        c->nbytes = size;
    } else if (written && size > 0) {
        goto fail; /* a size without bytes to keep: not replayable */
    }
    if (log_capture(p->lg.info_buf, p->lg.info_size, p->lg.info_idx, p->vals,
                    &r->out[LOUT_INFO_LOG]) ||
        log_capture(p->lg.error_buf, p->lg.error_size, p->lg.error_idx, p->vals,
                    &r->out[LOUT_ERROR_LOG]))
        goto fail;
    return r;
fail:
    kc__lrec_free(r);
    return NULL;
}

KC_EXPORT CUresult cuLinkComplete(CUlinkState state, void **cubinOut, size_t *sizeOut)
{
    complete_fn real = (complete_fn)REAL(real_complete, "cuLinkComplete");
    if (real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct kc__link_sess *s = kc__guard_held() ? NULL : kc__link_get(state, &cl_ops);
    if (s == NULL)
        return real(state, cubinOut, sizeOut);
    kc__guard_enter();
    uint64_t t0 = kc_mono_ns();
    const struct cl_priv *p = s->priv;
    CUresult rc;
    if (cubinOut == NULL || sizeOut == NULL) {
        kc__link_pass(s, KC_PASS_input);
        rc = real(state, cubinOut, sizeOut);
    } else if (kc__link_complete_begin(s, t0)) {
        const struct kc__lrec *r = s->served;
        log_replay(p->lg.info_buf, p->lg.info_size, p->lg.info_idx, p->vals,
                   &r->out[LOUT_INFO_LOG]);
        log_replay(p->lg.error_buf, p->lg.error_size, p->lg.error_idx, p->vals,
                   &r->out[LOUT_ERROR_LOG]);
        if (p->lg.wall_idx >= 0) {
            float ms = (float)(kc_mono_ns() - t0) / 1e6f;
            memcpy(&p->vals[p->lg.wall_idx], &ms,
                   sizeof ms); /* a float in the slot, as the driver */
        }
        if (r->out[LOUT_CUBIN].size_set) {
            /* Lives in the record until cuLinkDestroy. */
            *cubinOut = r->out[LOUT_CUBIN].nbytes > 0 ? r->out[LOUT_CUBIN].bytes : NULL;
            *sizeOut = r->out[LOUT_CUBIN].size;
        }
        rc = r->complete_rc;
    } else {
        bool live = s->state == KC_LINK_LIVE;
        void *const unset = (void *)(uintptr_t)0x5a5a5a5a5a5a5a5aull;
        void *cubin = unset;
        size_t size = (size_t)0xa5a5a5a5a5a5a5a5ull;
        uint64_t c0 = kc_mono_ns();
        rc = real(state, &cubin, &size);
        uint64_t took = kc_mono_ns() - c0;
        bool wrote_cubin = cubin != unset, wrote_size = size != (size_t)0xa5a5a5a5a5a5a5a5ull;
        if (wrote_cubin)
            *cubinOut = cubin;
        if (wrote_size)
            *sizeOut = size;
        bool cacheable = live && cl_cacheable(rc) && wrote_cubin == wrote_size;
        struct kc__lrec *rec = cacheable ? capture(p, rc, wrote_cubin, cubin, size) : NULL;
        kc__link_complete_end(s, rc, rec, cacheable, took);
    }
    kc__guard_exit();
    kc__link_put(s);
    return rc;
}

KC_EXPORT CUresult cuLinkDestroy(CUlinkState state)
{
    destroy_fn real = (destroy_fn)REAL(real_destroy, "cuLinkDestroy");
    if (real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (kc__guard_held())
        return real(state);
    struct kc__link_sess *s = kc__link_take(state, &cl_ops);
    kc__guard_enter();
    CUresult rc = real(state);
    kc__guard_exit();
    if (s != NULL) {
        if (rc != CUDA_SUCCESS)
            kc__link_restore(s);
        else
            kc__link_put(s);
    }
    return rc;
}

/* Hidden aliases: the table points at our own code whatever the lookup
 * order (as driver.c's). */
#define ALIAS(name)                                                                                \
    extern __typeof__(name) kc__wl_##name __attribute__((alias(#name), visibility("hidden")));
ALIAS(cuLinkCreate)
ALIAS(cuLinkCreate_v2)
ALIAS(cuLinkAddData)
ALIAS(cuLinkAddData_v2)
ALIAS(cuLinkAddFile)
ALIAS(cuLinkAddFile_v2)
ALIAS(cuLinkComplete)
ALIAS(cuLinkDestroy)

#define HOOK(name, var)                                                                            \
    {                                                                                              \
#name, (void *)kc__wl_##name, &var, KC_LIB_CUDA                                            \
    }
const struct kc__hook kc__culink_hooks[] = {
    HOOK(cuLinkCreate, real_create),
    HOOK(cuLinkCreate_v2, real_create_v2),
    HOOK(cuLinkAddData, real_add),
    HOOK(cuLinkAddData_v2, real_add_v2),
    HOOK(cuLinkAddFile, real_add_file),
    HOOK(cuLinkAddFile_v2, real_add_file_v2),
    HOOK(cuLinkComplete, real_complete),
    HOOK(cuLinkDestroy, real_destroy),
    {NULL, NULL, NULL, 0},
};

/* The family of the driver's cuLink* (hook.h). */
KC__FAMILY(culink, KC_LIB_CUDA, kc__culink_hooks, NULL, NULL);
