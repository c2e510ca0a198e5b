/* Reads every device's memory through NVML, the way pynvml does: dlopen
 * ("libnvidia-ml.so.1") and dlsym; built with -DLINKED, the way a program
 * linked with -lnvidia-ml does (direct calls through the PLT). Built by the
 * vgpu integration tests.
 * Output: key=value lines (device.<i>.uuid, .total, .free, .used, and the
 * same from nvmlDeviceGetMemoryInfo_v2 as .v2_total, .v2_free, .v2_used). */
#include <dlfcn.h>
#include <stdio.h>

typedef struct { unsigned long long total, free, used; } nvml_memory;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvml_memory_v2;

#ifdef LINKED
int nvmlInit_v2(void);
int nvmlDeviceGetCount_v2(unsigned *);
int nvmlDeviceGetHandleByIndex_v2(unsigned, void **);
int nvmlDeviceGetUUID(void *, char *, unsigned);
int nvmlDeviceGetMemoryInfo(void *, nvml_memory *);
int nvmlDeviceGetMemoryInfo_v2(void *, nvml_memory_v2 *);
#define LOAD(var, name) var = name;
#else
#define LOAD(var, name)                                         \
    var = dlsym(lib, #name);                                    \
    if (!var) {                                                 \
        printf("error=%s missing\n", #name);                    \
        return 1;                                               \
    }
#endif

int main(void) {
#ifndef LINKED
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) {
        printf("error=%s\n", dlerror());
        return 1;
    }
#endif
    int (*init)(void);
    int (*count)(unsigned *);
    int (*by_index)(unsigned, void **);
    int (*get_uuid)(void *, char *, unsigned);
    int (*memory)(void *, nvml_memory *);
    int (*memory_v2)(void *, nvml_memory_v2 *);
    LOAD(init, nvmlInit_v2);
    LOAD(count, nvmlDeviceGetCount_v2);
    LOAD(by_index, nvmlDeviceGetHandleByIndex_v2);
    LOAD(get_uuid, nvmlDeviceGetUUID);
    LOAD(memory, nvmlDeviceGetMemoryInfo);
    LOAD(memory_v2, nvmlDeviceGetMemoryInfo_v2);
    int rc = init();
    if (rc != 0) {
        printf("error=nvmlInit_v2 returned %d\n", rc);
        return 1;
    }
    unsigned n = 0;
    count(&n);
    printf("count=%u\n", n);
    for (unsigned i = 0; i < n; i++) {
        void *device = 0;
        char uuid[96] = {0};
        nvml_memory m = {0};
        nvml_memory_v2 m2 = {0};
        m2.version = (unsigned)(sizeof(nvml_memory_v2) | (2u << 24));
        if (by_index(i, &device) != 0 || get_uuid(device, uuid, sizeof uuid) != 0) {
            printf("error=device %u unreadable\n", i);
            return 1;
        }
        printf("device.%u.uuid=%s\n", i, uuid);
        printf("device.%u.rc=%d\n", i, memory(device, &m));
        printf("device.%u.total=%llu\ndevice.%u.free=%llu\ndevice.%u.used=%llu\n", i, m.total, i,
               m.free, i, m.used);
        printf("device.%u.v2_rc=%d\n", i, memory_v2(device, &m2));
        printf("device.%u.v2_total=%llu\ndevice.%u.v2_free=%llu\ndevice.%u.v2_used=%llu\n", i,
               m2.total, i, m2.free, i, m2.used);
    }
    return 0;
}
