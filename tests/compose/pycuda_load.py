"""PyCUDA loads PTX through its extension module _driver.so (linked against
libcuda.so.1, loaded RTLD_LOCAL by Python): module_from_buffer is
cuModuleLoadDataEx. Run by test_compose.py pycuda."""
import sys
import pycuda.driver as cuda
cuda.init()
print("devices", cuda.Device.count())
dev = cuda.Device(0)
print("name", dev.name(), "cc", dev.compute_capability())
ctx = dev.make_context()

ptx = open(sys.argv[1], "rb").read()
mod = cuda.module_from_buffer(ptx)
f = mod.get_function("add1")
print("function", f.num_regs if hasattr(f, "num_regs") else "")
buf = cuda.mem_alloc(4096)
buf.free()
mod2 = cuda.module_from_buffer(open(sys.argv[2], "rb").read(), options=[(cuda.jit_option.MAX_REGISTERS, 32)])
print("other", mod2.get_function("other") is not None)
ctx.pop(); ctx.detach()
print("done")
