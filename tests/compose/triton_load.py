"""Triton 3.9 launcher (cuda_utils.so, compiled at run time against
libcuda.so.1 and loaded RTLD_LOCAL) loads a cubin and PTX with load_binary.
Run by test_compose.py triton."""
import sys
from triton.backends.nvidia.driver import CudaDriver, CudaUtils
print("active", CudaDriver.is_active())
u = CudaUtils()
for path, name in ((sys.argv[1], "add1"), (sys.argv[2], "scale")):
    mod, fun, regs, spills, maxt = u.load_binary(name, open(path, "rb").read(), 0, 0)
    print(path.rsplit("/", 1)[-1], regs, spills, maxt)
    u.unload_module(mod)
print("done")
