/*
 * The fuzz targets' common interface. Each target is one C file defining
 * LLVMFuzzerTestOneInput (libFuzzer's entry point) and kc_fuzz_seeds, which
 * writes a few valid inputs produced by the project's own encoders into a
 * directory (the seed corpus). scripts/fuzz links a target with libFuzzer;
 * replay.c links it with a main that feeds it every file of a corpus, which
 * is how the test suite replays the saved corpus.
 */
#ifndef KCACHE_FUZZ_H
#define KCACHE_FUZZ_H

#include <stddef.h>
#include <stdint.h>

/* libFuzzer's entry point: any bytes; returns 0. Crashes (or a sanitizer
 * report) on a bug. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Writes the target's seed inputs into dir (which exists) as seed-NN files.
 * Returns the number written, or a negative errno. */
int kc_fuzz_seeds(const char *dir);

/* Writes one seed file dir/seed-<name>; 0 or a negative errno. */
int kc_fuzz_write_seed(const char *dir, const char *name, const void *p, size_t n);

/* A malloc'd copy of exactly n bytes (at least one byte allocated), so the
 * address sanitizer catches any read past what the target was given. */
void *kc_fuzz_dup(const void *p, size_t n);

/* Aborts with a message when a property the target checks fails. */
#define KC_FUZZ_ASSERT(cond)                                                                       \
    do {                                                                                           \
        if (!(cond))                                                                               \
            kc_fuzz_fail(__FILE__, __LINE__, #cond);                                               \
    } while (0)
void kc_fuzz_fail(const char *file, int line, const char *what) __attribute__((noreturn));

#endif
