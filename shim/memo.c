/*
 * The context memo (the seed's OpCache, one per CUDA context).
 *
 * Per context, keyed by cuCtxGetId (a context handle can be reused after
 * destroy; its id cannot):
 *   - function lookups: cuModuleGetFunction (module, name), cuLibraryGetKernel
 *     (library, name) and cuKernelGetFunction (kernel) -> the handle the
 *     driver returned. Only successes are remembered, so every error comes
 *     from the driver. Entries of a module or library are dropped when it is
 *     unloaded; everything of a context when it is destroyed, reset, or
 *     released for the last time. A handle from one context is never
 *     returned in another.
 *   - an allocation pool: blocks the host frees with cuMemFree_v2 are kept
 *     (bounded by KCACHE_ALLOC_POOL bytes per context) and serve later
 *     cuMemAlloc_v2 calls of exactly the same size in the same context. On
 *     out-of-memory every pool of the device is released and the allocation
 *     retried once, so the pool never causes an OOM the program would not
 *     have had. Pools are released before their context is destroyed.
 *     KCACHE_ALLOC_FALLBACK=managed latches managed memory for a context
 *     after its first failed allocation.
 *   - first-N diagnostics, counted per context.
 *
 * The pool is invisible to the host: a block is served again only for a
 * request of exactly its size (the driver reports an allocation's size as
 * requested), and a block whose SYNC_MEMOPS attribute was set is not kept
 * (a new allocation has it off). The queries that could tell are hooked:
 * cuMemGetInfo(_v2) releases the pools of the device first, so the
 * driver's own figure counts the memory the host freed as free;
 * cuPointerGetAttribute, cuPointerGetAttributes, cuPointerSetAttribute and
 * cuMemGetAddressRange_v2 on a block the pool holds release that block
 * first, so the driver answers as for any freed pointer; and a block served
 * again reports a buffer id of its own (CU_POINTER_ATTRIBUTE_BUFFER_ID,
 * documented as never reused in a process), taken from the top half of the
 * 64-bit range, far above the driver's own counter.
 *
 * One mutex guards it all; nothing inside it calls the driver except the
 * frees that release a pool and the SYNC_MEMOPS check of a block being
 * pooled.
 */
#include "driver.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define KC_MEMO_REAL_DEF(name) void *kc__real_##name;
KC_MEMO_WRAPPERS(KC_MEMO_REAL_DEF)
#undef KC_MEMO_REAL_DEF

#define REAL(name) ((__typeof__(&name))kc__cu_memo_real(&kc__real_##name, #name))

static void *kc__cu_memo_real(void **slot, const char *name)
{
    void *p = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    return p ? p : kc__cu_hooked_real(name);
}

/* Unhooked driver functions the memo needs. */
static struct {
    CUresult (*ctx_get_current)(CUcontext *);
    CUresult (*ctx_get_id)(CUcontext, unsigned long long *);
    CUresult (*ctx_get_device)(CUdevice *);
    CUresult (*ctx_push)(CUcontext);
    CUresult (*ctx_pop)(CUcontext *);
    CUresult (*primary_state)(CUdevice, unsigned *, int *);
    CUresult (*alloc_managed)(CUdeviceptr *, size_t, unsigned);
    CUresult (*ptr_attr)(void *, CUpointer_attribute, CUdeviceptr);
    int ok;
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void drv_resolve(void)
{
    const struct kc__cu_need need[] = {
        {"cuCtxGetCurrent", &drv.ctx_get_current},
        {"cuCtxGetId", &drv.ctx_get_id},
        {"cuCtxGetDevice", &drv.ctx_get_device},
        {"cuCtxPushCurrent_v2", &drv.ctx_push},
        {"cuCtxPopCurrent_v2", &drv.ctx_pop},
        {"cuDevicePrimaryCtxGetState", &drv.primary_state},
        {"cuMemAllocManaged", &drv.alloc_managed},
        {"cuPointerGetAttribute", &drv.ptr_attr},
    };
    drv.ok = kc__cu_real_all(need, sizeof need / sizeof *need);
}

static bool ready(void)
{
    pthread_once(&drv_once, drv_resolve);
    return drv.ok;
}

/* ---- contexts ----------------------------------------------------------- */

enum { DIAG_MISS, DIAG_OOM, DIAG_FALLBACK, N_DIAG };

struct block {
    CUdeviceptr ptr;
    size_t size;
};

struct mctx {
    struct mctx *next;
    unsigned long long id;
    CUcontext handle;
    CUdevice dev;
    struct block *pool;
    size_t n_pool, cap_pool;
    uint64_t pool_bytes;
    bool fell_back;        /* KCACHE_ALLOC_FALLBACK=managed latched */
    unsigned diag[N_DIAG]; /* first_n counters */
};

static pthread_mutex_t memo_lock = PTHREAD_MUTEX_INITIALIZER;
static struct mctx *contexts;
static CUcontext primary_handle[64]; /* by device, as cuDevicePrimaryCtxRetain returned it */

/* The seed's first_n: true for the first n times this context reaches key. */
static bool first_n(struct mctx *m, int key, unsigned n)
{
    return ++m->diag[key] <= n;
}

static struct mctx *mctx_find(unsigned long long id)
{
    for (struct mctx *m = contexts; m; m = m->next)
        if (m->id == id)
            return m;
    return NULL;
}

/* Under memo_lock. The context must be current (for its device). */
static struct mctx *mctx_get(unsigned long long id, CUcontext handle)
{
    struct mctx *m = mctx_find(id);
    if (m)
        return m;
    m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->id = id;
    m->handle = handle;
    if (drv.ctx_get_device(&m->dev) != CUDA_SUCCESS)
        m->dev = -1;
    m->next = contexts;
    contexts = m;
    return m;
}

/* The current context's id, or false when there is none. */
static bool current(CUcontext *ctx, unsigned long long *id)
{
    if (drv.ctx_get_current(ctx) != CUDA_SUCCESS || !*ctx)
        return false;
    return drv.ctx_get_id(*ctx, id) == CUDA_SUCCESS;
}

static void count_memo(uint64_t hits, uint64_t misses)
{
    struct kc_counters k = {.hits = hits, .misses = misses};
    kc__count("memo", &k);
}

/* ---- the function memo ---------------------------------------------------- */

enum { K_FUNC = 1, K_KERNEL, K_KFUNC };

struct entry {
    struct entry *next;
    unsigned long long ctx;
    int kind;
    const void *obj;    /* module, library or kernel */
    const void *parent; /* for K_KFUNC: the kernel's library, NULL if unknown */
    uint64_t name_hash;
    char *name;
    void *result;
};

#define N_BUCKETS 4096u
static struct entry *buckets[N_BUCKETS];

static uint64_t hash_name(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    if (s)
        for (; *s; s++)
            h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static unsigned bucket_of(unsigned long long ctx, int kind, const void *obj, uint64_t nh)
{
    uint64_t h = (ctx * 0x9e3779b97f4a7c15ull) ^
                 ((uint64_t)(uintptr_t)obj * 0xc2b2ae3d27d4eb4full) ^ nh ^ (uint64_t)kind;
    return (unsigned)(h ^ (h >> 29)) & (N_BUCKETS - 1);
}

static struct entry *lookup(unsigned long long ctx, int kind, const void *obj, const char *name,
                            uint64_t nh)
{
    for (struct entry *e = buckets[bucket_of(ctx, kind, obj, nh)]; e; e = e->next)
        if (e->ctx == ctx && e->kind == kind && e->obj == obj && e->name_hash == nh &&
            (!name || !strcmp(e->name, name)))
            return e;
    return NULL;
}

static void insert(unsigned long long ctx, int kind, const void *obj, const void *parent,
                   const char *name, uint64_t nh, void *result)
{
    struct entry *e = calloc(1, sizeof *e);
    if (!e)
        return;
    if (name && !(e->name = strdup(name))) {
        free(e);
        return;
    }
    e->ctx = ctx;
    e->kind = kind;
    e->obj = obj;
    e->parent = parent;
    e->name_hash = nh;
    e->result = result;
    unsigned b = bucket_of(ctx, kind, obj, nh);
    e->next = buckets[b];
    buckets[b] = e;
}

/* Drops every entry `drop` selects. Under memo_lock. */
static void drop_where(bool (*drop)(const struct entry *, const void *), const void *arg)
{
    for (unsigned b = 0; b < N_BUCKETS; b++) {
        struct entry **pp = &buckets[b];
        while (*pp) {
            struct entry *e = *pp;
            if (drop(e, arg)) {
                *pp = e->next;
                free(e->name);
                free(e);
            } else {
                pp = &e->next;
            }
        }
    }
}

static bool of_module(const struct entry *e, const void *m)
{
    return e->kind == K_FUNC && e->obj == m;
}

static bool of_library(const struct entry *e, const void *l)
{
    return (e->kind == K_KERNEL && e->obj == l) ||
           (e->kind == K_KFUNC && (e->parent == l || !e->parent));
}

static bool of_context(const struct entry *e, const void *id)
{
    return e->ctx == *(const unsigned long long *)id;
}

static bool memo_on(void)
{
    const struct kc_config *cfg = kc__config();
    return !cfg->disable && cfg->memo && !kc__guard_held() && ready();
}

KC_EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    __typeof__(&cuModuleGetFunction) real = REAL(cuModuleGetFunction);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUcontext ctx;
    unsigned long long id;
    if (!hfunc || !name || !memo_on() || !current(&ctx, &id))
        return real(hfunc, hmod, name);
    uint64_t nh = hash_name(name);
    pthread_mutex_lock(&memo_lock);
    struct entry *e = lookup(id, K_FUNC, hmod, name, nh);
    if (e) {
        *hfunc = e->result;
        pthread_mutex_unlock(&memo_lock);
        count_memo(1, 0);
        return CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&memo_lock);
    CUresult rc = real(hfunc, hmod, name);
    if (rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&memo_lock);
        struct mctx *m = mctx_get(id, ctx);
        if (m && first_n(m, DIAG_MISS, 3))
            kc_log(KC_LOG_DEBUG, "memo: context %llu resolved %s", id, name);
        if (!lookup(id, K_FUNC, hmod, name, nh))
            insert(id, K_FUNC, hmod, NULL, name, nh, *hfunc);
        pthread_mutex_unlock(&memo_lock);
        count_memo(0, 1);
    }
    return rc;
}

KC_EXPORT CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    __typeof__(&cuLibraryGetKernel) real = REAL(cuLibraryGetKernel);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pKernel || !name || !memo_on())
        return real(pKernel, library, name);
    /* Kernels belong to the library, not a context; without a current one
     * they are kept under context 0, dropped with the library. */
    CUcontext ctx;
    unsigned long long id = 0;
    if (!current(&ctx, &id))
        id = 0;
    uint64_t nh = hash_name(name);
    pthread_mutex_lock(&memo_lock);
    struct entry *e = lookup(id, K_KERNEL, library, name, nh);
    if (e) {
        *pKernel = e->result;
        pthread_mutex_unlock(&memo_lock);
        count_memo(1, 0);
        return CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&memo_lock);
    CUresult rc = real(pKernel, library, name);
    if (rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&memo_lock);
        if (!lookup(id, K_KERNEL, library, name, nh))
            insert(id, K_KERNEL, library, NULL, name, nh, *pKernel);
        pthread_mutex_unlock(&memo_lock);
        count_memo(0, 1);
    }
    return rc;
}

/* The library a kernel came from, if the memo saw it. Under memo_lock. */
static const void *library_of(const void *kernel)
{
    for (unsigned b = 0; b < N_BUCKETS; b++)
        for (struct entry *e = buckets[b]; e; e = e->next)
            if (e->kind == K_KERNEL && e->result == kernel)
                return e->obj;
    return NULL;
}

KC_EXPORT CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    __typeof__(&cuKernelGetFunction) real = REAL(cuKernelGetFunction);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUcontext ctx;
    unsigned long long id;
    if (!pFunc || !memo_on() || !current(&ctx, &id))
        return real(pFunc, kernel);
    pthread_mutex_lock(&memo_lock);
    struct entry *e = lookup(id, K_KFUNC, kernel, NULL, 0);
    if (e) {
        *pFunc = e->result;
        pthread_mutex_unlock(&memo_lock);
        count_memo(1, 0);
        return CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&memo_lock);
    CUresult rc = real(pFunc, kernel);
    if (rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&memo_lock);
        mctx_get(id, ctx);
        if (!lookup(id, K_KFUNC, kernel, NULL, 0))
            insert(id, K_KFUNC, kernel, library_of(kernel), NULL, 0, *pFunc);
        pthread_mutex_unlock(&memo_lock);
        count_memo(0, 1);
    }
    return rc;
}

KC_EXPORT CUresult cuModuleUnload(CUmodule hmod)
{
    __typeof__(&cuModuleUnload) real = REAL(cuModuleUnload);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real(hmod);
    if (rc == CUDA_SUCCESS) {
        /* Dropped whatever the switches say now: entries may predate them. */
        pthread_mutex_lock(&memo_lock);
        drop_where(of_module, hmod);
        pthread_mutex_unlock(&memo_lock);
    }
    return rc;
}

KC_EXPORT CUresult cuLibraryUnload(CUlibrary library)
{
    __typeof__(&cuLibraryUnload) real = REAL(cuLibraryUnload);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real(library);
    if (rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&memo_lock);
        drop_where(of_library, library);
        pthread_mutex_unlock(&memo_lock);
    }
    return rc;
}

/* ---- the allocation pool ----------------------------------------------------- */

enum { LIVE = 1, POOLED = 2, MANAGED = 3 };

/* Every block the pool knows: allocations it handed out (LIVE, MANAGED) and
 * blocks it holds (POOLED). Open addressing by pointer, tombstones = 0 ptr
 * with state -1. A block served from the pool carries the buffer id the
 * host is told (vid); 0 for one the driver allocated for this request. */
struct track {
    CUdeviceptr ptr;
    size_t size;
    unsigned long long ctx;
    int state;
    uint64_t vid;
};

static struct track *tracks;
static size_t track_cap, track_used;

/* Blocks a pointer query must look at: pooled ones and those served again.
 * Read without the lock: 0 lets every query through untouched. */
static size_t n_special;
/* Buffer ids of blocks served again: the top half of the 64-bit range. */
static uint64_t next_vid = 1ull << 63;

static bool special(const struct track *t)
{
    return t->state == POOLED || t->vid != 0;
}

static size_t track_slot(CUdeviceptr p)
{
    uint64_t h = (uint64_t)p * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 17) & (track_cap - 1);
}

static struct track *track_find(CUdeviceptr p)
{
    if (!track_cap)
        return NULL;
    for (size_t i = track_slot(p);; i = (i + 1) & (track_cap - 1)) {
        if (tracks[i].state == 0)
            return NULL;
        if (tracks[i].state > 0 && tracks[i].ptr == p)
            return &tracks[i];
    }
}

/* Places t in a free slot (the table has room). */
static void track_insert(const struct track *t)
{
    size_t i = track_slot(t->ptr);
    while (tracks[i].state > 0)
        i = (i + 1) & (track_cap - 1);
    if (tracks[i].state == 0)
        track_used++;
    tracks[i] = *t;
}

static int track_grow(void)
{
    size_t cap = track_cap ? track_cap * 2 : 1024;
    struct track *old = tracks;
    size_t old_cap = track_cap;
    tracks = calloc(cap, sizeof *tracks);
    if (!tracks) {
        tracks = old;
        return -1;
    }
    track_cap = cap;
    track_used = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].state > 0)
            track_insert(&old[i]);
    free(old);
    return 0;
}

/* Records what p is now; n_special follows. */
static void track_put(CUdeviceptr p, size_t size, unsigned long long ctx, int state, uint64_t vid)
{
    struct track n = {p, size, ctx, state, vid};
    struct track *t = track_find(p);
    if (t) {
        bool was = special(t);
        *t = n;
        __atomic_store_n(&n_special, n_special - was + special(t), __ATOMIC_RELEASE);
        return;
    }
    if ((track_used + 1) * 2 > track_cap && track_grow() != 0)
        return;
    track_insert(&n);
    if (special(&n))
        __atomic_store_n(&n_special, n_special + 1, __ATOMIC_RELEASE);
}

static void track_drop(struct track *t)
{
    if (special(t))
        __atomic_store_n(&n_special, n_special - 1, __ATOMIC_RELEASE);
    t->state = -1; /* tombstone */
    t->ptr = 0;
    t->vid = 0;
}

/* Frees every block of m's pool (m's context is pushed current for it).
 * Called with memo_lock held; the blocks are taken out first. */
static size_t pool_release(struct mctx *m)
{
    if (!m->n_pool)
        return 0;
    __typeof__(&cuMemFree_v2) real_free = REAL(cuMemFree_v2);
    bool pushed = drv.ctx_push(m->handle) == CUDA_SUCCESS;
    size_t n = m->n_pool;
    for (size_t i = 0; i < m->n_pool; i++) {
        struct track *t = track_find(m->pool[i].ptr);
        if (t)
            track_drop(t);
        if (real_free)
            real_free(m->pool[i].ptr);
    }
    if (pushed) {
        CUcontext dummy;
        drv.ctx_pop(&dummy);
    }
    m->n_pool = 0;
    m->pool_bytes = 0;
    return n;
}

/* Forgets a context that is gone (or about to go): its pool is released by
 * the caller first; its entries and tracked blocks dropped. Under memo_lock. */
static void mctx_forget(unsigned long long id)
{
    drop_where(of_context, &id);
    for (size_t i = 0; i < track_cap; i++)
        if (tracks[i].state > 0 && tracks[i].ctx == id)
            track_drop(&tracks[i]);
    for (struct mctx **pp = &contexts; *pp; pp = &(*pp)->next) {
        if ((*pp)->id == id) {
            struct mctx *m = *pp;
            *pp = m->next;
            free(m->pool);
            free(m);
            return;
        }
    }
}

static bool alloc_on(void)
{
    const struct kc_config *cfg = kc__config();
    return !cfg->disable && cfg->alloc && !kc__guard_held() && ready();
}

/* Whether the block at p may have CU_POINTER_ATTRIBUTE_SYNC_MEMOPS set
 * (cuPointerSetAttribute, or as a side effect of a P2P_TOKENS query): a new
 * allocation has it off, so such a block is not pooled. An unanswered query
 * counts as set. */
static bool sync_memops(CUdeviceptr p)
{
    unsigned long long v = 0; /* wide enough whatever width the driver writes */
    return drv.ptr_attr(&v, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p) != CUDA_SUCCESS || v != 0;
}

KC_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    __typeof__(&cuMemAlloc_v2) real = REAL(cuMemAlloc_v2);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUcontext ctx;
    unsigned long long id;
    if (!dptr || !bytesize || !alloc_on() || !current(&ctx, &id))
        return real(dptr, bytesize);
    const struct kc_config *cfg = kc__config();
    pthread_mutex_lock(&memo_lock);
    struct mctx *m = mctx_get(id, ctx);
    if (!m) {
        pthread_mutex_unlock(&memo_lock);
        return real(dptr, bytesize);
    }
    if (m->fell_back) {
        pthread_mutex_unlock(&memo_lock);
        CUdeviceptr p;
        CUresult rc = drv.alloc_managed(&p, bytesize, CU_MEM_ATTACH_GLOBAL);
        if (rc == CUDA_SUCCESS) {
            *dptr = p;
            pthread_mutex_lock(&memo_lock);
            track_put(p, bytesize, id, MANAGED, 0);
            pthread_mutex_unlock(&memo_lock);
        }
        return rc;
    }
    /* Exactly the size asked for, newest first: the driver reports an
     * allocation's size as requested (cuMemGetAddressRange,
     * CU_POINTER_ATTRIBUTE_RANGE_SIZE), so a larger block would show. The
     * block gets a buffer id of its own. */
    size_t best = SIZE_MAX;
    for (size_t i = m->n_pool; i-- > 0;) {
        if (m->pool[i].size == bytesize) {
            best = i;
            break;
        }
    }
    if (best != SIZE_MAX) {
        struct block b = m->pool[best];
        m->pool[best] = m->pool[--m->n_pool];
        m->pool_bytes -= b.size;
        track_put(b.ptr, b.size, id, LIVE, next_vid++);
        pthread_mutex_unlock(&memo_lock);
        *dptr = b.ptr;
        count_memo(1, 0);
        return CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&memo_lock);

    CUdeviceptr p = 0;
    CUresult rc = real(&p, bytesize);
    if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
        /* Our pools may hold what the host needs: give everything of this
         * device back and retry once. */
        size_t released = 0;
        pthread_mutex_lock(&memo_lock);
        for (struct mctx *o = contexts; o; o = o->next)
            if (o->dev == m->dev)
                released += pool_release(o);
        if (released && first_n(m, DIAG_OOM, 1))
            kc_log(KC_LOG_INFO,
                   "memo: out of device memory in context %llu; released %zu pooled blocks", id,
                   released);
        pthread_mutex_unlock(&memo_lock);
        if (released)
            rc = real(&p, bytesize);
    }
    if (rc != CUDA_SUCCESS && rc == CUDA_ERROR_OUT_OF_MEMORY &&
        cfg->alloc_fallback == KC_ALLOC_FALLBACK_MANAGED) {
        /* Opt-in: this context uses managed memory from now on (the seed's
         * alloc_fell_back), so a failing device allocation is not retried
         * per tensor. A new context tries device memory again. */
        CUresult mrc = drv.alloc_managed(&p, bytesize, CU_MEM_ATTACH_GLOBAL);
        pthread_mutex_lock(&memo_lock);
        m = mctx_get(id, ctx);
        if (m) {
            m->fell_back = true;
            if (first_n(m, DIAG_FALLBACK, 1))
                kc_log(
                    KC_LOG_WARN,
                    "device allocation failed in context %llu; it uses managed memory from now on",
                    id);
        }
        if (mrc == CUDA_SUCCESS)
            track_put(p, bytesize, id, MANAGED, 0);
        pthread_mutex_unlock(&memo_lock);
        if (mrc == CUDA_SUCCESS) {
            *dptr = p;
            return CUDA_SUCCESS;
        }
        return rc;
    }
    if (rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&memo_lock);
        track_put(p, bytesize, id, LIVE, 0);
        pthread_mutex_unlock(&memo_lock);
        *dptr = p;
        count_memo(0, 1);
    }
    return rc;
}

KC_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    __typeof__(&cuMemFree_v2) real = REAL(cuMemFree_v2);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!dptr || kc__guard_held())
        return real(dptr);
    const struct kc_config *cfg = kc__config();
    pthread_mutex_lock(&memo_lock);
    struct track *t = track_find(dptr);
    if (!t) {
        pthread_mutex_unlock(&memo_lock);
        return real(dptr);
    }
    if (t->state == POOLED) {
        /* Freed already: the block is ours now. The driver's answer to a
         * double free. */
        pthread_mutex_unlock(&memo_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct mctx *m = mctx_find(t->ctx);
    bool keep = t->state == LIVE && m && cfg->alloc && !cfg->disable && !m->fell_back &&
                m->pool_bytes + t->size <= cfg->alloc_pool && !sync_memops(dptr);
    if (keep && m->n_pool == m->cap_pool) {
        size_t cap = m->cap_pool ? m->cap_pool * 2 : 16;
        struct block *nb = realloc(m->pool, cap * sizeof *nb);
        if (nb) {
            m->pool = nb;
            m->cap_pool = cap;
        } else {
            keep = false;
        }
    }
    if (!keep) {
        track_drop(t);
        pthread_mutex_unlock(&memo_lock);
        return real(dptr);
    }
    m->pool[m->n_pool++] = (struct block){dptr, t->size};
    m->pool_bytes += t->size;
    track_put(dptr, t->size, t->ctx, POOLED, t->vid);
    pthread_mutex_unlock(&memo_lock);
    return CUDA_SUCCESS;
}

/* Pooled blocks are free memory as far as the host is concerned. Adding
 * their sizes to the driver's figure would not give the driver's answer
 * (it rounds allocations to its own granularity and suballocates), so the
 * pools of the current context's device are released first and the
 * driver answers. */
static void release_device_pools(void)
{
    CUcontext ctx;
    unsigned long long id;
    CUdevice dev;
    if (kc__guard_held() || !ready() || !current(&ctx, &id) ||
        drv.ctx_get_device(&dev) != CUDA_SUCCESS)
        return;
    pthread_mutex_lock(&memo_lock);
    for (struct mctx *m = contexts; m; m = m->next)
        if (m->dev == dev)
            pool_release(m);
    pthread_mutex_unlock(&memo_lock);
}

KC_EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total)
{
    __typeof__(&cuMemGetInfo_v2) real = REAL(cuMemGetInfo_v2);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    release_device_pools();
    return real(free_b, total);
}

/* The first variant (32-bit figures), still exported by the driver. */
KC_EXPORT CUresult cuMemGetInfo(unsigned int *free_b, unsigned int *total)
{
    __typeof__(&cuMemGetInfo) real = REAL(cuMemGetInfo);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    release_device_pools();
    return real(free_b, total);
}

/* ---- pointer queries ----------------------------------------------------------- */

enum { PTR_OTHER, PTR_POOLED, PTR_SERVED };

/* What the block holding p is to the pool: one it holds (the host freed
 * it), one it served again (*vid: the buffer id the host is told), or
 * neither. A pointer inside a block is found through the driver's answer
 * for its start, asked only while such blocks exist. */
static int block_of(CUdeviceptr p, CUdeviceptr *base, uint64_t *vid)
{
    if (__atomic_load_n(&n_special, __ATOMIC_ACQUIRE) == 0 || kc__guard_held() || !ready())
        return PTR_OTHER;
    *base = p;
    pthread_mutex_lock(&memo_lock);
    bool known = track_find(p) != NULL;
    pthread_mutex_unlock(&memo_lock);
    if (!known) {
        CUdeviceptr start = 0;
        if (drv.ptr_attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p) != CUDA_SUCCESS ||
            start == p)
            return PTR_OTHER;
        *base = start;
    }
    int kind = PTR_OTHER;
    pthread_mutex_lock(&memo_lock);
    struct track *t = track_find(*base);
    if (t && p - *base < t->size) {
        if (t->state == POOLED)
            kind = PTR_POOLED;
        else if (t->state == LIVE && t->vid) {
            kind = PTR_SERVED;
            *vid = t->vid;
        }
    }
    pthread_mutex_unlock(&memo_lock);
    return kind;
}

/* Frees the pooled block at base for real (the host freed it already), so
 * that the driver answers a query about it as about any freed pointer. */
static void pool_forget(CUdeviceptr base)
{
    pthread_mutex_lock(&memo_lock);
    struct track *t = track_find(base);
    struct mctx *m = t && t->state == POOLED ? mctx_find(t->ctx) : NULL;
    for (size_t i = 0; m && i < m->n_pool; i++) {
        if (m->pool[i].ptr != base)
            continue;
        m->pool_bytes -= m->pool[i].size;
        m->pool[i] = m->pool[--m->n_pool];
        track_drop(t);
        __typeof__(&cuMemFree_v2) real_free = REAL(cuMemFree_v2);
        bool pushed = drv.ctx_push(m->handle) == CUDA_SUCCESS;
        if (real_free)
            real_free(base);
        if (pushed) {
            CUcontext dummy;
            drv.ctx_pop(&dummy);
        }
        break;
    }
    pthread_mutex_unlock(&memo_lock);
}

KC_EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    __typeof__(&cuPointerGetAttribute) real = REAL(cuPointerGetAttribute);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUdeviceptr base;
    uint64_t vid = 0;
    int kind = block_of(ptr, &base, &vid);
    if (kind == PTR_POOLED)
        pool_forget(base);
    CUresult rc = real(data, attribute, ptr);
    if (rc == CUDA_SUCCESS && kind == PTR_SERVED && attribute == CU_POINTER_ATTRIBUTE_BUFFER_ID)
        *(unsigned long long *)data = vid;
    return rc;
}

KC_EXPORT CUresult cuPointerGetAttributes(unsigned int numAttributes,
                                          CUpointer_attribute *attributes, void **data,
                                          CUdeviceptr ptr)
{
    __typeof__(&cuPointerGetAttributes) real = REAL(cuPointerGetAttributes);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUdeviceptr base;
    uint64_t vid = 0;
    int kind = block_of(ptr, &base, &vid);
    if (kind == PTR_POOLED)
        pool_forget(base);
    CUresult rc = real(numAttributes, attributes, data, ptr);
    for (unsigned i = 0; rc == CUDA_SUCCESS && kind == PTR_SERVED && i < numAttributes; i++)
        if (attributes[i] == CU_POINTER_ATTRIBUTE_BUFFER_ID && data[i])
            *(unsigned long long *)data[i] = vid;
    return rc;
}

KC_EXPORT CUresult cuPointerSetAttribute(const void *value, CUpointer_attribute attribute,
                                         CUdeviceptr ptr)
{
    __typeof__(&cuPointerSetAttribute) real = REAL(cuPointerSetAttribute);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUdeviceptr base;
    uint64_t vid;
    if (block_of(ptr, &base, &vid) == PTR_POOLED)
        pool_forget(base);
    return real(value, attribute, ptr);
}

KC_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    __typeof__(&cuMemGetAddressRange_v2) real = REAL(cuMemGetAddressRange_v2);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUdeviceptr base;
    uint64_t vid;
    if (block_of(dptr, &base, &vid) == PTR_POOLED)
        pool_forget(base);
    return real(pbase, psize, dptr);
}

/* ---- context lifetime ---------------------------------------------------------- */

/* Before a context goes: release its pool while it still exists. */
static void before_destroy(CUcontext ctx, unsigned long long *id, bool *known)
{
    *known = false;
    if (!ready() || !ctx || drv.ctx_get_id(ctx, id) != CUDA_SUCCESS)
        return;
    *known = true;
    pthread_mutex_lock(&memo_lock);
    struct mctx *m = mctx_find(*id);
    if (m)
        pool_release(m);
    pthread_mutex_unlock(&memo_lock);
}

static CUresult ctx_destroy(CUresult (*real)(CUcontext), CUcontext ctx)
{
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    unsigned long long id;
    bool known;
    before_destroy(ctx, &id, &known);
    CUresult rc = real(ctx);
    if (rc == CUDA_SUCCESS && known) {
        pthread_mutex_lock(&memo_lock);
        mctx_forget(id);
        pthread_mutex_unlock(&memo_lock);
    }
    return rc;
}

KC_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    return ctx_destroy(REAL(cuCtxDestroy_v2), ctx);
}

KC_EXPORT CUresult cuCtxDestroy(CUcontext ctx)
{
    return ctx_destroy(REAL(cuCtxDestroy), ctx);
}

KC_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    __typeof__(&cuDevicePrimaryCtxRetain) real = REAL(cuDevicePrimaryCtxRetain);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real(pctx, dev);
    if (rc == CUDA_SUCCESS && dev >= 0 && dev < 64)
        __atomic_store_n(&primary_handle[dev], *pctx, __ATOMIC_RELEASE);
    return rc;
}

/* Primary release and reset: the pool goes before the call (a release may be
 * the last); afterwards, every context of the device the memo knows is
 * checked, and those that are gone (or changed id) are forgotten. */
static CUresult primary_call(CUresult (*real)(CUdevice), CUdevice dev)
{
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ready() || dev < 0 || dev >= 64)
        return real(dev);
    CUcontext p = __atomic_load_n(&primary_handle[dev], __ATOMIC_ACQUIRE);
    unsigned long long id;
    bool known = false;
    if (p)
        before_destroy(p, &id, &known);
    CUresult rc = real(dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&memo_lock);
    bool again = true;
    while (again) {
        again = false;
        for (struct mctx *m = contexts; m; m = m->next) {
            unsigned long long now;
            if (m->dev != dev)
                continue;
            if (drv.ctx_get_id(m->handle, &now) != CUDA_SUCCESS || now != m->id) {
                mctx_forget(m->id);
                again = true;
                break;
            }
        }
    }
    pthread_mutex_unlock(&memo_lock);
    return rc;
}

KC_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    return primary_call(REAL(cuDevicePrimaryCtxRelease_v2), dev);
}

KC_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return primary_call(REAL(cuDevicePrimaryCtxRelease), dev);
}

KC_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    return primary_call(REAL(cuDevicePrimaryCtxReset_v2), dev);
}

KC_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    return primary_call(REAL(cuDevicePrimaryCtxReset), dev);
}

/* Hidden aliases for the hook table (memo.h). */
#define KC_MEMO_ALIAS(name)                                                                        \
    extern __typeof__(name) kc__w_##name __attribute__((alias(#name), visibility("hidden")));
KC_MEMO_WRAPPERS(KC_MEMO_ALIAS)
#undef KC_MEMO_ALIAS
