/*
 * attack_noshim BYTES [SECONDS [KERNEL_US [register]]]: reaches the CUDA
 * driver around the shim.
 *
 * dlopen("libcuda.so.1") (the shim is another soname, so this is the
 * driver even with the shim preloaded), then finds cuInit, cuDeviceGet,
 * cuCtxCreate_v2 and cuMemAlloc_v2 by walking the library's own dynamic
 * symbol table (dlinfo(RTLD_DI_LINKMAP): DT_SYMTAB, DT_STRTAB, and
 * DT_GNU_HASH or DT_HASH for the symbol count), never through dlsym or
 * cuGetProcAddress, which the shim hooks. Creates a context on device 0,
 * allocates BYTES, prints
 *   ATTACK noshim holding <bytes> bytes on device 0 via <library file>; pid <pid>
 * and holds them until killed (or SECONDS; a negative SECONDS: until
 * killed). With KERNEL_US > 0 it also keeps the GPU busy meanwhile, around
 * the shim's GPU-time limiter: "sleep_kernel"s of KERNEL_US from the module
 * "fake-image" (the fake driver's; on a real GPU there is no such module and
 * it exits 2), 8 launched back to back then a cuCtxSynchronize, again and
 * again. With "register", it first calls cuInit as the program's own
 * dlsym(RTLD_DEFAULT) finds it (the shim's hook when the shim is
 * preloaded), so that the shim registers the process in its container's
 * segments as any tenant process: a registered process whose memory and
 * kernels still bypass the shim's limits (the watch's compute and memory
 * checks, not its "unregistered" one, must catch it). With "unlock", it
 * registers the same way, then moves its mappings of the cuslice segments
 * (files whose names end in ".seg") onto fresh opens of the same files and
 * closes the shim's descriptors: the kernel drops the OFD locks that prove
 * its slots alive, so the segments hold its PID in dead slots while it
 * goes on mapping them (a registration the watch must not count). Exits 2
 * on failure.
 *
 * Not linked against the driver. Builds with any C11 compiler and glibc:
 *   cc -O1 -o attack_noshim tests/apps/attack_noshim.c -ldl
 * Issue #12: what the host watchdog must catch (a GPU process of a sliced
 * container that never registered with the shim).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;

static void die(const char *what)
{
    fprintf(stderr, "attack_noshim: %s\n", what);
    exit(2);
}

struct dyn_syms {
    uintptr_t base;
    const ElfW(Sym) *sym;
    const char *str;
    size_t nsym;
};

/* glibc relocates the d_ptr entries of a writable .dynamic in place (x86_64);
 * others leave them as offsets from the load base. */
static uintptr_t dyn_addr(uintptr_t base, ElfW(Addr) v) { return v < base ? base + v : v; }

/* Symbol count from a GNU hash table: one past the highest index of the
 * last chain. */
static size_t gnu_hash_count(const uint32_t *h)
{
    uint32_t nbuckets = h[0], symoffset = h[1], bloom = h[2];
    const uint32_t *buckets = h + 4 + bloom * (sizeof(ElfW(Addr)) / 4);
    const uint32_t *chain = buckets + nbuckets;
    uint32_t last = 0;
    for (uint32_t b = 0; b < nbuckets; b++)
        if (buckets[b] > last)
            last = buckets[b];
    if (last < symoffset)
        return symoffset;
    while ((chain[last - symoffset] & 1) == 0)
        last++;
    return (size_t)last + 1;
}

static struct dyn_syms find_table(void *handle)
{
    struct link_map *lm = NULL;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &lm) != 0 || lm == NULL)
        die("dlinfo(RTLD_DI_LINKMAP) failed");
    struct dyn_syms t = {lm->l_addr, NULL, NULL, 0};
    const uint32_t *gnu = NULL, *sysv = NULL;
    for (const ElfW(Dyn) *d = lm->l_ld; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB: t.sym = (const ElfW(Sym) *)dyn_addr(t.base, d->d_un.d_ptr); break;
        case DT_STRTAB: t.str = (const char *)dyn_addr(t.base, d->d_un.d_ptr); break;
        case DT_GNU_HASH: gnu = (const uint32_t *)dyn_addr(t.base, d->d_un.d_ptr); break;
        case DT_HASH: sysv = (const uint32_t *)dyn_addr(t.base, d->d_un.d_ptr); break;
        default: break;
        }
    }
    if (t.sym == NULL || t.str == NULL || (gnu == NULL && sysv == NULL))
        die("libcuda.so.1 has no dynamic symbol table or hash table");
    t.nsym = sysv != NULL ? sysv[1] /* nchain */ : gnu_hash_count(gnu);
    return t;
}

/* The defined function `name` of the table, by a linear scan. */
static void *lookup(const struct dyn_syms *t, const char *name)
{
    for (size_t i = 0; i < t->nsym; i++) {
        const ElfW(Sym) *s = &t->sym[i];
        if (s->st_shndx == SHN_UNDEF || ELF64_ST_TYPE(s->st_info) != STT_FUNC)
            continue;
        if (strcmp(t->str + s->st_name, name) == 0)
            return (void *)(t->base + s->st_value);
    }
    fprintf(stderr, "attack_noshim: %s not found in libcuda.so.1's symbol table\n", name);
    exit(2);
}

/* Moves every mapping of a cuslice segment (a file whose name ends in
 * ".seg") onto a fresh open of its file, in place (MAP_FIXED: the shim's
 * pointers stay valid), then closes the segment descriptors. An OFD lock
 * lives as long as its open file description, which the old descriptors
 * and mappings held: both gone, the kernel drops the slots' locks. Returns
 * how many mappings moved. */
static int unlock_segments(void)
{
    FILE *m = fopen("/proc/self/maps", "r");
    if (m == NULL)
        die("cannot read /proc/self/maps");
    char line[4608];
    int moved = 0;
    while (fgets(line, sizeof line, m) != NULL) {
        unsigned long lo, hi, off;
        char perms[8], path[4096] = "";
        if (sscanf(line, "%lx-%lx %7s %lx %*s %*s %4095s", &lo, &hi, perms, &off, path) < 4)
            continue;
        size_t len = strlen(path);
        if (len < 4 || strcmp(path + len - 4, ".seg") != 0)
            continue;
        int fd = open(path, perms[1] == 'w' ? O_RDWR : O_RDONLY);
        if (fd < 0)
            die("unlock: cannot open a segment");
        int prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0);
        if (mmap((void *)lo, hi - lo, prot, MAP_SHARED | MAP_FIXED, fd, (off_t)off) == MAP_FAILED)
            die("unlock: cannot remap a segment");
        close(fd);
        moved++;
    }
    fclose(m);
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        die("cannot list /proc/self/fd");
    int fds[256], n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < 256) {
        char link[64], target[4096];
        int fd = atoi(e->d_name);
        if (e->d_name[0] == '.' || fd == dirfd(d))
            continue;
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t len = readlink(link, target, sizeof target - 1);
        if (len < 4)
            continue;
        target[len] = 0;
        if (strcmp(target + len - 4, ".seg") == 0)
            fds[n++] = fd;
    }
    closedir(d);
    for (int i = 0; i < n; i++)
        close(fds[i]);
    return moved;
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 5 || (argc == 5 && strcmp(argv[4], "register") != 0 && strcmp(argv[4], "unlock") != 0)) {
        fprintf(stderr, "usage: %s BYTES [SECONDS [KERNEL_US [register|unlock]]]\n", argv[0]);
        return 2;
    }
    unsigned long long bytes = strtoull(argv[1], NULL, 10);
    double secs = argc >= 3 ? atof(argv[2]) : -1;
    unsigned long long kernel_ns = argc >= 4 ? strtoull(argv[3], NULL, 10) * 1000ULL : 0;
    if (argc == 5) {
        /* The ordinary way: with the shim preloaded, its cuInit, which
         * registers this process with its slice. */
        CUresult (*shim_init)(unsigned) = (CUresult(*)(unsigned))dlsym(RTLD_DEFAULT, "cuInit");
        CUresult r = shim_init != NULL ? shim_init(0) : -1;
        if (r != 0) {
            fprintf(stderr, "attack_noshim: cuInit through dlsym(RTLD_DEFAULT) failed: %d\n", r);
            return 2;
        }
        if (strcmp(argv[4], "unlock") == 0 && unlock_segments() == 0)
            die("unlock: no segment descriptor to close (is the shim preloaded, with a quota?)");
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (h == NULL)
        die(dlerror());
    struct dyn_syms t = find_table(h);
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))lookup(&t, "cuInit");
    CUresult (*dev_get)(CUdevice *, int) = (CUresult(*)(CUdevice *, int))lookup(&t, "cuDeviceGet");
    CUresult (*ctx_create)(CUcontext *, unsigned, CUdevice) =
        (CUresult(*)(CUcontext *, unsigned, CUdevice))lookup(&t, "cuCtxCreate_v2");
    CUresult (*mem_alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))lookup(&t, "cuMemAlloc_v2");
    /* Which file the functions came from (the driver, not the shim). */
    Dl_info info;
    const char *file = dladdr((void *)mem_alloc, &info) && info.dli_fname ? info.dli_fname : "?";

    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    CUresult r;
    if ((r = init(0)) != 0 || (r = dev_get(&dev, 0)) != 0 || (r = ctx_create(&ctx, 0, dev)) != 0) {
        fprintf(stderr, "attack_noshim: driver initialisation failed: CUresult %d\n", r);
        return 2;
    }
    if (bytes > 0 && (r = mem_alloc(&p, (size_t)bytes)) != 0) {
        fprintf(stderr, "attack_noshim: cuMemAlloc_v2(%llu) failed: CUresult %d\n", bytes, r);
        return 2;
    }
    CUfunction fn = NULL;
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       void *, void **, void **) = NULL;
    CUresult (*sync)(void) = NULL;
    if (kernel_ns > 0) {
        CUresult (*load)(CUmodule *, const void *) = (CUresult(*)(CUmodule *, const void *))lookup(&t, "cuModuleLoadData");
        CUresult (*get_fn)(CUfunction *, CUmodule, const char *) =
            (CUresult(*)(CUfunction *, CUmodule, const char *))lookup(&t, "cuModuleGetFunction");
        launch = (CUresult(*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                              void **, void **))lookup(&t, "cuLaunchKernel");
        sync = (CUresult(*)(void))lookup(&t, "cuCtxSynchronize");
        CUmodule mod;
        if ((r = load(&mod, "fake-image")) != 0 || (r = get_fn(&fn, mod, "sleep_kernel")) != 0) {
            fprintf(stderr, "attack_noshim: no sleep_kernel (the fake driver's): CUresult %d\n", r);
            return 2;
        }
    }
    printf("ATTACK noshim holding %llu bytes on device 0 via %s%s%s; pid %ld\n", bytes, file,
           kernel_ns > 0 ? ", keeping it busy" : "",
           argc == 5 ? (strcmp(argv[4], "unlock") == 0 ? ", registered, unlocked" : ", registered") : "", (long)getpid());
    fflush(stdout);
    if (kernel_ns > 0) {
        struct timespec t0, now;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        void *params[] = {&kernel_ns};
        for (;;) {
            for (int i = 0; i < 8; i++)
                if ((r = launch(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL)) != 0) {
                    fprintf(stderr, "attack_noshim: cuLaunchKernel: CUresult %d\n", r);
                    return 2;
                }
            if ((r = sync()) != 0) {
                fprintf(stderr, "attack_noshim: cuCtxSynchronize: CUresult %d\n", r);
                return 2;
            }
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (secs >= 0 && (double)(now.tv_sec - t0.tv_sec) + (now.tv_nsec - t0.tv_nsec) / 1e9 >= secs)
                return 0;
        }
    }
    if (secs < 0) {
        for (;;)
            pause();
    }
    struct timespec ts = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
    return 0;
}
