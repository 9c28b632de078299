/*
 * libkcache-remote-deps.so (-Dbundle=true, scripts/package): hiredis and
 * libsodium linked in whole from their static archives, so a packaged
 * tree's remote needs nothing from the system. The shim, libkcache-store.so
 * and the tool dlopen() it by its path beside them (load.c) and resolve
 * the same names they would from the system's libhiredis.so.0.14 and
 * libsodium.so.23. This file only gives the library a source of its own.
 */
const char kc__remote_deps_built[] = "kcache remote deps: hiredis 0.14, libsodium";
