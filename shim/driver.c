/*
 * The driver path: interception of libcuda and the driver JIT cache.
 *
 * cuModuleLoadData, cuModuleLoadDataEx, cuModuleLoadFatBinary and
 * cuLibraryLoadData are wrapped. A PTX image, or a fatbinary with no SASS
 * for the device, is keyed (format version, image bytes, the JIT options
 * that affect code, compute capability, driver version and libcuda
 * build-id); a miss compiles it with the driver's own linker
 * (cuLinkCreate/cuLinkAddData/cuLinkComplete), stores the cubin and the
 * linker's info log, and loads the cubin; a hit loads the stored cubin. Log
 * buffers are filled as the driver fills them. Everything else (cubin
 * images, fatbinaries with matching SASS, options the cache cannot replay,
 * bad input) goes to the real function untouched, so the host sees the
 * driver's own answer.
 *
 * The linker needs a current context; the library API does not. A library
 * load with none current compiles in the device's primary context when it
 * is active (retained and pushed for the compile, then popped and
 * released), else in a context created for the compile and destroyed after
 * it: the caller's thread is left with no context, and the primary's state
 * and reference count are what they were.
 *
 * Concurrent misses on one key compile once (single flight, flight.h): the
 * others wait for the holder's result and load it.
 *
 * PTX the driver's JIT rejects (cuLinkAddData: CUDA_ERROR_INVALID_PTX or
 * CUDA_ERROR_UNSUPPORTED_PTX_VERSION) is answered from that one compile:
 * its code, and its logs in the host's buffers, as the host's own call
 * would have compiled the same PTX with the same options and failed the
 * same way (the premise that lets the linker's cubin and info log stand for
 * the load's in the first place). Nothing is stored. Any other failure of
 * the linker goes to the real function.
 *
 * cuGetProcAddress and cuGetProcAddress_v2 call the real resolver, then
 * kc__swap() hands out our wrapper for the symbol actually returned.
 */
#include "driver.h"
#include "flight.h"
#include "../common/buf.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define BACKEND "jit"

/* ---- real functions -------------------------------------------------------- */

static void *real_load_data, *real_load_data_ex, *real_load_fatbin, *real_lib_load;
static void *real_gpa, *real_gpa_v2;
static void *real_module_load, *real_lib_load_file; /* the loads from a file */

typedef CUresult (*load_data_fn)(CUmodule *, const void *);
typedef CUresult (*load_data_ex_fn)(CUmodule *, const void *, unsigned, CUjit_option *, void **);
typedef CUresult (*lib_load_fn)(CUlibrary *, const void *, CUjit_option *, void **, unsigned,
                                CUlibraryOption *, void **, unsigned);
typedef CUresult (*gpa_v2_fn)(const char *, void **, int, cuuint64_t,
                              CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*module_load_fn)(CUmodule *, const char *);
typedef CUresult (*lib_load_file_fn)(CUlibrary *, const char *, CUjit_option *, void **, unsigned,
                                     CUlibraryOption *, void **, unsigned);

#define REAL(var, name) ((var) ? (var) : kc__hook_real(kc__hook_find(name, KC_LIB_CUDA)))

void *kc__cu_hooked_real(const char *name)
{
    const struct kc__hook *h = kc__hook_find(name, KC_LIB_CUDA);
    return h ? kc__hook_real(h) : NULL;
}

/* The libcuda the host uses, as a handle, found from any real pointer we
 * hold. */
static void *cuda_handle(void)
{
    static void *handle;
    void *h = __atomic_load_n(&handle, __ATOMIC_ACQUIRE);
    if (h)
        return h;
    void *any = NULL;
    for (const struct kc__hook *k = kc__driver_hooks; k->name && !any; k++)
        any = __atomic_load_n(k->real, __ATOMIC_ACQUIRE);
    if (!any)
        any = kc__real_dlsym(RTLD_NEXT, "cuInit");
    if (!any) /* loaded RTLD_LOCAL by a library linked against it */
        any = kc__lib_real(KC_LIB_CUDA, "cuInit");
    Dl_info di;
    if (!any || !dladdr(any, &di) || !di.dli_fname)
        return NULL;
    h = dlopen(di.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    if (h)
        __atomic_store_n(&handle, h, __ATOMIC_RELEASE);
    return h;
}

void *kc__cu_real(const char *name)
{
    void *h = cuda_handle();
    void *p = h ? kc__real_dlsym(h, name) : NULL;
    return p ? p : kc__real_dlsym(RTLD_NEXT, name);
}

int kc__cu_real_all(const struct kc__cu_need *need, size_t n)
{
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        void *p = kc__cu_real(need[i].name);
        memcpy(need[i].slot, &p, sizeof p);
        ok = ok && p != NULL;
    }
    return ok;
}

/* Real driver entry points the JIT path calls, resolved once. */
static struct {
    CUresult (*ctx_get_current)(CUcontext *);
    CUresult (*ctx_get_device)(CUdevice *);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*device_get_count)(int *);
    CUresult (*device_attr)(int *, CUdevice_attribute, CUdevice);
    CUresult (*driver_version)(int *);
    CUresult (*link_create)(unsigned, CUjit_option *, void **, CUlinkState *);
    CUresult (*link_add)(CUlinkState, CUjitInputType, void *, size_t, const char *, unsigned,
                         CUjit_option *, void **);
    CUresult (*link_complete)(CUlinkState, void **, size_t *);
    CUresult (*link_destroy)(CUlinkState);
    int ok;
    /* For a compile with no context current (the library API). */
    CUresult (*primary_state)(CUdevice, unsigned *, int *);
    CUresult (*primary_retain)(CUcontext *, CUdevice);
    CUresult (*primary_release)(CUdevice);
    CUresult (*ctx_create)(CUcontext *, unsigned, CUdevice);
    CUresult (*ctx_destroy)(CUcontext);
    CUresult (*ctx_push)(CUcontext);
    CUresult (*ctx_pop)(CUcontext *);
    int ctx_ok;
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void drv_resolve(void)
{
    const struct kc__cu_need need[] = {
        {"cuCtxGetCurrent", &drv.ctx_get_current},  {"cuCtxGetDevice", &drv.ctx_get_device},
        {"cuDeviceGet", &drv.device_get},           {"cuDeviceGetCount", &drv.device_get_count},
        {"cuDeviceGetAttribute", &drv.device_attr}, {"cuDriverGetVersion", &drv.driver_version},
        {"cuLinkCreate_v2", &drv.link_create},      {"cuLinkAddData_v2", &drv.link_add},
        {"cuLinkComplete", &drv.link_complete},     {"cuLinkDestroy", &drv.link_destroy},
    };
    drv.ok = kc__cu_real_all(need, sizeof need / sizeof *need);
    const struct kc__cu_need ctx_need[] = {
        {"cuDevicePrimaryCtxGetState", &drv.primary_state},
        {"cuDevicePrimaryCtxRetain", &drv.primary_retain},
        {"cuDevicePrimaryCtxRelease_v2", &drv.primary_release},
        {"cuCtxCreate_v2", &drv.ctx_create},
        {"cuCtxDestroy_v2", &drv.ctx_destroy},
        {"cuCtxPushCurrent_v2", &drv.ctx_push},
        {"cuCtxPopCurrent_v2", &drv.ctx_pop},
    };
    drv.ctx_ok = kc__cu_real_all(ctx_need, sizeof ctx_need / sizeof *ctx_need);
}

/* ---- images ------------------------------------------------------------------ */

#define MAX_IMAGE (1ull << 30)
#define FATBIN_MAGIC 0xBA55ED50u
#define FATBIN_WRAPPER_MAGIC 0x466243b1u

struct fatbin_header {
    uint32_t magic;
    uint16_t version;
    uint16_t header_size;
    uint64_t fat_size;
};

struct fatbin_entry {
    uint16_t kind; /* 1 PTX, 2 ELF */
    uint16_t version;
    uint32_t header_size;
    uint64_t padded_size;
    uint32_t compressed_size;
    uint32_t unknown0;
    uint16_t minor, major;
    uint32_t arch;
    uint32_t name_offset, name_len;
    uint64_t flags;
    uint64_t zero;
    uint64_t uncompressed_size;
};

/* Images come at any address (a host may pass a pointer into a string), so
 * fields are read with memcpy, never through a misaligned struct pointer. */
static uint32_t u32_at(const void *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static const void *fatbin_unwrap(const void *p)
{
    if (u32_at(p) == FATBIN_WRAPPER_MAGIC) {
        const void *inner;
        memcpy(&inner, (const char *)p + 8, sizeof inner);
        return inner;
    }
    return p;
}

enum image_kind { IMG_OTHER, IMG_PTX, IMG_FATBIN_JIT };

static bool looks_like_ptx(const char *s)
{
    for (size_t i = 0; i < 4096 && s[i]; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 9 || (c > 13 && c < 32 && c != 27) || c == 127)
            return false;
        if (c == '.' && !strncmp(s + i, ".version", 8))
            return true;
    }
    return false;
}

/* Whether a fatbinary needs the JIT on a device of major.minor: no SASS
 * entry runs there but a PTX entry does. Malformed: IMG_OTHER (the driver
 * answers). */
static enum image_kind fatbin_kind(const void *p, size_t *len, int major, int minor)
{
    struct fatbin_header fh;
    memcpy(&fh, p, sizeof fh);
    if (fh.magic != FATBIN_MAGIC || fh.header_size < sizeof fh || fh.fat_size > MAX_IMAGE)
        return IMG_OTHER;
    const unsigned char *b = (const unsigned char *)p + fh.header_size, *end = b + fh.fat_size;
    bool sass = false, ptx = false;
    while ((size_t)(end - b) >= sizeof(struct fatbin_entry)) {
        struct fatbin_entry e;
        memcpy(&e, b, sizeof e);
        if (e.header_size < sizeof e || e.padded_size > fh.fat_size ||
            e.header_size + e.padded_size > (size_t)(end - b))
            return IMG_OTHER;
        int arch = (int)e.arch;
        if (e.kind == 2 && arch / 10 == major && arch % 10 <= minor)
            sass = true;
        else if (e.kind == 1 && arch <= major * 10 + minor)
            ptx = true;
        else if (e.kind != 1 && e.kind != 2)
            return IMG_OTHER;
        b += e.header_size + e.padded_size;
    }
    *len = fh.header_size + fh.fat_size;
    return !sass && ptx ? IMG_FATBIN_JIT : IMG_OTHER;
}

/* ---- JIT options ------------------------------------------------------------- */

struct jit_req {
    /* The host's log buffers and where to write back. */
    struct kc__jit_logs lg;
    /* Options for the linker: the host's code-affecting ones and ours. */
    unsigned n;
    CUjit_option opt[72];
    void *val[72];
};

void kc__jit_logs_init(struct kc__jit_logs *l)
{
    memset(l, 0, sizeof *l);
    l->info_idx = l->error_idx = l->wall_idx = -1;
}

bool kc__jit_log_option(struct kc__jit_logs *l, CUjit_option o, void *v, unsigned i)
{
    switch (o) {
    case CU_JIT_INFO_LOG_BUFFER:
        l->info_buf = v;
        return true;
    case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES:
        l->info_size = (unsigned)(uintptr_t)v;
        l->info_idx = (int)i;
        return true;
    case CU_JIT_ERROR_LOG_BUFFER:
        l->error_buf = v;
        return true;
    case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES:
        l->error_size = (unsigned)(uintptr_t)v;
        l->error_idx = (int)i;
        return true;
    case CU_JIT_WALL_TIME:
        l->wall_idx = (int)i;
        return true;
    default:
        return false;
    }
}

bool kc__jit_code_option(CUjit_option o)
{
    switch (o) {
    case CU_JIT_MAX_REGISTERS:
    case CU_JIT_OPTIMIZATION_LEVEL:
    case CU_JIT_TARGET_FROM_CUCONTEXT:
    case CU_JIT_TARGET:
    case CU_JIT_FALLBACK_STRATEGY:
    case CU_JIT_GENERATE_DEBUG_INFO:
    case CU_JIT_LOG_VERBOSE: /* decides the info log we store */
    case CU_JIT_GENERATE_LINE_INFO:
    case CU_JIT_CACHE_MODE:
    case CU_JIT_NEW_SM3X_OPT:
    case CU_JIT_FAST_COMPILE:
    case CU_JIT_FTZ:
    case CU_JIT_PREC_DIV:
    case CU_JIT_PREC_SQRT:
    case CU_JIT_FMA:
    case CU_JIT_OPTIMIZE_UNUSED_DEVICE_VARIABLES:
    case CU_JIT_POSITION_INDEPENDENT_CODE:
    case CU_JIT_MIN_CTA_PER_SM:
    case CU_JIT_MAX_THREADS_PER_BLOCK:
    case CU_JIT_OVERRIDE_DIRECTIVE_VALUES:
    case CU_JIT_SPLIT_COMPILE:
        return true;
    default: /* THREADS_PER_BLOCK (in/out), global symbols, referenced names, LTO... */
        return false;
    }
}

/* Sorts the host's options into log handling and code-affecting ones, and
 * hashes the latter. Returns false when the request cannot be replayed from
 * the cache (pointer-valued or output options, unknown ones, bad arrays):
 * those go to the driver untouched. */
static bool jit_req_parse(unsigned n, CUjit_option *opt, void **val, struct jit_req *r,
                          struct kc__hasher *h)
{
    memset(r, 0, sizeof *r);
    kc__jit_logs_init(&r->lg);
    if (n && (!opt || !val))
        return false;
    if (n > 64)
        return false;
    for (unsigned i = 0; i < n; i++) {
        if (kc__jit_log_option(&r->lg, opt[i], val[i], i))
            continue;
        if (!kc__jit_code_option(opt[i]))
            return false; /* THREADS_PER_BLOCK (in/out), global symbols, names, LTO... */
        kc__hash_u64(h, (uint64_t)opt[i]);
        kc__hash_u64(h, (uint64_t)(unsigned)(uintptr_t)val[i]); /* read as 32-bit values */
        r->opt[r->n] = opt[i];
        r->val[r->n++] = val[i];
    }
    return true;
}

/* Fills a host log buffer as the driver does: at most size-1 characters and
 * a NUL, the size option overwritten with the characters written. This is
 * the rule the stand-in implements; scripts/gpu-check compares it with the
 * real driver's. */
static void log_fill(char *buf, size_t size, int idx, void **vals, const char *log, size_t len)
{
    if (!buf || size == 0)
        return;
    size_t n = len < size - 1 ? len : size - 1;
    if (n)
        memcpy(buf, log, n);
    buf[n] = 0;
    if (idx >= 0)
        vals[idx] = (void *)(uintptr_t)n;
}

static void req_finish(const struct jit_req *r, void **vals, const char *info, size_t info_len,
                       uint64_t started)
{
    log_fill(r->lg.info_buf, r->lg.info_size, r->lg.info_idx, vals, info, info_len);
    log_fill(r->lg.error_buf, r->lg.error_size, r->lg.error_idx, vals, "", 0);
    if (r->lg.wall_idx >= 0) {
        float ms = (float)(kc_mono_ns() - started) / 1e6f;
        memcpy(&vals[r->lg.wall_idx], &ms,
               sizeof ms); /* a float in the pointer slot, as the driver */
    }
}

/* Fills the host's logs with what a failed compile wrote. */
static void req_fail(const struct jit_req *r, void **vals, const char *info, const char *error,
                     uint64_t started)
{
    log_fill(r->lg.info_buf, r->lg.info_size, r->lg.info_idx, vals, info, strlen(info));
    log_fill(r->lg.error_buf, r->lg.error_size, r->lg.error_idx, vals, error, strlen(error));
    if (r->lg.wall_idx >= 0) {
        float ms = (float)(kc_mono_ns() - started) / 1e6f;
        memcpy(&vals[r->lg.wall_idx], &ms, sizeof ms);
    }
}

/* ---- driver identity --------------------------------------------------------- */

struct device_id {
    int major, minor;
    int version;
    kc_digest lib; /* build-id of the libcuda in use */
    CUdevice dev;  /* the device compiled for */
    bool has_ctx;  /* a context is current */
    int ndev;      /* devices (all of this capability) when none is */
};

static kc_digest driver_lib_id;
static int driver_lib_state; /* 0 unknown, 1 known, -1 failed */
static pthread_mutex_t id_lock = PTHREAD_MUTEX_INITIALIZER;

static int driver_identity(kc_digest *out)
{
    pthread_mutex_lock(&id_lock);
    if (driver_lib_state == 0) {
        Dl_info di;
        void *any = (void *)drv.link_create;
        driver_lib_state = -1;
        if (any && dladdr(any, &di) && di.dli_fname &&
            kc__loaded_identity(any, &driver_lib_id) == 0)
            driver_lib_state = 1;
        else
            kc_log(KC_LOG_WARN, "cannot identify the CUDA driver library; the JIT cache is off");
    }
    *out = driver_lib_id;
    int rc = driver_lib_state == 1 ? 0 : -1;
    pthread_mutex_unlock(&id_lock);
    return rc;
}

/* The device an image loads for: the current context's, or for the library
 * API without one, device 0 when every device has the same capability. */
static int device_of(bool library, struct device_id *d)
{
    CUcontext c = NULL;
    CUdevice dev = 0;
    if (drv.ctx_get_current(&c) != CUDA_SUCCESS)
        return -1;
    if (c) {
        if (drv.ctx_get_device(&dev) != CUDA_SUCCESS)
            return -1;
    } else if (!library) {
        return -1;
    }
    d->dev = dev;
    d->has_ctx = c != NULL;
    d->ndev = 1;
    if (drv.device_attr(&d->major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) ||
        drv.device_attr(&d->minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
        return -1;
    if (library) {
        /* A library serves every device: one cubin fits only if all agree. */
        int n = 0;
        if (drv.device_get_count(&n) != CUDA_SUCCESS)
            return -1;
        d->ndev = n;
        for (int i = 0; i < n; i++) {
            int a = 0, b = 0;
            if (drv.device_attr(&a, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, i) ||
                drv.device_attr(&b, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, i) ||
                a != d->major || b != d->minor)
                return -1;
        }
    }
    if (drv.driver_version(&d->version) != CUDA_SUCCESS)
        return -1;
    return driver_identity(&d->lib);
}

/* ---- the stored record --------------------------------------------------------- */

/* body: u32 magic "KCJ2", u32 info_len, u64 cubin_len (little-endian),
 * info bytes, cubin bytes. "KCJ1" was the same in the host's byte order
 * (record format 1). */
#define JIT_MAGIC 0x324a434bu

static void *record_make(const char *info, size_t info_len, const void *cubin, size_t cubin_len,
                         size_t *len)
{
    *len = 16 + info_len + cubin_len;
    unsigned char *b = malloc(*len);
    if (!b)
        return NULL;
    kc_le_put_u32(b, JIT_MAGIC);
    kc_le_put_u32(b + 4, (uint32_t)info_len);
    kc_le_put_u64(b + 8, cubin_len);
    memcpy(b + 16, info, info_len);
    memcpy(b + 16 + info_len, cubin, cubin_len);
    return b;
}

static int record_parse(const unsigned char *b, size_t len, const char **info, size_t *info_len,
                        const void **cubin, size_t *cubin_len)
{
    if (len < 16)
        return -EBADMSG;
    uint32_t m = kc_le_get_u32(b), il = kc_le_get_u32(b + 4);
    uint64_t cl = kc_le_get_u64(b + 8);
    if (m != JIT_MAGIC || il > len - 16 || cl != len - 16 - il || cl < 64 ||
        memcmp(b + 16 + il, "\177ELF", 4))
        return -EBADMSG;
    *info = (const char *)b + 16;
    *info_len = il;
    *cubin = b + 16 + il;
    *cubin_len = cl;
    return 0;
}

/* ---- the JIT cache --------------------------------------------------------------- */

enum load_api { API_DATA, API_DATA_EX, API_FATBIN, API_LIBRARY };

struct load_call {
    enum load_api api;
    CUmodule *mod;
    CUlibrary *lib;
    const void *image;
    unsigned n;
    CUjit_option *opt;
    void **val;
    CUlibraryOption *lopt;
    void **lval;
    unsigned ln;
    /* A load from a file (cuModuleLoad, cuLibraryLoadFromFile): its path;
     * image is then its content, read once. */
    const char *path;
};

static CUresult call_real(const struct load_call *c)
{
    if (c->path != NULL && c->api == API_LIBRARY) {
        lib_load_file_fn f = (lib_load_file_fn)REAL(real_lib_load_file, "cuLibraryLoadFromFile");
        return f ? f(c->lib, c->path, c->opt, c->val, c->n, c->lopt, c->lval, c->ln)
                 : CUDA_ERROR_NOT_INITIALIZED;
    }
    if (c->path != NULL) {
        module_load_fn f = (module_load_fn)REAL(real_module_load, "cuModuleLoad");
        return f ? f(c->mod, c->path) : CUDA_ERROR_NOT_INITIALIZED;
    }
    switch (c->api) {
    case API_DATA: {
        load_data_fn f = (load_data_fn)REAL(real_load_data, "cuModuleLoadData");
        return f ? f(c->mod, c->image) : CUDA_ERROR_NOT_INITIALIZED;
    }
    case API_DATA_EX: {
        load_data_ex_fn f = (load_data_ex_fn)REAL(real_load_data_ex, "cuModuleLoadDataEx");
        return f ? f(c->mod, c->image, c->n, c->opt, c->val) : CUDA_ERROR_NOT_INITIALIZED;
    }
    case API_FATBIN: {
        load_data_fn f = (load_data_fn)REAL(real_load_fatbin, "cuModuleLoadFatBinary");
        return f ? f(c->mod, c->image) : CUDA_ERROR_NOT_INITIALIZED;
    }
    case API_LIBRARY: {
        lib_load_fn f = (lib_load_fn)REAL(real_lib_load, "cuLibraryLoadData");
        return f ? f(c->lib, c->image, c->opt, c->val, c->n, c->lopt, c->lval, c->ln)
                 : CUDA_ERROR_NOT_INITIALIZED;
    }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

/* The real function that loads a cubin for this call: cuLibraryLoadData
 * for the library API, else cuModuleLoadData, which the host may never have
 * looked up (a host that dlopen()s libcuda RTLD_LOCAL and resolves only
 * cuModuleLoadDataEx): then it is found in the libcuda the host uses. NULL
 * when there is none. */
static void *cubin_loader(enum load_api api)
{
    if (api == API_LIBRARY) {
        void *f = REAL(real_lib_load, "cuLibraryLoadData");
        return f ? f : kc__cu_real("cuLibraryLoadData");
    }
    void *f = REAL(real_load_data, "cuModuleLoadData");
    return f ? f : kc__cu_real("cuModuleLoadData");
}

/* Loads a cubin the way the host asked for (module or library). */
static CUresult load_cubin(const struct load_call *c, const void *cubin)
{
    void *f = cubin_loader(c->api);
    if (f == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (c->api == API_LIBRARY)
        return ((lib_load_fn)f)(c->lib, cubin, NULL, NULL, 0, c->lopt, c->lval, c->ln);
    return ((load_data_fn)f)(c->mod, cubin);
}

/* Adds the counters given by name: count((struct kc_counters){.hits = 1}). */
static void count(struct kc_counters k)
{
    kc__count(BACKEND, &k);
}

#define INFO_LOG_MAX (256u << 10)

/* Compiles with the driver's linker. On success *cubin (malloc'd) and the
 * info log (malloc'd) are set. On failure *rejected says whether the JIT
 * rejected the input itself (cuLinkAddData: invalid or too new PTX), and
 * then the info and error logs (malloc'd) are set. The input is given no
 * name, as the loader's JIT names none. */
static CUresult link_image(const void *image, size_t len, CUjitInputType type, struct jit_req *r,
                           void **cubin, size_t *cubin_len, char **info, char **error,
                           bool *rejected)
{
    *rejected = false;
    char *ibuf = calloc(1, INFO_LOG_MAX), *ebuf = calloc(1, INFO_LOG_MAX);
    if (!ibuf || !ebuf) {
        free(ibuf);
        free(ebuf);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    unsigned n = r->n;
    r->opt[n] = CU_JIT_INFO_LOG_BUFFER;
    r->val[n++] = ibuf;
    r->opt[n] = CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES;
    r->val[n++] = (void *)(uintptr_t)INFO_LOG_MAX;
    r->opt[n] = CU_JIT_ERROR_LOG_BUFFER;
    r->val[n++] = ebuf;
    r->opt[n] = CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES;
    r->val[n++] = (void *)(uintptr_t)INFO_LOG_MAX;
    CUlinkState ls = NULL;
    CUresult rc = drv.link_create(n, r->opt, r->val, &ls);
    if (rc == CUDA_SUCCESS) {
        rc = drv.link_add(ls, type, (void *)image, len, NULL, 0, NULL, NULL);
        *rejected = rc == CUDA_ERROR_INVALID_PTX || rc == CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
    }
    void *out = NULL;
    size_t out_len = 0;
    if (rc == CUDA_SUCCESS)
        rc = drv.link_complete(ls, &out, &out_len);
    if (rc == CUDA_SUCCESS) {
        *cubin = malloc(out_len);
        if (*cubin) {
            memcpy(*cubin, out, out_len);
            *cubin_len = out_len;
        } else {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    if (ls)
        drv.link_destroy(ls);
    if (rc == CUDA_SUCCESS || *rejected) {
        *info = ibuf;
        ibuf = NULL;
    }
    if (*rejected) {
        *error = ebuf;
        ebuf = NULL;
    }
    free(ibuf);
    free(ebuf);
    return rc;
}

/* A context for the linker when the host has none current (the library
 * API, whose devices all have one capability): the first active primary
 * context, retained and pushed; else one created on the device for the
 * compile. jit_ctx_leave undoes exactly that. */
struct jit_ctx {
    int how; /* 0 nothing done, 1 primary retained and pushed, 2 created */
    CUcontext ctx;
    CUdevice dev;
};

static CUresult jit_ctx_enter(struct jit_ctx *j, const struct device_id *d)
{
    j->how = 0;
    if (d->has_ctx)
        return CUDA_SUCCESS;
    if (!drv.ctx_ok)
        return CUDA_ERROR_INVALID_CONTEXT;
    for (CUdevice i = 0; i < d->ndev; i++) {
        unsigned flags = 0;
        int active = 0;
        if (drv.primary_state(i, &flags, &active) != CUDA_SUCCESS || !active ||
            drv.primary_retain(&j->ctx, i) != CUDA_SUCCESS)
            continue;
        j->dev = i;
        if (drv.ctx_push(j->ctx) == CUDA_SUCCESS) {
            j->how = 1;
            return CUDA_SUCCESS;
        }
        drv.primary_release(i);
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    CUresult rc = drv.ctx_create(&j->ctx, 0, d->dev); /* created current */
    if (rc == CUDA_SUCCESS)
        j->how = 2;
    return rc;
}

static void jit_ctx_leave(struct jit_ctx *j)
{
    CUcontext popped;
    if (j->how == 1) {
        drv.ctx_pop(&popped);
        drv.primary_release(j->dev);
    } else if (j->how == 2) {
        drv.ctx_pop(&popped);
        drv.ctx_destroy(j->ctx);
    }
    j->how = 0;
}

/* Serves the call from the store when it holds the key: the stored cubin
 * loaded as the host asked, its info log in the host's buffers. Returns
 * true when the call was answered (*rc set, the guard left, counted): a
 * hit, or a stored cubin the driver refused, when the driver answers the
 * host's own call. False on a miss, or after purging a bad record. */
static bool serve_stored(struct load_call *c, struct kc_store *st, const struct kc_store_ops *api,
                         const char *ns, const kc_key *key, const struct jit_req *r, uint64_t t0,
                         bool entered, CUresult *rc)
{
    void *body = NULL;
    size_t blen = 0;
    struct kc_record_info info;
    if (api->get(st, ns, key, &body, &blen, &info) != 0)
        return false;
    const char *ilog;
    size_t ilen, clen;
    const void *cubin;
    if (record_parse(body, blen, &ilog, &ilen, &cubin, &clen) != 0) {
        /* A bad record: purge, compile. */
        kc_log(KC_LOG_WARN, "jit: discarding a stored cubin the driver did not load");
        api->purge(st, ns, key);
        api->free(body);
        count((struct kc_counters){.errors = 1});
        return false;
    }
    *rc = load_cubin(c, cubin);
    if (*rc == CUDA_SUCCESS) {
        req_finish(r, c->val, ilog, ilen, t0);
        api->free(body);
        if (entered)
            kc__guard_exit();
        count((struct kc_counters){.hits = 1, .saved_ns = info.saved_ns});
        return true;
    }
    /* Refused: the stored cubin, or the host's own request (a library
     * option the driver rejects, no memory)? The driver answers the host's
     * call; only when it accepts that is the stored cubin at fault, and
     * purged. A hostile request must not purge good entries or print
     * warnings. */
    api->free(body);
    if (entered)
        kc__guard_exit();
    *rc = call_real(c);
    if (*rc == CUDA_SUCCESS) {
        kc_log(KC_LOG_WARN, "jit: discarding a stored cubin the driver did not load");
        api->purge(st, ns, key);
        count((struct kc_counters){.errors = 1});
    } else {
        kc__pass_reason(BACKEND, KC_PASS_refused);
        count((struct kc_counters){.passthrough = 1});
    }
    return true;
}

/* serve_stored's arguments, for the cluster-wide wait's polls. */
struct serve_poll {
    struct load_call *c;
    struct kc_store *st;
    const struct kc_store_ops *api;
    const char *ns;
    const kc_key *key;
    const struct jit_req *r;
    uint64_t t0;
    bool entered;
    CUresult *rc;
};

/* kc__flight_remote's poll: 1 when the call was answered, else 0. */
static int serve_poll(void *arg)
{
    struct serve_poll *a = arg;
    return serve_stored(a->c, a->st, a->api, a->ns, a->key, a->r, a->t0, a->entered, a->rc);
}

/* What a load asks the JIT for, once the cache takes it: the device, the
 * image to compile and its kind, the request's options, key and
 * namespace. */
struct jit_job {
    struct device_id d;
    enum image_kind kind;
    const void *data;
    size_t len;
    struct jit_req r;
    kc_key key;
    char ns[64];
    enum kc_pass_reason why; /* JOB_PASS: why */
};

/* How jit_job_make decided. */
enum jit_verdict {
    JOB_CACHE, /* *j is filled: look it up, compile on a miss */
    JOB_PASS,  /* not for the cache (cubin, SASS for the device, options): counted */
    JOB_REAL,  /* the driver answers (no context, not initialised): not counted */
    JOB_ERROR, /* an internal failure: counted */
};

/* Classifies the load and, for one the cache takes, fills *j. */
static enum jit_verdict jit_job_make(struct load_call *c, struct jit_job *j)
{
    /* What is it? Cubins, and fatbinaries with SASS for the device, pass. */
    const unsigned char *img = c->image;
    j->why = KC_PASS_input;
    if (!memcmp(img, "\177ELF", 4))
        return JOB_PASS;
    if (device_of(c->api == API_LIBRARY, &j->d) != 0)
        return JOB_REAL; /* no context, no device: the driver answers */
    j->kind = IMG_OTHER;
    j->len = 0;
    j->data = img;
    if (u32_at(fatbin_unwrap(img)) == FATBIN_MAGIC) {
        j->data = fatbin_unwrap(img);
        j->kind = fatbin_kind(j->data, &j->len, j->d.major, j->d.minor);
    } else if (c->api != API_FATBIN && looks_like_ptx((const char *)img)) {
        j->kind = IMG_PTX;
        j->len = strlen((const char *)img) + 1;
    }
    if (j->kind == IMG_OTHER)
        return JOB_PASS;

    /* The key: the image, the options that change code, the device and the
     * driver. */
    struct kc__hasher *h = kc__hasher_new();
    if (!h)
        return JOB_ERROR;
    kc__hash_str(h, "kcache-jit");
    kc__hash_u64(h, KC_FORMAT_VERSION);
    kc__hash_u64(h, (uint64_t)j->kind);
    kc__hash_bytes(h, j->data, j->len);
    if (!jit_req_parse(c->n, c->opt, c->val, &j->r, h)) {
        kc__hasher_free(h);
        j->why = KC_PASS_option;
        return JOB_PASS;
    }
    kc__hash_u64(h, (uint64_t)j->d.major);
    kc__hash_u64(h, (uint64_t)j->d.minor);
    kc__hash_u64(h, (uint64_t)j->d.version);
    kc__hash_bytes(h, &j->d.lib, sizeof j->d.lib);
    j->key = (kc_key){kc__hash_digest(h), kc__self_build()};
    kc__hasher_free(h);
    /* The namespace: an entry for one device and driver never serves another. */
    if (kc__jit_namespace(j->d.major, j->d.minor, j->d.version, &j->d.lib, j->ns, sizeof j->ns,
                          NULL) != 0)
        return JOB_ERROR;
    return JOB_CACHE;
}

/* The locks and the guard a miss holds, let go once it is answered. */
struct jit_hold {
    int flight;   /* the local single-flight lock, -1 without */
    bool rheld;   /* the cluster-wide lock */
    bool entered; /* the re-entry guard */
};

static void jit_let_go(const struct jit_job *j, const struct jit_hold *hd, bool stored, size_t blen,
                       struct kc_counters k)
{
    kc__flight_remote_release(j->ns, &j->key, hd->rheld, stored, blen);
    kc__flight_release(hd->flight); /* after the put: waiters find it */
    if (hd->entered)
        kc__guard_exit();
    count(k);
}

/* A miss: the driver's own linker (in a context: the library API may have
 * none current), then load what it produced and store it. */
static CUresult jit_miss(struct load_call *c, struct jit_job *j, const struct jit_hold *hd,
                         struct kc_store *st, const struct kc_store_ops *api, uint64_t t0)
{
    const struct kc_config *cfg = kc__config();
    void *cubin = NULL;
    size_t clen = 0;
    char *ilog = NULL, *elog = NULL;
    bool rejected = false;
    struct jit_ctx jc;
    uint64_t c0 = kc_mono_ns();
    CUresult rc = jit_ctx_enter(&jc, &j->d);
    if (rc == CUDA_SUCCESS) {
        rc = link_image(j->data, j->len,
                        j->kind == IMG_PTX ? CU_JIT_INPUT_PTX : CU_JIT_INPUT_FATBINARY, &j->r,
                        &cubin, &clen, &ilog, &elog, &rejected);
        jit_ctx_leave(&jc);
    }
    uint64_t compile_ns = kc_mono_ns() - c0;
    if (rc != CUDA_SUCCESS && rejected) {
        /* The JIT rejected the PTX: the host's call would compile it the
         * same way and fail the same way. Its answer, once; not stored. */
        req_fail(&j->r, c->val, ilog, elog, t0);
        free(ilog);
        free(elog);
        kc__pass_reason(BACKEND, KC_PASS_refused);
        jit_let_go(j, hd, false, 0, (struct kc_counters){.passthrough = 1});
        return rc;
    }
    if (rc == CUDA_SUCCESS)
        rc = load_cubin(c, cubin);
    if (rc != CUDA_SUCCESS) {
        /* A linker that differs, no context, out of memory: the driver
         * answers the host's own call, logs and all. */
        free(cubin);
        free(ilog);
        kc__pass_reason(BACKEND, KC_PASS_refused);
        jit_let_go(j, hd, false, 0, (struct kc_counters){.passthrough = 1});
        return call_real(c);
    }
    size_t ilen = strlen(ilog);
    req_finish(&j->r, c->val, ilog, ilen, t0);
    uint64_t stores = 0;
    size_t blen = 0;
    if (st && !cfg->readonly) {
        void *body = record_make(ilog, ilen, cubin, clen, &blen);
        if (body && api->put(st, j->ns, &j->key, NULL, KC_KIND_JIT, body, blen, compile_ns) == 0)
            stores = 1;
        free(body);
    }
    free(cubin);
    free(ilog);
    jit_let_go(j, hd, stores != 0, blen,
               (struct kc_counters){.misses = 1, .stores = stores, .compile_ns = compile_ns});
    return CUDA_SUCCESS;
}

static CUresult jit_load(struct load_call *c)
{
    const struct kc_config *cfg = kc__config();
    if (kc__guard_held() || cfg->disable || !cfg->jit || !c->image ||
        (c->api == API_LIBRARY ? !c->lib : !c->mod))
        return call_real(c);
    pthread_once(&drv_once, drv_resolve);
    if (!drv.ok || cubin_loader(c->api) == NULL)
        return call_real(c);
    if (c->api == API_LIBRARY && c->ln && (!c->lopt || !c->lval))
        return call_real(c);
    uint64_t t0 = kc_mono_ns();

    struct jit_job j;
    switch (jit_job_make(c, &j)) {
    case JOB_CACHE:
        break;
    case JOB_PASS:
        kc__pass_reason(BACKEND, j.why);
        return count((struct kc_counters){.passthrough = 1}), call_real(c);
    case JOB_ERROR:
        return count((struct kc_counters){.errors = 1}), call_real(c);
    case JOB_REAL:
    default:
        return call_real(c);
    }

    struct jit_hold hd = {.flight = -1, .entered = kc__guard_enter()};
    const struct kc_store_ops *api = NULL;
    struct kc_store *st = kc__store(&api);
    CUresult rc;

    /* A hit loads the stored cubin. */
    if (st && !cfg->recache && serve_stored(c, st, api, j.ns, &j.key, &j.r, t0, hd.entered, &rc))
        return rc;

    /* Single flight: one process compiles a missed key, the others wait for
     * it and load its result. Look again once the lock is held: the holder
     * may have finished just before. */
    if (st) {
        bool waited = false;
        hd.flight = kc__flight_acquire(&j.key.id, &waited);
        if ((hd.flight >= 0 || waited) && !cfg->recache &&
            serve_stored(c, st, api, j.ns, &j.key, &j.r, t0, hd.entered, &rc)) {
            kc__flight_release(hd.flight);
            return rc;
        }
        /* Cluster-wide: one node compiles, the others load its cubin
         * through the remote. */
        struct serve_poll sp = {c, st, api, j.ns, &j.key, &j.r, t0, hd.entered, &rc};
        if (kc__flight_remote(j.ns, &j.key, serve_poll, &sp, &hd.rheld) == 1) {
            kc__flight_release(hd.flight);
            return rc;
        }
    }
    return jit_miss(c, &j, &hd, st, api, t0);
}

/* ---- exported wrappers ------------------------------------------------------------ */

KC_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    struct load_call c = {.api = API_DATA, .mod = module, .image = image};
    return jit_load(&c);
}

KC_EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int n,
                                      CUjit_option *options, void **values)
{
    struct load_call c = {
        .api = API_DATA_EX, .mod = module, .image = image, .n = n, .opt = options, .val = values};
    return jit_load(&c);
}

KC_EXPORT CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
    struct load_call c = {.api = API_FATBIN, .mod = module, .image = fatCubin};
    return jit_load(&c);
}

KC_EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                                     void **jitOptionsValues, unsigned int numJitOptions,
                                     CUlibraryOption *libraryOptions, void **libraryOptionValues,
                                     unsigned int numLibraryOptions)
{
    struct load_call c = {.api = API_LIBRARY,
                          .lib = library,
                          .image = code,
                          .n = numJitOptions,
                          .opt = jitOptions,
                          .val = jitOptionsValues,
                          .lopt = libraryOptions,
                          .lval = libraryOptionValues,
                          .ln = numLibraryOptions};
    return jit_load(&c);
}

KC_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                       cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *symbolStatus)
{
    gpa_v2_fn f = (gpa_v2_fn)REAL(real_gpa_v2, "cuGetProcAddress_v2");
    if (!f)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = f(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (rc == CUDA_SUCCESS && pfn && *pfn && !kc__guard_held())
        *pfn = kc__swap(symbol, *pfn);
    return rc;
}

KC_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags)
{
    gpa_fn f = (gpa_fn)REAL(real_gpa, "cuGetProcAddress");
    if (!f)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = f(symbol, pfn, cudaVersion, flags);
    if (rc == CUDA_SUCCESS && pfn && *pfn && !kc__guard_held())
        *pfn = kc__swap(symbol, *pfn);
    return rc;
}

/* ---- loads from a file ------------------------------------------------------------ */

/* cuModuleLoad and cuLibraryLoadFromFile: the file's content is read once
 * here and loaded as data (cuModuleLoadData, cuLibraryLoadData) is: its
 * content is the key, and a miss compiles and loads what was read. A file
 * that cannot be read whole (missing, unreadable, a directory, over 1 GiB,
 * changed while read), and every load the cache does not take, goes to the
 * driver's own file function, which answers as it does without kcache. */
#define FILE_LOAD_MAX (1ull << 30)

static void *file_read(const char *path)
{
    FILE *f = path != NULL ? fopen(path, "rbe") : NULL;
    if (f == NULL)
        return NULL;
    struct stat st;
    char *buf = NULL;
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size < FILE_LOAD_MAX &&
        (buf = malloc((size_t)st.st_size + 1)) != NULL) {
        size_t n = fread(buf, 1, (size_t)st.st_size + 1, f);
        struct stat after;
        if (n != (size_t)st.st_size || ferror(f) || fstat(fileno(f), &after) != 0 ||
            after.st_size != st.st_size || after.st_mtim.tv_sec != st.st_mtim.tv_sec ||
            after.st_mtim.tv_nsec != st.st_mtim.tv_nsec) {
            free(buf);
            buf = NULL;
        } else {
            buf[n] = '\0'; /* a PTX file's text, as a string */
        }
    }
    fclose(f);
    return buf;
}

static CUresult file_load(struct load_call *c)
{
    const struct kc_config *cfg = kc__config();
    void *image = NULL;
    if (kc__guard_held() || cfg->disable || !cfg->jit || (image = file_read(c->path)) == NULL)
        return call_real(c);
    c->image = image;
    CUresult rc = jit_load(c);
    free(image);
    return rc;
}

KC_EXPORT CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
    struct load_call c = {.api = API_DATA, .mod = module, .path = fname};
    return file_load(&c);
}

KC_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName,
                                         CUjit_option *jitOptions, void **jitOptionsValues,
                                         unsigned int numJitOptions,
                                         CUlibraryOption *libraryOptions,
                                         void **libraryOptionValues, unsigned int numLibraryOptions)
{
    struct load_call c = {.api = API_LIBRARY,
                          .lib = library,
                          .path = fileName,
                          .n = numJitOptions,
                          .opt = jitOptions,
                          .val = jitOptionsValues,
                          .lopt = libraryOptions,
                          .lval = libraryOptionValues,
                          .ln = numLibraryOptions};
    /* CU_LIBRARY_BINARY_IS_PRESERVED is invalid with a file: the driver
     * says so. */
    for (unsigned i = 0; libraryOptions != NULL && i < numLibraryOptions; i++)
        if (libraryOptions[i] == CU_LIBRARY_BINARY_IS_PRESERVED)
            return call_real(&c);
    return file_load(&c);
}

/* ---- the hook table ------------------------------------------------------------------ */

/* Hidden aliases: the table points at our own code whatever the lookup
 * order, at the exported function's address. */
#define ALIAS(name)                                                                                \
    extern __typeof__(name) kc__w_##name __attribute__((alias(#name), visibility("hidden")));
ALIAS(cuModuleLoadData)
ALIAS(cuModuleLoadDataEx)
ALIAS(cuModuleLoadFatBinary)
ALIAS(cuLibraryLoadData)
ALIAS(cuGetProcAddress_v2)
ALIAS(cuGetProcAddress)
ALIAS(cuModuleLoad)
ALIAS(cuLibraryLoadFromFile)

#define HOOK(name, var)                                                                            \
    {                                                                                              \
#name, (void *)kc__w_##name, &var, KC_LIB_CUDA                                             \
    }
#define MEMO_HOOK(name) {#name, (void *)kc__w_##name, &kc__real_##name, KC_LIB_CUDA},

const struct kc__hook kc__driver_hooks[] = {
    HOOK(cuModuleLoadData, real_load_data),
    HOOK(cuModuleLoadDataEx, real_load_data_ex),
    HOOK(cuModuleLoadFatBinary, real_load_fatbin),
    HOOK(cuLibraryLoadData, real_lib_load),
    HOOK(cuGetProcAddress_v2, real_gpa_v2),
    HOOK(cuGetProcAddress, real_gpa),
    HOOK(cuModuleLoad, real_module_load),
    HOOK(cuLibraryLoadFromFile, real_lib_load_file),
    KC_MEMO_WRAPPERS(MEMO_HOOK){NULL, NULL, NULL, 0},
};

/* The family of the driver JIT (hook.h). */
KC__FAMILY(driver, KC_LIB_CUDA, kc__driver_hooks, NULL, NULL);
