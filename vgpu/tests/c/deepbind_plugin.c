/* A framework plugin linked against libcuda.so.1, loaded by deepbind_main
 * with RTLD_DEEPBIND (as some plugins are): with DEEPBIND its references
 * bind to its own dependencies first — libcuda's cuMemAlloc_v2 and libc's
 * dlsym — past any preloaded interposer. Built as a shared library by the
 * vgpu integration tests. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;

CUresult cuInit(unsigned int flags);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, int dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes);

static int ready(void) {
    CUcontext ctx;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx))
        return -1;
    return 0;
}

/* cuMemAlloc_v2 called by name. */
int plugin_direct(size_t bytes) {
    CUdeviceptr p;
    if (ready())
        return -1;
    return cuMemAlloc_v2(&p, bytes);
}

/* cuMemAlloc_v2 looked up with dlsym on the driver's handle. */
int plugin_dlsym(size_t bytes) {
    CUdeviceptr p;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    if (!lib || ready())
        return -1;
    alloc = (CUresult(*)(CUdeviceptr *, size_t))dlsym(lib, "cuMemAlloc_v2");
    return alloc ? alloc(&p, bytes) : -1;
}
