"""kctest: helpers the Python tests share (imported as `from kctest import ...`
after adding tests/pylib to sys.path)."""
import os
import shutil
import struct
import time


def rm_settled(path):
    """Removes path, again while an owner a run started still writes in it
    (it stops once its directory is gone): nothing is left behind."""
    for _ in range(100):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return
        time.sleep(0.1)


def elf_section(blob, name):
    """The bytes of ELF64 section `name` (little-endian) of blob, or None."""
    if blob is None or blob[:4] != b"\x7fELF":
        return None
    shoff, = struct.unpack_from("<Q", blob, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", blob, 0x3a)

    def sh(i):
        return struct.unpack_from("<IIQQQQIIQQ", blob, shoff + i * shentsize)
    stro = sh(shstrndx)[4]
    for i in range(shnum):
        s = sh(i)
        if blob[stro + s[0]:blob.index(b"\0", stro + s[0])] == name.encode():
            return blob[s[4]:s[4] + s[5]]
    return None
