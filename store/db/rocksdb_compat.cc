// rocksdb_compat.cc: the three C API functions kcache calls that RocksDB
// 6.11 (Debian bullseye, Ubuntu 22.04: a build against the system's) does not have,
// written over its C++ API, which has had each setting for years. Compiled
// only where the RocksDB found lacks them (store/db/meson.build), so a build
// against 7.x uses RocksDB's own.
//
// The C API's handles are defined in its c.cc, not in a header; these two
// match its definitions in 6.11 (an Env pointer first; an Options value).
#include "rocksdb_compat.h"

#include <rocksdb/c.h>
#include <rocksdb/env.h>
#include <rocksdb/options.h>

struct rocksdb_env_t {
    rocksdb::Env *rep;
    bool is_default;
};

struct rocksdb_options_t {
    rocksdb::Options rep;
};

extern "C" {

void rocksdb_env_set_low_priority_background_threads(rocksdb_env_t *env, int n)
{
    env->rep->SetBackgroundThreads(n, rocksdb::Env::LOW);
}

void rocksdb_env_set_bottom_priority_background_threads(rocksdb_env_t *env, int n)
{
    env->rep->SetBackgroundThreads(n, rocksdb::Env::BOTTOM);
}

void rocksdb_options_set_stats_persist_period_sec(rocksdb_options_t *opt, unsigned int v)
{
    opt->rep.stats_persist_period_sec = v;
}
}
