"""kctest: helpers the Python tests share (imported as `from kctest import ...`
after adding tests/pylib to sys.path)."""
import os
import shutil
import time


def rm_settled(path):
    """Removes path, again while an owner a run started still writes in it
    (it stops once its directory is gone): nothing is left behind."""
    for _ in range(100):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return
        time.sleep(0.1)
