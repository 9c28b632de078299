#!/usr/bin/env python3
"""A host with an OpenSSL of its own, Python's `ssl`, run under kcache-run
with KCACHE_REMOTE=rediss://: a TLS connection of Python's to the same
Redis (AUTH with the password file's password, PING), then the NVRTC
client (nvrtc_ctypes.py: kcache's rediss:// connection is made in this
process, by the shim, on the local store's miss), then Python's TLS
connection again. Prints the client's lines (as nvrtc_ctypes.py does) and
writes REPORT: each connection's replies, whether kcache's TLS object and
Python's libssl were both mapped in this process, and Python's OpenSSL.

    ssl_compose.py REPORT LIBNVRTC ARCH KERNEL-NAME...
"""
import os
import socket
import ssl
import sys
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nvrtc_ctypes  # noqa: E402


def ping():
    """AUTH and PING over a TLS connection of Python's ssl module."""
    url = urllib.parse.urlsplit(os.environ['KCACHE_REMOTE'])
    with open(os.environ['KCACHE_REMOTE_PASSWORD_FILE']) as f:
        pw = f.read().strip()
    ctx = ssl.create_default_context(cafile=os.environ['KCACHE_REMOTE_CA_FILE'])
    try:
        with socket.create_connection((url.hostname, url.port), timeout=10) as s, \
                ctx.wrap_socket(s, server_hostname=url.hostname) as t:
            parts = [b'AUTH', url.username.encode(), pw.encode()]
            t.sendall(b'*3\r\n' + b''.join(b'$%d\r\n%s\r\n' % (len(p), p) for p in parts) +
                      b'*1\r\n$4\r\nPING\r\n')
            with t.makefile('rb') as r:
                return ' '.join(r.readline().decode().strip() for _ in range(2))
    except (OSError, ssl.SSLError) as e:
        return 'error: %s' % e


def main():
    report = sys.argv[1]
    before = ping()
    sys.argv = [sys.argv[0]] + sys.argv[2:]
    nvrtc_ctypes.main()
    with open('/proc/self/maps') as f:
        maps = f.read()
    after = ping()
    with open(report, 'w') as f:
        f.write('before: %s\n' % before)
        f.write('after: %s\n' % after)
        f.write('kcache tls object mapped: %s\n' % ('libkcache-remote-tls.so' in maps))
        f.write('python libssl mapped: %s\n' % ('/libssl.so' in maps))
        f.write('python openssl: %s\n' % ssl.OPENSSL_VERSION)


if __name__ == '__main__':
    main()
