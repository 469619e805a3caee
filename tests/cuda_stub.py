"""A stub libcuda.so.1 so that kvikio's host-memory path really runs on a machine with no GPU.

kvikio loads the CUDA driver even to read into host buffers; without one every read fails with
"libcuda.so.1: cannot open shared object file". This stub answers every driver call with
CUDA_ERROR_NOT_INITIALIZED (3), except cuDriverGetVersion (12.0) and the two error-string
calls, so kvikio treats every buffer as host memory and reads with POSIX I/O (its
compatibility mode). Built with gcc into a temporary directory; put it on LD_LIBRARY_PATH of
the process that imports kvikio. Tests that use it say so.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

# Driver entry points kvikio (and the CUDA libraries it loads) look up by name.
NOT_INITIALIZED = """
cuInit cuCtxGetCurrent cuCtxSetCurrent cuCtxPushCurrent cuCtxPushCurrent_v2 cuCtxPopCurrent
cuCtxPopCurrent_v2 cuCtxGetDevice cuCtxCreate cuCtxCreate_v2 cuCtxCreate_v3 cuCtxCreate_v4
cuCtxDestroy cuCtxDestroy_v2 cuCtxSynchronize cuDeviceGet cuDeviceGetCount cuDeviceGetAttribute
cuDeviceGetName cuDeviceGetUuid cuDeviceGetUuid_v2 cuDeviceGetPCIBusId cuDeviceTotalMem
cuDeviceTotalMem_v2 cuDevicePrimaryCtxRetain cuDevicePrimaryCtxRelease
cuDevicePrimaryCtxRelease_v2 cuDevicePrimaryCtxGetState cuDevicePrimaryCtxReset
cuDevicePrimaryCtxReset_v2 cuMemHostAlloc cuMemFreeHost cuMemAlloc cuMemAlloc_v2 cuMemFree
cuMemFree_v2 cuMemcpy cuMemcpyAsync cuMemcpyHtoD cuMemcpyHtoD_v2 cuMemcpyDtoH cuMemcpyDtoH_v2
cuMemcpyHtoDAsync cuMemcpyHtoDAsync_v2 cuMemcpyDtoHAsync cuMemcpyDtoHAsync_v2 cuMemcpyDtoD
cuMemcpyDtoD_v2 cuMemHostRegister cuMemHostRegister_v2 cuMemHostUnregister
cuMemGetAddressRange cuMemGetAddressRange_v2 cuPointerGetAttribute cuPointerGetAttributes
cuStreamCreate cuStreamCreateWithPriority cuStreamDestroy cuStreamDestroy_v2 cuStreamSynchronize
cuStreamQuery cuEventCreate cuEventDestroy cuEventDestroy_v2 cuEventRecord cuEventQuery
cuEventSynchronize cuLaunchHostFunc cuGetProcAddress cuGetProcAddress_v2 cuModuleLoad
cuModuleGetFunction cuLaunchKernel cuFuncGetAttribute cuMemGetInfo cuMemGetInfo_v2
""".split()

SOURCE_HEAD = r"""
#include <stddef.h>
#define NOT_INITIALIZED 3
int cuDriverGetVersion(int *v) { if (v) *v = 12000; return 0; }
int cuGetErrorName(int err, const char **s) { if (s) *s = "CUDA_ERROR_NOT_INITIALIZED"; return 0; }
int cuGetErrorString(int err, const char **s)
{ if (s) *s = "initialization error (kvfs test stub)"; return 0; }
"""


def build(directory: Path) -> Path:
    """Compile the stub into `directory`/libcuda.so.1; returns the directory (for
    LD_LIBRARY_PATH)."""
    directory.mkdir(parents=True, exist_ok=True)
    src = directory / "cuda_stub.c"
    body = "".join(f"int {name}(void) {{ return NOT_INITIALIZED; }}\n" for name in NOT_INITIALIZED)
    src.write_text(SOURCE_HEAD + body)
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-O1",
            "-Wl,-soname,libcuda.so.1",
            "-o",
            str(directory / "libcuda.so.1"),
            str(src),
        ],
        check=True,
    )
    return directory
