/*
 * The bottom of the shim (core.c): what every part, mechanism and family
 * alike, may use. Not installed, not exported.
 *
 * libkcache.so is built with -fvisibility=hidden; only the intercepted
 * CUDA/NVRTC/libc names are exported (KC_EXPORT). Internal non-static names
 * carry the kc__ prefix.
 */
#ifndef KCACHE_SHIM_CORE_H
#define KCACHE_SHIM_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/config.h"
#include "../common/log.h"
#include "../common/clock.h"
#include "../common/identity.h"
#include "../store/store.h"

#define KC_EXPORT __attribute__((visibility("default")))

/* The few small statics that the constructors and a fresh process's first
 * NVRTC hit write, gathered in one section (kc_hot, which the linker places
 * after .data) rather than spread over .bss's 260 KiB: each first touch of
 * a page there is a page fault (2-3 us in a VM; a page first read, then
 * written, faults twice), and a first hit touched nine such pages. Zero-
 * initialised, writable and small only: the section is file-backed. */
#define KC__HOT __attribute__((section("kc_hot")))

/* Makes the page holding *p present for writing before it is read: a
 * hash table's bucket that is read, then written, on a page never touched
 * faults twice (the zero page, then its copy); written first, once. The
 * byte keeps its value; call it with the table's lock held. */
static inline void kc__touch_for_write(void *p)
{
    __atomic_fetch_or((unsigned char *)p, 0, __ATOMIC_RELAXED);
}

/* The configuration, read once on first use (thread-safe). */
const struct kc_config *kc__config(void);

/* Whether the configuration has been read (a hook or the interposer reached
 * kcache); reading it is kc__config's. */
bool kc__config_loaded(void);

/* libkcache.so's absolute path, found before main; NULL when unknown. */
const char *kc__self_path(void);

/* Finds it: called by the entry's first constructor (shim.c). */
void kc__self_locate(void);

/* kcache's own build (the seed's build id): the build-id of libkcache.so. */
uint64_t kc__self_build(void);

/* ---- re-entry guard --------------------------------------------------- */

/* NVRTC's compile dlopen()s libcuda and calls cuInit; hooks run inside
 * hooks. A hook that finds the guard held on its thread passes straight
 * through to the real function. enter() returns false when already held. */
bool kc__guard_enter(void);
void kc__guard_exit(void);
bool kc__guard_held(void);

#endif
