/* Loads the plugin named by argv[1] with RTLD_DEEPBIND and has it allocate
 * 2 GiB twice (by name, then through its own dlsym); prints direct=<rc>
 * and dlsym=<rc> (0 success, 2 out of memory). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stddef.h>

int main(int argc, char **argv) {
    void *plugin;
    int (*direct)(size_t), (*viadlsym)(size_t);
    if (argc != 2)
        return 2;
    plugin = dlopen(argv[1], RTLD_NOW | RTLD_DEEPBIND);
    if (!plugin) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    direct = (int (*)(size_t))dlsym(plugin, "plugin_direct");
    viadlsym = (int (*)(size_t))dlsym(plugin, "plugin_dlsym");
    if (!direct || !viadlsym)
        return 1;
    printf("direct=%d\n", direct((size_t)2 << 30));
    printf("dlsym=%d\n", viadlsym((size_t)2 << 30));
    return 0;
}
