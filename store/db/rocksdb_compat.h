/*
 * rocksdb_compat.h: declarations of what RocksDB 6.11's c.h lacks and
 * rocksdb_compat.cc supplies; empty unless the build defines
 * KC_ROCKSDB_COMPAT (store/db/meson.build, when c.h lacks them).
 */
#ifndef KCACHE_STORE_DB_ROCKSDB_COMPAT_H
#define KCACHE_STORE_DB_ROCKSDB_COMPAT_H

#ifdef KC_ROCKSDB_COMPAT
#include <rocksdb/c.h>

#ifdef __cplusplus
extern "C" {
#endif
void rocksdb_env_set_low_priority_background_threads(rocksdb_env_t *env, int n);
void rocksdb_env_set_bottom_priority_background_threads(rocksdb_env_t *env, int n);
void rocksdb_options_set_stats_persist_period_sec(rocksdb_options_t *opt, unsigned int v);
#ifdef __cplusplus
}
#endif
#endif

#endif
