/* Reaches the driver through the CUDA 11.3-11.8 entry point, cuGetProcAddress
 * (not _v2), the way a CUDA 11 runtime does: dlopen("libcuda.so.1"), dlsym of
 * cuGetProcAddress, then cuGetProcAddress("cuGetProcAddress") itself and every
 * other function through what that returned. Allocates COUNT blocks of MIB
 * MiB with cuMemAlloc, as asked for a CUDA 11.8 ABI (cuMemAlloc_v2), and
 * frees them. Built by the vgpu integration tests.
 * Usage: proc_address_v1 MIB COUNT. Output: key=value lines. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*get_proc_fn)(const char *, void **, int, unsigned long long);

static get_proc_fn get_proc;

static void *need(const char *name) {
    void *p = 0;
    int rc = get_proc(name, &p, 11080, 0);
    if (rc != 0 || !p) {
        printf("error=cuGetProcAddress(%s) returned %d\n", name, rc);
        exit(1);
    }
    return p;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 256;
    int count = argc > 2 ? atoi(argv[2]) : 1;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        printf("error=%s\n", dlerror());
        return 1;
    }
    get_proc = (get_proc_fn)dlsym(lib, "cuGetProcAddress");
    if (!get_proc) {
        printf("error=no cuGetProcAddress\n");
        return 1;
    }
    /* The runtime asks for cuGetProcAddress through itself, too. */
    get_proc = (get_proc_fn)need("cuGetProcAddress");
    int (*init)(unsigned) = need("cuInit");
    int (*device_get)(int *, int) = need("cuDeviceGet");
    int (*retain)(void **, int) = need("cuDevicePrimaryCtxRetain");
    int (*set_current)(void *) = need("cuCtxSetCurrent");
    int (*mem_alloc)(unsigned long long *, size_t) = need("cuMemAlloc");
    int (*mem_free)(unsigned long long) = need("cuMemFree");
    int (*mem_get_info)(size_t *, size_t *) = need("cuMemGetInfo");
    int dev = 0;
    void *ctx = 0;
    if (init(0) || device_get(&dev, 0) || retain(&ctx, dev) || set_current(ctx)) {
        printf("error=driver set-up failed\n");
        return 1;
    }
    unsigned long long held[256];
    int blocks = 0, result = 0;
    while (blocks < count && blocks < 256) {
        result = mem_alloc(&held[blocks], mib << 20);
        if (result != 0)
            break;
        blocks++;
    }
    size_t free_bytes = 0, total_bytes = 0;
    mem_get_info(&free_bytes, &total_bytes);
    printf("result=%d\nblocks=%d\nmem_free_bytes=%zu\nmem_total_bytes=%zu\n", result, blocks,
           free_bytes, total_bytes);
    for (int i = 0; i < blocks; i++)
        mem_free(held[i]);
    return 0;
}
