/* libnext.so: an interposer preloaded after cuslice that chains with
 * dlsym(RTLD_NEXT). glibc resolves RTLD_NEXT relative to its caller; if
 * cuslice's dlsym hook changed the caller, this would find itself and
 * recurse until the stack overflows. */
#define _GNU_SOURCE
#include <dlfcn.h>

int cuslice_test_fn(void) {
    int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "cuslice_test_fn");
    return next ? next() + 1 : -1;
}
