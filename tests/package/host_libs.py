#!/usr/bin/env python3
"""A host process with RocksDB and the C++ runtime of its own (as PyTorch
carries its libstdc++, and may carry RocksDB), into which the packaged
libkcache-store.so is loaded as the shim loads it (dlopen RTLD_LOCAL): the
host's RocksDB (the system's shared one, loaded RTLD_GLOBAL first) opens
a database and writes; then the store opens the cache directory read-only
and counts its entries through its own, static RocksDB; then the host's
database still reads back what it wrote. Prints one line a step.

    host_libs.py HOST_LIBROCKSDB LIBKCACHE_STORE CACHE_DIR HOST_DB_DIR
"""
import ctypes
import sys

c_p = ctypes.c_void_p


def main():
    host_lib, store_lib, cache_dir, host_db = sys.argv[1:5]
    r = ctypes.CDLL(host_lib, mode=ctypes.RTLD_GLOBAL)
    for f in ('rocksdb_options_create', 'rocksdb_writeoptions_create', 'rocksdb_readoptions_create'):
        getattr(r, f).restype = c_p
    r.rocksdb_open.restype = c_p
    r.rocksdb_open.argtypes = [c_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)]
    r.rocksdb_put.argtypes = [c_p, c_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p,
                              ctypes.c_size_t, ctypes.POINTER(ctypes.c_char_p)]
    r.rocksdb_get.restype = c_p
    r.rocksdb_get.argtypes = [c_p, c_p, ctypes.c_char_p, ctypes.c_size_t,
                              ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_char_p)]
    r.rocksdb_options_set_create_if_missing.argtypes = [c_p, ctypes.c_ubyte]
    err = ctypes.c_char_p()
    opt = r.rocksdb_options_create()
    r.rocksdb_options_set_create_if_missing(opt, 1)
    db = r.rocksdb_open(opt, host_db.encode(), ctypes.byref(err))
    assert db and not err.value, err.value
    r.rocksdb_put(db, r.rocksdb_writeoptions_create(), b'host-key', 8, b'host-value', 10, ctypes.byref(err))
    assert not err.value, err.value

    def host_get():
        n = ctypes.c_size_t()
        v = r.rocksdb_get(db, r.rocksdb_readoptions_create(), b'host-key', 8, ctypes.byref(n),
                          ctypes.byref(err))
        return ctypes.string_at(v, n.value) if v else None
    print('host rocksdb before:', host_get().decode(), flush=True)

    class Options(ctypes.Structure):
        _fields_ = [('dir', ctypes.c_char_p), ('readonly', ctypes.c_int),
                    ('max_size', ctypes.c_uint64), ('tool', ctypes.c_char_p)]

    class Api(ctypes.Structure):
        _fields_ = [('abi', ctypes.c_int), ('open', c_p), ('ops', c_p), ('db_tier_open', c_p)]

    class Admin(ctypes.Structure):
        _fields_ = [('abi', ctypes.c_int), ('foreach', c_p), ('stats', c_p), ('stats_free', c_p)]

    class Stats(ctypes.Structure):
        _fields_ = [('n_ns', ctypes.c_size_t), ('ns', c_p), ('n_backends', ctypes.c_size_t),
                    ('backends', c_p), ('entries', ctypes.c_uint64)]

    s = ctypes.CDLL(store_lib, mode=ctypes.RTLD_LOCAL)
    s.kc_store_api.restype = ctypes.POINTER(Api)
    s.kc_store_admin.restype = ctypes.POINTER(Admin)
    api, admin = s.kc_store_api().contents, s.kc_store_admin().contents
    st = c_p()
    rc = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Options), ctypes.POINTER(c_p))(api.open)(
        ctypes.byref(Options(cache_dir.encode(), 1, 0, None)), ctypes.byref(st))
    assert rc == 0, 'kc_store_api()->open: %d' % rc
    out = ctypes.POINTER(Stats)()
    rc = ctypes.CFUNCTYPE(ctypes.c_int, c_p, ctypes.POINTER(ctypes.POINTER(Stats)))(admin.stats)(
        st, ctypes.byref(out))
    assert rc == 0, 'kc_store_admin()->stats: %d' % rc
    print('store entries:', out.contents.entries, flush=True)
    print('host rocksdb after:', host_get().decode(), flush=True)


if __name__ == '__main__':
    main()
