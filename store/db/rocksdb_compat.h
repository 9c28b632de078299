/*
 * rocksdb_compat.h: what differs with RocksDB 6.11 (Debian bullseye's):
 * the declarations of what its c.h lacks and rocksdb_compat.cc supplies,
 * and the one option it takes differently. KC_ROCKSDB_COMPAT is defined by
 * store/db/meson.build when c.h lacks those functions.
 */
#ifndef KCACHE_STORE_DB_ROCKSDB_COMPAT_H
#define KCACHE_STORE_DB_ROCKSDB_COMPAT_H

/* A secondary instance's max_open_files: RocksDB 6.11 refuses anything but
 * -1 ("require max_open_files to be -1"), so there a reader opens every
 * table at open; 7.x opens them lazily. */
#ifdef KC_ROCKSDB_COMPAT
#define KC_ROCKSDB_SECONDARY_MAX_OPEN_FILES (-1)
#else
#define KC_ROCKSDB_SECONDARY_MAX_OPEN_FILES 256
#endif

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
