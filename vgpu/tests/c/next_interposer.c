/* A second interposer, preloaded after libtessera_vgpu.so: it wraps getpid
 * and finds the real one with dlsym(RTLD_NEXT, "getpid"), as interposers do.
 * RTLD_NEXT means "after the caller": if the library's exported dlsym lost
 * the caller (answering as if it had called), the lookup would find this
 * very wrapper and recurse until the stack overflows. Built as a shared
 * library by the vgpu integration tests; pid_main.c calls getpid. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <unistd.h>

pid_t getpid(void) {
    static pid_t (*next)(void);
    if (!next)
        next = (pid_t(*)(void))dlsym(RTLD_NEXT, "getpid");
    return next ? next() : -1;
}
