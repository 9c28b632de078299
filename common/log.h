/*
 * The one logging family: kc_log(LEVEL, fmt, ...), level read once from
 * KCACHE_LOG. Lines go to stderr as "kcache: <level>: <message>".
 */
#ifndef KCACHE_LOG_H
#define KCACHE_LOG_H

#include "config.h"

/* Sets the level; called once by whoever read the configuration. */
void kc__log_set_level(int level);

/* Whether a message at `level` would be printed. */
int kc__log_enabled(int level);

void kc_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Logs at most once per call site: for the one warning an internal failure
 * is allowed to print before falling back. */
#define kc_log_once(level, ...)                                                                    \
    do {                                                                                           \
        static int kc__once_;                                                                      \
        if (!__atomic_exchange_n(&kc__once_, 1, __ATOMIC_RELAXED))                                 \
            kc_log(level, __VA_ARGS__);                                                            \
    } while (0)

#endif
