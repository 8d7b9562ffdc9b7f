/*
 * cuslice fake driver: libnvidia-ml.so.1. Reports the simulated devices of
 * the fake libcuda.so.1: same count, names and UUIDs, and memory usage read
 * from the shared state that libcuda writes. Written for cuslice's tests;
 * see README.md beside this file.
 *
 * Where the state comes from:
 * - FAKE_CUDA_STATE set: this library maps the same file as libcuda, so it
 *   sees every process's allocations (and gives back dead processes' ones).
 * - unset: libcuda keeps a process-private state in a memfd named
 *   FAKE_PRIVATE_MEMFD_NAME; this library finds it among the process's open
 *   files. Until libcuda has created it, memory reads as unused.
 */
#define _GNU_SOURCE
#include "fake_common.h"
#include "fake_extra.h"

#include <dirent.h>
#include <pthread.h>
#include <stdbool.h>

#define WHO "fake libnvidia-ml"

struct nvmlDevice_st {
    unsigned index;
};

static struct fake_config g_cfg;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned g_init_count; /* nvmlInit* minus nvmlShutdown */
static struct fake_state *S; /* the shared state, once found */
static int g_state_fd = -1;   /* our own open file description, for liveness probes */
static struct nvmlDevice_st g_devs[FAKE_MAX_DEVICES];
static const int g_slot = -1; /* NVML owns no slot (for fake_timeline.h) */

/* The timeline's simulation: per-process utilization advances it to now. */
#include "fake_timeline.h"

static void fork_prepare(void) { pthread_mutex_lock(&g_mu); }
static void fork_release(void) { pthread_mutex_unlock(&g_mu); }

static void process_setup(void)
{
    fake_config_load(&g_cfg, WHO);
    for (unsigned i = 0; i < FAKE_MAX_DEVICES; i++)
        g_devs[i].index = i;
    pthread_atfork(fork_prepare, fork_release, fork_release);
}

static inline void setup(void) { pthread_once(&g_once, process_setup); }

/* Caller holds g_mu. */
static struct fake_state *state_locked(void)
{
    if (S != NULL)
        return S;
    if (g_cfg.state_path != NULL) {
        S = fake_state_attach(g_cfg.state_path, &g_state_fd);
        if (S == NULL) {
            fprintf(stderr, "%s: FAKE_CUDA_STATE=\"%s\": %s\n", WHO, g_cfg.state_path, strerror(errno));
            abort();
        }
        return S;
    }
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return NULL;
    struct dirent *e;
    char want[] = "/memfd:" FAKE_PRIVATE_MEMFD_NAME;
    while ((e = readdir(d)) != NULL) {
        char path[64], target[256];
        snprintf(path, sizeof path, "/proc/self/fd/%.20s", e->d_name);
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n <= 0)
            continue;
        target[n] = '\0';
        if (strncmp(target, want, sizeof want - 1) != 0)
            continue;
        int fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0)
            continue;
        void *p = mmap(NULL, sizeof(struct fake_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED && atomic_load(&((struct fake_state *)p)->magic) == FAKE_STATE_MAGIC) {
            S = p;
            g_state_fd = fd;
            break;
        }
        if (p != MAP_FAILED)
            munmap(p, sizeof(struct fake_state));
        close(fd);
    }
    closedir(d);
    return S;
}

/* ---- call log --------------------------------------------------------- */

__attribute__((format(printf, 3, 4))) static void nlog(const char *name, nvmlReturn_t r, const char *fmt, ...)
{
    if (g_cfg.log_fd < 0)
        return;
    char res[16];
    snprintf(res, sizeof res, "%d", (int)r);
    va_list ap;
    va_start(ap, fmt);
    fake_log_result(g_cfg.log_fd, name, res, fmt, ap);
    va_end(ap);
}

__attribute__((format(printf, 3, 4))) static void nlog_s(const char *name, const char *res, const char *fmt, ...)
{
    if (g_cfg.log_fd < 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    fake_log_result(g_cfg.log_fd, name, res, fmt, ap);
    va_end(ap);
}

static void nlog0(const char *name, nvmlReturn_t r)
{
    if (g_cfg.log_fd < 0)
        return;
    char res[16];
    snprintf(res, sizeof res, "%d", (int)r);
    fake_log(g_cfg.log_fd, name, res, NULL);
}

#define LOGR(r, ...) nlog(__func__, (r), __VA_ARGS__)
#define LOGR0(r) nlog0(__func__, (r))

/* ---- helpers ----------------------------------------------------------- */

static bool initialised(void)
{
    pthread_mutex_lock(&g_mu);
    bool ok = g_init_count > 0;
    pthread_mutex_unlock(&g_mu);
    return ok;
}

static nvmlReturn_t device_index(nvmlDevice_t dev, unsigned *idx)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (dev == NULL || dev < &g_devs[0] || dev >= &g_devs[FAKE_MAX_DEVICES] || dev->index >= g_cfg.ndev)
        return NVML_ERROR_INVALID_ARGUMENT;
    *idx = dev->index;
    return NVML_SUCCESS;
}

/* Device memory in use: device-wide, from the shared state. */
static uint64_t used_bytes(unsigned idx)
{
    pthread_mutex_lock(&g_mu);
    struct fake_state *s = state_locked();
    uint64_t used = 0;
    if (s != NULL) {
        if (g_cfg.state_path != NULL)
            fake_state_reclaim_dead(s, g_state_fd, -1);
        used = atomic_load(&s->dev[idx].used_bytes);
    }
    pthread_mutex_unlock(&g_mu);
    return used > g_cfg.mem_total ? g_cfg.mem_total : used;
}

static nvmlReturn_t copy_string(char *dst, unsigned len, const char *src)
{
    if (dst == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* ---- GPU health (FAKE_NVML_HEALTH) -------------------------------------- */

/* FAKE_NVML_HEALTH=FILE: what makes a device sick, one instruction a line,
 * `<index> <what> [<value>]`, appended by a test while processes run:
 *
 *   xid N               an XID event N (nvmlEventSetWait_v2)
 *   dbe                 a double-bit ECC event
 *   lost                from now on every query of the device but its
 *                       identity (handle, index, UUID, name, minor number)
 *                       answers NVML_ERROR_GPU_IS_LOST
 *   query_fail [NAME]   from now on every such query (with NAME: those whose
 *                       name starts with NAME) answers NVML_ERROR_UNKNOWN
 *   ok                  lost and query_fail undone (the GPU was reset)
 *   retired_pending B   nvmlDeviceGetRetiredPagesPendingStatus answers B (0/1)
 *   remap_pending B     nvmlDeviceGetRemappedRows' isPending
 *   remap_failure B     nvmlDeviceGetRemappedRows' failureOccurred
 *   ecc_uncorrected N   nvmlDeviceGetTotalEccErrors(UNCORRECTED) answers N
 *   no_ecc              those three answer NVML_ERROR_NOT_SUPPORTED (a GPU
 *                       without ECC)
 *   no_events           the device supports no event type
 *
 * The state is the whole file folded in order, read again whenever the
 * file changed (its size, inode or mtime); events are delivered to each
 * event set from where the file ended when the set was created. Unset or
 * missing: a healthy device, and events never come. A line the fake does
 * not understand aborts the process (a test bug), naming it. */
#define FAKE_HEALTH_CALLS 8
struct health_dev {
    bool lost, fail_all, retired_pending, remap_pending, remap_failure, no_ecc, no_events;
    unsigned long long ecc_uncorrected;
    unsigned nfail;
    char fail[FAKE_HEALTH_CALLS][64];
};
static struct health_dev g_health[FAKE_MAX_DEVICES];
static struct {
    bool read;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
} g_health_file;

static const char *health_path(void)
{
    const char *p = getenv("FAKE_NVML_HEALTH");
    return (p != NULL && *p) ? p : NULL;
}

/* One line of the file: 1 an event (`*dev`, `*type`, `*data` set), 0 a
 * state change (applied to `h` when not NULL), -1 blank. Aborts on a line
 * it does not understand. */
static int health_line(const char *line, struct health_dev *h, unsigned *dev, unsigned long long *type,
                       unsigned long long *data)
{
    char what[64] = "", arg[64] = "";
    unsigned i;
    int n = sscanf(line, "%u %63s %63s", &i, what, arg);
    if (n <= 0 && strspn(line, " \t\r\n") == strlen(line))
        return -1;
    unsigned long long v = 0;
    bool num = n == 3 && sscanf(arg, "%llu", &v) == 1;
    if (n < 2 || i >= FAKE_MAX_DEVICES)
        goto bad;
    *dev = i;
    if (strcmp(what, "xid") == 0 && num) {
        *type = 0x8; /* nvmlEventTypeXidCriticalError */
        *data = v;
        return 1;
    }
    if (strcmp(what, "dbe") == 0 && n == 2) {
        *type = 0x2; /* nvmlEventTypeDoubleBitEccError */
        *data = 0;
        return 1;
    }
    if (h == NULL)
        return 0;
    h += i;
    if (strcmp(what, "lost") == 0 && n == 2)
        h->lost = true;
    else if (strcmp(what, "query_fail") == 0 && n == 2)
        h->fail_all = true;
    else if (strcmp(what, "query_fail") == 0 && h->nfail < FAKE_HEALTH_CALLS)
        snprintf(h->fail[h->nfail++], sizeof h->fail[0], "%s", arg);
    else if (strcmp(what, "ok") == 0 && n == 2)
        h->lost = h->fail_all = false, h->nfail = 0;
    else if (strcmp(what, "retired_pending") == 0 && num && v <= 1)
        h->retired_pending = v;
    else if (strcmp(what, "remap_pending") == 0 && num && v <= 1)
        h->remap_pending = v;
    else if (strcmp(what, "remap_failure") == 0 && num && v <= 1)
        h->remap_failure = v;
    else if (strcmp(what, "ecc_uncorrected") == 0 && num)
        h->ecc_uncorrected = v;
    else if (strcmp(what, "no_ecc") == 0 && n == 2)
        h->no_ecc = true;
    else if (strcmp(what, "no_events") == 0 && n == 2)
        h->no_events = true;
    else
        goto bad;
    return 0;
bad:
    fprintf(stderr, "%s: FAKE_NVML_HEALTH: cannot read the line \"%.200s\" (see tests/fake/README.md)\n", WHO, line);
    abort();
}

/* Caller holds g_mu. Reads the file again where it changed. */
static void health_refresh_locked(void)
{
    const char *path = health_path();
    struct stat st;
    if (path == NULL || stat(path, &st) != 0) {
        if (g_health_file.read)
            memset(g_health, 0, sizeof g_health);
        g_health_file.read = false;
        return;
    }
    if (g_health_file.read && st.st_dev == g_health_file.dev && st.st_ino == g_health_file.ino &&
        st.st_size == g_health_file.size && st.st_mtim.tv_sec == g_health_file.mtime.tv_sec &&
        st.st_mtim.tv_nsec == g_health_file.mtime.tv_nsec)
        return;
    struct health_dev fresh[FAKE_MAX_DEVICES];
    memset(fresh, 0, sizeof fresh);
    FILE *f = fopen(path, "r");
    char line[256];
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        /* A line still being written (no newline yet) waits for its end. */
        if (strchr(line, '\n') == NULL)
            break;
        unsigned dev;
        unsigned long long type, data;
        health_line(line, fresh, &dev, &type, &data);
    }
    if (f != NULL)
        fclose(f);
    memcpy(g_health, fresh, sizeof fresh);
    g_health_file.read = true;
    g_health_file.dev = st.st_dev;
    g_health_file.ino = st.st_ino;
    g_health_file.size = st.st_size;
    g_health_file.mtime = st.st_mtim;
}

/* What a query `name` of device `idx` answers before it looks: GPU_IS_LOST,
 * UNKNOWN (query_fail) or SUCCESS (go on). */
static nvmlReturn_t health_gate(unsigned idx, const char *name)
{
    pthread_mutex_lock(&g_mu);
    health_refresh_locked();
    const struct health_dev *h = &g_health[idx];
    nvmlReturn_t r = NVML_SUCCESS;
    if (h->lost)
        r = NVML_ERROR_GPU_IS_LOST;
    else if (h->fail_all)
        r = NVML_ERROR_UNKNOWN;
    for (unsigned k = 0; r == NVML_SUCCESS && k < h->nfail; k++)
        if (strncmp(name, h->fail[k], strlen(h->fail[k])) == 0)
            r = NVML_ERROR_UNKNOWN;
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* device_index for a query that a sick device fails (see above). */
static nvmlReturn_t device_query(nvmlDevice_t dev, unsigned *idx, const char *name)
{
    nvmlReturn_t r = device_index(dev, idx);
    return r == NVML_SUCCESS ? health_gate(*idx, name) : r;
}

/* A copy of device `idx`'s health state. */
static struct health_dev health_of(unsigned idx)
{
    pthread_mutex_lock(&g_mu);
    health_refresh_locked();
    struct health_dev h = g_health[idx];
    pthread_mutex_unlock(&g_mu);
    return h;
}

/* ---- init -------------------------------------------------------------- */

static nvmlReturn_t do_init(void)
{
    pthread_mutex_lock(&g_mu);
    g_init_count++;
    pthread_mutex_unlock(&g_mu);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void)
{
    setup();
    nvmlReturn_t r = do_init();
    LOGR0(r);
    return r;
}

nvmlReturn_t nvmlInit(void)
{
    setup();
    nvmlReturn_t r = do_init();
    LOGR0(r);
    return r;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    setup();
    nvmlReturn_t r = do_init();
    LOGR(r, "flags=%u", flags);
    return r;
}

nvmlReturn_t nvmlShutdown(void)
{
    setup();
    nvmlReturn_t r = NVML_SUCCESS;
    pthread_mutex_lock(&g_mu);
    if (g_init_count == 0)
        r = NVML_ERROR_UNINITIALIZED;
    else
        g_init_count--;
    pthread_mutex_unlock(&g_mu);
    LOGR0(r);
    return r;
}

/* ---- devices ----------------------------------------------------------- */

static nvmlReturn_t get_count(unsigned *count)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = g_cfg.ndev;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    setup();
    nvmlReturn_t r = get_count(deviceCount);
    LOGR0(r);
    return r;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    setup();
    nvmlReturn_t r = get_count(deviceCount);
    LOGR0(r);
    return r;
}

static nvmlReturn_t by_index(unsigned index, nvmlDevice_t *device)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || index >= g_cfg.ndev)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_devs[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    setup();
    nvmlReturn_t r = by_index(index, device);
    LOGR(r, "index=%u", index);
    return r;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    setup();
    nvmlReturn_t r = by_index(index, device);
    LOGR(r, "index=%u", index);
    return r;
}

static nvmlReturn_t by_uuid(const char *uuid, nvmlDevice_t *device)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (uuid == NULL || device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < g_cfg.ndev; i++) {
        char s[41];
        fake_uuid_string((int)i, s);
        if (strcmp(s, uuid) == 0) {
            *device = &g_devs[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    setup();
    nvmlReturn_t r = by_uuid(uuid, device);
    char buf[64];
    size_t i = 0;
    for (; uuid && uuid[i] && i + 1 < sizeof buf; i++)
        buf[i] = (uuid[i] > ' ' && uuid[i] < 0x7f) ? uuid[i] : '?';
    buf[i] = '\0';
    LOGR(r, "uuid=%s", uuid ? buf : "(null)");
    return r;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    setup();
    unsigned idx = 0;
    nvmlReturn_t r = device_index(device, &idx);
    if (r == NVML_SUCCESS && index == NULL)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS)
        *index = idx;
    LOGR(r, "device=%u", idx);
    return r;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    setup();
    unsigned idx = 0;
    nvmlReturn_t r = device_index(device, &idx);
    if (r == NVML_SUCCESS)
        r = copy_string(name, length, FAKE_DEVICE_NAME);
    LOGR(r, "device=%u length=%u", idx, length);
    return r;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    setup();
    unsigned idx = 0;
    nvmlReturn_t r = device_index(device, &idx);
    if (r == NVML_SUCCESS) {
        char s[41];
        fake_uuid_string((int)idx, s);
        r = copy_string(uuid, length, s);
    }
    LOGR(r, "device=%u length=%u", idx, length);
    return r;
}

/* 9.0 for every device: what libcuda's cuDeviceGetAttribute answers for
 * COMPUTE_CAPABILITY_MAJOR / _MINOR (the self-test checks they agree). */
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    setup();
    unsigned idx = 0;
    nvmlReturn_t r = device_query(device, &idx, __func__);
    if (r == NVML_SUCCESS && (major == NULL || minor == NULL))
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS) {
        *major = 9;
        *minor = 0;
    }
    LOGR(r, "device=%u", idx);
    return r;
}

/* The minor number of the device node (/dev/nvidia<minor>): the index, as
 * on a host whose GPUs were probed in order. */
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    setup();
    unsigned idx = 0;
    nvmlReturn_t r = device_index(device, &idx);
    if (r == NVML_SUCCESS && minorNumber == NULL)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS)
        *minorNumber = idx;
    LOGR(r, "device=%u", idx);
    return r;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    setup();
    unsigned idx = 0;
    nvmlReturn_t r = device_query(device, &idx, __func__);
    if (r == NVML_SUCCESS && memory == NULL)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS) {
        uint64_t used = used_bytes(idx);
        memory->total = g_cfg.mem_total;
        memory->used = used;
        memory->free = g_cfg.mem_total - used;
    }
    LOGR(r, "device=%u", idx);
    return r;
}

/* ---- the driver's per-cgroup memory limit ------------------------------- */

/* FAKE_NVML_LIMITS_LOG=FILE: the fake has the limit; each set is appended
 * to FILE as "SET <index> <nameSpace> <soft> <hard>" and a get answers the
 * last set for that device and cgroup. Unset: NOT_SUPPORTED (a driver
 * before R615). As the real call: a soft limit above the hard one, or a
 * limit above the device's memory (other than "no limit"), is
 * INVALID_ARGUMENT. */
#define FAKE_NO_MEMORY_LIMIT 0xFFFFFFFFFFFFFFFFull

/* What both calls check first: the device, whether the fake has the limit
 * (its log), and a cgroup named. */
static nvmlReturn_t limits_call(nvmlDevice_t device, const void *limits, const char *ns, unsigned *idx,
                                const char **log)
{
    setup();
    nvmlReturn_t r = device_index(device, idx);
    *log = getenv("FAKE_NVML_LIMITS_LOG");
    if (r == NVML_SUCCESS && (*log == NULL || **log == 0))
        r = NVML_ERROR_NOT_SUPPORTED;
    if (r == NVML_SUCCESS && (limits == NULL || ns == NULL))
        r = NVML_ERROR_INVALID_ARGUMENT;
    return r;
}

nvmlReturn_t nvmlDeviceSetMemoryLimits_v1(nvmlDevice_t device, nvmlSetMemoryLimits_v1_t *limits)
{
    unsigned idx = 0;
    const char *log = NULL;
    nvmlReturn_t r = limits_call(device, limits, limits ? limits->nameSpace : NULL, &idx, &log);
    if (r == NVML_SUCCESS && (limits->softLimit > limits->hardLimit ||
                              (limits->hardLimit != FAKE_NO_MEMORY_LIMIT && limits->hardLimit > g_cfg.mem_total)))
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS) {
        FILE *f = fopen(log, "a");
        if (f == NULL) {
            r = NVML_ERROR_OPERATING_SYSTEM;
        } else {
            fprintf(f, "SET %u %s %llu %llu\n", idx, limits->nameSpace, limits->softLimit, limits->hardLimit);
            fclose(f);
        }
    }
    LOGR(r, "device=%u", idx);
    return r;
}

nvmlReturn_t nvmlDeviceGetMemoryLimits_v1(nvmlDevice_t device, nvmlGetMemoryLimits_v1_t *limits)
{
    unsigned idx = 0;
    const char *log = NULL;
    nvmlReturn_t r = limits_call(device, limits, limits ? limits->nameSpace : NULL, &idx, &log);
    if (r == NVML_SUCCESS) {
        r = NVML_ERROR_NOT_FOUND;
        FILE *f = fopen(log, "r");
        char line[4096], ns[4096];
        unsigned i;
        unsigned long long soft, hard;
        while (f != NULL && fgets(line, sizeof line, f) != NULL) {
            if (sscanf(line, "SET %u %4095s %llu %llu", &i, ns, &soft, &hard) == 4 && i == idx &&
                strcmp(ns, limits->nameSpace) == 0) {
                limits->softLimit = soft;
                limits->hardLimit = hard;
                limits->currentUsed = 0;
                r = NVML_SUCCESS;
            }
        }
        if (f != NULL)
            fclose(f);
    }
    LOGR(r, "device=%u", idx);
    return r;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    setup();
    unsigned idx = 0;
    nvmlReturn_t r = device_query(device, &idx, __func__);
    if (r == NVML_SUCCESS && memory == NULL)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS && memory->version != (unsigned)nvmlMemory_v2)
        r = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (r == NVML_SUCCESS) {
        uint64_t used = used_bytes(idx);
        memory->total = g_cfg.mem_total;
        memory->reserved = 0;
        memory->used = used;
        memory->free = g_cfg.mem_total - used;
    }
    LOGR(r, "device=%u version=0x%x", idx, memory ? memory->version : 0u);
    return r;
}

/* ---- utilization ------------------------------------------------------- */

/* The previous reading per device, this process's own (a real NVML
 * samples the GPU itself; the fake has only the timeline's running sum). */
static struct {
    uint64_t at_ns, busy_ns;
} g_util[FAKE_MAX_DEVICES];

/* Percent of the wall time since this process's previous call that the
 * timeline had work put on it for (its busy_ns_total), at most 100; at the
 * first call, 100 if the device has work queued now, else 0. */
static unsigned utilization_gpu(unsigned idx)
{
    pthread_mutex_lock(&g_mu);
    struct fake_state *s = state_locked();
    uint64_t now = fake_now_ns(), busy = 0, until = 0;
    if (s != NULL) {
        busy = atomic_load(&s->dev[idx].busy_ns_total);
        until = atomic_load(&s->dev[idx].busy_until_ns);
    }
    unsigned pct;
    if (g_util[idx].at_ns == 0 || now <= g_util[idx].at_ns) {
        pct = until > now ? 100 : 0;
    } else {
        uint64_t d = busy >= g_util[idx].busy_ns ? busy - g_util[idx].busy_ns : 0;
        uint64_t p = d * 100 / (now - g_util[idx].at_ns);
        pct = p > 100 ? 100 : (unsigned)p;
    }
    g_util[idx].at_ns = now;
    g_util[idx].busy_ns = busy;
    pthread_mutex_unlock(&g_mu);
    return pct;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    setup();
    unsigned idx = 0;
    nvmlReturn_t r = device_query(device, &idx, __func__);
    if (r == NVML_SUCCESS && utilization == NULL)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS) {
        utilization->gpu = utilization_gpu(idx);
        utilization->memory = 0;
    }
    LOGR(r, "device=%u", idx);
    return r;
}

/* ---- processes ----------------------------------------------------------- */

/* One live process of a device, by the fake's ground truth (its slot). */
struct proc_row {
    int slot;
    uint32_t gen;
    int32_t pid;      /* getpid() in the process's own PID namespace */
    uint32_t host;    /* its PID in the caller's namespace; 0: not visible there */
    uint64_t pidns;   /* its PID namespace's inode */
    uint64_t start;   /* its start time, clock ticks since boot */
    uint64_t used;    /* bytes it holds on the device, context overhead included */
    uint64_t run;     /* ns the device ran its work */
    uint64_t first;   /* CLOCK_MONOTONIC start of its first work on the device, 0: none */
    bool ctx;         /* it has a live context on the device */
    /* For utilization samples (with `timeline`): */
    uint64_t credited;  /* run, less the part of a kernel running mid-way */
    uint64_t mid_start; /* when that kernel started (0: none running) */
    bool samp;          /* samp holds this owner's boundaries */
    struct fake_samp sp;
};

/* Caller holds g_mu. The live processes (their slot's lock is held) of device
 * idx. With `timeline`, the device's simulation is first advanced to now
 * (returned in *now), and a process whose kernel is running mid-way is
 * credited the part of it that has run. */
static unsigned read_procs(unsigned idx, struct proc_row *rows, bool timeline, uint64_t *now)
{
    struct fake_state *s = state_locked();
    *now = fake_now_ns();
    if (s == NULL)
        return 0;
    if (g_cfg.state_path != NULL)
        fake_state_reclaim_dead(s, g_state_fd, -1);
    unsigned n = 0;
    for (int i = 0; i < FAKE_MAX_SLOTS; i++) {
        struct fake_slot *sl = &s->slot[i];
        int32_t pid = atomic_load(&sl->pid);
        if (pid == 0 || (g_state_fd >= 0 && !fake_slot_locked(g_state_fd, i)))
            continue;
        struct proc_row *r = &rows[n++];
        r->slot = i;
        r->gen = atomic_load(&sl->gen);
        r->pid = pid;
        r->host = 0;
        r->pidns = atomic_load(&sl->pidns);
        r->start = atomic_load(&sl->start_ticks);
        r->used = atomic_load(&sl->used[idx]);
        r->ctx = atomic_load(&sl->ctxs[idx]) > 0;
        r->run = 0;
        r->first = 0;
    }
    if (!timeline)
        return n;
    tl_lock();
    *now = fake_now_ns();
    tl_advance((int)idx, *now);
    int q = TL->dev[idx].running;
    for (unsigned k = 0; k < n; k++) {
        struct proc_row *r = &rows[k];
        r->run = r->credited = atomic_load(&s->slot[r->slot].run_ns[idx]);
        r->first = atomic_load(&s->slot[r->slot].first_ns[idx]);
        r->mid_start = 0;
        if (q >= 0 && q < NQ && TL->q[q].owner == r->slot && TL->q[q].owner_gen == r->gen &&
            TL->q[q].head < TL->q[q].tail && *now > TL->q[q].started_ns) {
            uint64_t ran = *now - TL->q[q].started_ns, cur = TL->q[q].ring[TL->q[q].head % RING].ns;
            r->run += ran < cur ? ran : cur;
            r->mid_start = TL->q[q].started_ns;
        }
        r->sp = s->samp[r->slot][idx];
        r->samp = r->sp.gen == r->gen && r->gen != 0;
    }
    tl_unlock();
    return n;
}

/* Last "NSpid:" entry of /proc/<p>/status: the process's PID in its own
 * namespace. 0 if unreadable. */
static int32_t innermost_pid(const char *p)
{
    char buf[4096];
    if (!fake_read_proc(p, "status", buf, sizeof buf))
        return 0;
    char *l = strstr(buf, "\nNSpid:");
    if (l == NULL)
        return 0;
    l += 7;
    long last = 0;
    for (;;) {
        while (*l == ' ' || *l == '\t')
            l++;
        if (*l < '0' || *l > '9')
            break;
        last = strtol(l, &l, 10);
    }
    return (int32_t)last;
}

/* Fills rows[].host: the PID the caller's PID namespace gives each process
 * (a real NVML reports host PIDs, whatever namespace the process runs in).
 * Same namespace: its own pid. Else the caller's /proc is searched for the
 * process in that namespace with that start time whose innermost PID is
 * the slot's; none (it is not visible from here): 0. */
static void translate_pids(struct proc_row *rows, unsigned n)
{
    uint64_t mine = fake_pidns("self");
    bool need = false;
    for (unsigned k = 0; k < n; k++) {
        if (rows[k].pidns == mine)
            rows[k].host = (uint32_t)rows[k].pid;
        else
            need = true;
    }
    if (!need)
        return;
    DIR *d = opendir("/proc");
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        uint64_t ns = fake_pidns(e->d_name);
        if (ns == 0 || ns == mine)
            continue;
        uint64_t start = 0;
        int32_t inner = -1;
        for (unsigned k = 0; k < n; k++) {
            struct proc_row *r = &rows[k];
            if (r->host != 0 || r->pidns != ns)
                continue;
            if (start == 0)
                start = fake_start_ticks(e->d_name);
            if (start != r->start)
                continue;
            if (inner < 0)
                inner = innermost_pid(e->d_name);
            if (inner == r->pid)
                r->host = (uint32_t)strtoul(e->d_name, NULL, 10);
        }
    }
    closedir(d);
}

/* What nvmlDeviceGetComputeRunningProcesses* list: every live process with a
 * context on the device, or memory held there, visible from the caller's
 * PID namespace. `ver` 1: nvmlProcessInfo_v1_t, 2: _v2_t, 3: nvmlProcessInfo_t. */
static nvmlReturn_t running_procs(nvmlDevice_t device, unsigned *count, void *infos, int ver, unsigned *idx)
{
    nvmlReturn_t r = device_query(device, idx, "nvmlDeviceGetComputeRunningProcesses");
    if (r != NVML_SUCCESS)
        return r;
    if (count == NULL || (infos == NULL && *count != 0))
        return NVML_ERROR_INVALID_ARGUMENT;
    struct proc_row *rows = malloc(FAKE_MAX_SLOTS * sizeof *rows);
    if (rows == NULL)
        return NVML_ERROR_UNKNOWN;
    uint64_t now;
    pthread_mutex_lock(&g_mu);
    unsigned n = read_procs(*idx, rows, false, &now);
    pthread_mutex_unlock(&g_mu);
    translate_pids(rows, n);
    unsigned m = 0;
    for (unsigned k = 0; k < n; k++)
        if (rows[k].host != 0 && (rows[k].ctx || rows[k].used > 0))
            rows[m++] = rows[k];
    if (m > *count) {
        free(rows);
        *count = m;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned k = 0; k < m; k++) {
        if (ver == 1) {
            nvmlProcessInfo_v1_t *p = &((nvmlProcessInfo_v1_t *)infos)[k];
            p->pid = rows[k].host;
            p->usedGpuMemory = rows[k].used;
        } else {
            /* nvmlProcessInfo_v2_t and nvmlProcessInfo_t have one layout */
            nvmlProcessInfo_t *p = &((nvmlProcessInfo_t *)infos)[k];
            p->pid = rows[k].host;
            p->usedGpuMemory = rows[k].used;
            p->gpuInstanceId = 0xFFFFFFFFu;
            p->computeInstanceId = 0xFFFFFFFFu;
        }
    }
    free(rows);
    *count = m;
    return NVML_SUCCESS;
}

_Static_assert(sizeof(nvmlProcessInfo_v2_t) == sizeof(nvmlProcessInfo_t), "v2 and v3 infos share a layout");

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                  nvmlProcessInfo_v1_t *infos)
{
    setup();
    unsigned idx = 0, cap = infoCount ? *infoCount : 0;
    nvmlReturn_t r = running_procs(device, infoCount, infos, 1, &idx);
    LOGR(r, "device=%u count=%u", idx, cap);
    return r;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_v2_t *infos)
{
    setup();
    unsigned idx = 0, cap = infoCount ? *infoCount : 0;
    nvmlReturn_t r = running_procs(device, infoCount, infos, 2, &idx);
    LOGR(r, "device=%u count=%u", idx, cap);
    return r;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    setup();
    unsigned idx = 0, cap = infoCount ? *infoCount : 0;
    nvmlReturn_t r = running_procs(device, infoCount, infos, 3, &idx);
    LOGR(r, "device=%u count=%u", idx, cap);
    return r;
}

/* ---- per-process utilization ---------------------------------------------- */

/* Like a real NVML, which samples the GPU about every 1/6 s and keeps a
 * short buffer: one sample per process and period of the grid
 * (FAKE_NVML_SAMPLE_MS, boundaries at its multiples on CLOCK_MONOTONIC)
 * in which the device ran some of its work, for the last FAKE_SAMPLES
 * periods that have ended; smUtil = the share of the period the device ran
 * the process's work, timeStamp = the end of the period (CLOCK_REALTIME,
 * us). The timeline records each process's run time at every boundary
 * (struct fake_samp), so the samples are exact for their periods. */

static uint64_t realtime_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000ull + (uint64_t)ts.tv_nsec / 1000;
}

/* CLOCK_REALTIME - CLOCK_MONOTONIC in ns, read once: a boundary's time
 * stamp is the same at every call of this process (a caller passing one
 * back gets the samples after it, not that one again). */
static int64_t rt_offset_ns(void)
{
    static int64_t off;
    static bool have;
    if (!have) {
        off = (int64_t)(realtime_us() * 1000ull) - (int64_t)fake_now_ns();
        have = true;
    }
    return off;
}

/* Process r's run time at boundary k of the grid (period P, k * P <= now),
 * or false if that boundary is older than what is kept. */
static bool run_at(const struct proc_row *r, uint64_t k, uint64_t P, uint64_t *out)
{
    if (!r->samp || k > r->sp.k) {
        /* after the last recorded boundary: no credit since, but the
         * kernel running mid-way (its part before the boundary) */
        uint64_t B = k * P;
        *out = r->credited + (r->mid_start != 0 && B > r->mid_start ? B - r->mid_start : 0);
        return true;
    }
    if (r->sp.k - k >= FAKE_SAMPLES)
        return false;
    if (k <= r->sp.k0) {
        /* the owner ran nothing before its first recorded boundary */
        if (r->sp.k - r->sp.k0 >= FAKE_SAMPLES)
            return false;
        *out = r->sp.run[r->sp.k0 % FAKE_SAMPLES];
        return true;
    }
    *out = r->sp.run[k % FAKE_SAMPLES];
    return true;
}

static nvmlReturn_t process_utilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *out, unsigned *count,
                                        unsigned long long since, unsigned *idx)
{
    nvmlReturn_t ret = device_query(device, idx, "nvmlDeviceGetProcessUtilization");
    if (ret != NVML_SUCCESS)
        return ret;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    static struct proc_row rows[FAKE_MAX_SLOTS]; /* under g_mu; large */
    static struct nvmlProcessUtilizationSample_st samples[FAKE_MAX_SLOTS * FAKE_SAMPLES];
    static int slot_of[FAKE_MAX_SLOTS * FAKE_SAMPLES];
    uint64_t now, P = g_cfg.sample_ns;
    pthread_mutex_lock(&g_mu);
    unsigned n = read_procs(*idx, rows, true, &now);
    int64_t off = rt_offset_ns();
    uint64_t last_k = now / P;
    unsigned m = 0;
    for (unsigned j = 0; j < n; j++) {
        const struct proc_row *r = &rows[j];
        if (r->first == 0)
            continue;
        uint64_t k = last_k >= FAKE_SAMPLES ? last_k - FAKE_SAMPLES + 1 : 1;
        if (k < r->first / P + 1)
            k = r->first / P + 1; /* the first period it ran in */
        for (; k <= last_k; k++) {
            uint64_t ts = (uint64_t)((int64_t)(k * P) + off) / 1000;
            uint64_t a, b;
            if (ts <= since || !run_at(r, k - 1, P, &a) || !run_at(r, k, P, &b) || b <= a)
                continue; /* before lastSeenTimeStamp, out of the buffer, or no work in it */
            uint64_t pct = ((b - a) * 100 + P / 2) / P;
            samples[m].pid = 0; /* translated below, outside g_mu */
            slot_of[m] = r->slot;
            samples[m].timeStamp = ts;
            samples[m].smUtil = pct > 100 ? 100 : (unsigned)pct;
            samples[m].memUtil = samples[m].encUtil = samples[m].decUtil = 0;
            m++;
        }
    }
    struct proc_row *copy = malloc(n * sizeof *copy);
    if (copy != NULL && n > 0)
        memcpy(copy, rows, n * sizeof *copy);
    struct nvmlProcessUtilizationSample_st *mine = malloc((m ? m : 1) * sizeof *mine);
    int *slots = malloc((m ? m : 1) * sizeof *slots);
    if (mine != NULL && slots != NULL) {
        memcpy(mine, samples, m * sizeof *mine);
        memcpy(slots, slot_of, m * sizeof *slots);
    }
    pthread_mutex_unlock(&g_mu);
    if (copy == NULL || mine == NULL || slots == NULL) {
        free(copy);
        free(mine);
        free(slots);
        return NVML_ERROR_UNKNOWN;
    }
    translate_pids(copy, n);
    unsigned w = 0;
    for (unsigned j = 0; j < m; j++) {
        for (unsigned k = 0; k < n; k++) {
            if (copy[k].slot == slots[j]) {
                mine[j].pid = copy[k].host;
                break;
            }
        }
        if (mine[j].pid != 0)
            mine[w++] = mine[j];
    }
    free(copy);
    free(slots);
    if (w == 0) {
        free(mine);
        *count = 0;
        return NVML_ERROR_NOT_FOUND;
    }
    if (out == NULL || *count < w) {
        free(mine);
        *count = w;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(out, mine, w * sizeof mine[0]);
    free(mine);
    *count = w;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount, unsigned long long lastSeenTimeStamp)
{
    setup();
    unsigned idx = 0, cap = processSamplesCount ? *processSamplesCount : 0;
    nvmlReturn_t r = process_utilization(device, utilization, processSamplesCount, lastSeenTimeStamp, &idx);
    LOGR(r, "device=%u count=%u lastseen=%llu", idx, cap, lastSeenTimeStamp);
    return r;
}

/* ---- events and memory checks (GPU health) ------------------------------ */

#define FAKE_EVENT_TYPES 0xfull /* single/double-bit ECC, P-state, XID */
#define FAKE_EVENT_SET_MAGIC 0x45564e54u

struct nvmlEventSet_st {
    unsigned magic;
    unsigned long long types[FAKE_MAX_DEVICES]; /* registered, per device */
    off_t offset;                               /* of FAKE_NVML_HEALTH read so far */
};

static off_t health_size(void)
{
    struct stat st;
    const char *path = health_path();
    return (path != NULL && stat(path, &st) == 0) ? st.st_size : 0;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    setup();
    nvmlReturn_t r = initialised() ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (r == NVML_SUCCESS && set == NULL)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS) {
        struct nvmlEventSet_st *s = calloc(1, sizeof *s);
        if (s == NULL) {
            r = NVML_ERROR_UNKNOWN;
        } else {
            s->magic = FAKE_EVENT_SET_MAGIC;
            /* Events appended from now on. */
            s->offset = health_size();
            *set = s;
        }
    }
    LOGR0(r);
    return r;
}

static bool event_set_ok(nvmlEventSet_t set)
{
    return set != NULL && set->magic == FAKE_EVENT_SET_MAGIC;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    setup();
    unsigned idx = 0;
    nvmlReturn_t r = device_query(device, &idx, __func__);
    if (r == NVML_SUCCESS && eventTypes == NULL)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS)
        *eventTypes = health_of(idx).no_events ? 0 : FAKE_EVENT_TYPES;
    LOGR(r, "device=%u", idx);
    return r;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
    setup();
    unsigned idx = 0;
    nvmlReturn_t r = device_query(device, &idx, __func__);
    if (r == NVML_SUCCESS && !event_set_ok(set))
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS && (health_of(idx).no_events || (eventTypes & ~FAKE_EVENT_TYPES) != 0))
        r = NVML_ERROR_NOT_SUPPORTED;
    if (r == NVML_SUCCESS) {
        pthread_mutex_lock(&g_mu);
        set->types[idx] |= eventTypes;
        pthread_mutex_unlock(&g_mu);
    }
    LOGR(r, "device=%u types=0x%llx", idx, eventTypes);
    return r;
}

/* The next event of `set` in the file after its offset, consuming the
 * lines read (whole lines only); false: none yet. */
static bool next_event(nvmlEventSet_t set, nvmlEventData_t *data)
{
    const char *path = health_path();
    if (path == NULL)
        return false;
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return false;
    bool found = false;
    char line[256];
    pthread_mutex_lock(&g_mu);
    if (fseeko(f, set->offset, SEEK_SET) == 0) {
        while (!found && fgets(line, sizeof line, f) != NULL && strchr(line, '\n') != NULL) {
            set->offset += (off_t)strlen(line);
            unsigned dev;
            unsigned long long type, value;
            if (health_line(line, NULL, &dev, &type, &value) == 1 && dev < g_cfg.ndev &&
                (set->types[dev] & type) != 0) {
                data->device = &g_devs[dev];
                data->eventType = type;
                data->eventData = value;
                data->gpuInstanceId = 0xFFFFFFFFu;
                data->computeInstanceId = 0xFFFFFFFFu;
                found = true;
            }
        }
    }
    pthread_mutex_unlock(&g_mu);
    fclose(f);
    return found;
}

/* Returns the next event appended to FAKE_NVML_HEALTH for a device and
 * type registered in `set`, or NVML_ERROR_TIMEOUT after `timeoutms`. The
 * fake looks at the file every 10 ms meanwhile (a real NVML sleeps until
 * the driver signals an event). */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    setup();
    nvmlReturn_t r = initialised() ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (r == NVML_SUCCESS && (!event_set_ok(set) || data == NULL))
        r = NVML_ERROR_INVALID_ARGUMENT;
    uint64_t until = fake_now_ns() + (uint64_t)timeoutms * 1000000ull;
    /* No file to watch: no event can come; the whole timeout in one sleep. */
    bool watch = health_path() != NULL;
    while (r == NVML_SUCCESS && !next_event(set, data)) {
        uint64_t now = fake_now_ns();
        if (now >= until) {
            r = NVML_ERROR_TIMEOUT;
            break;
        }
        uint64_t nap = (!watch || until - now < 10000000ull) ? until - now : 10000000ull;
        struct timespec ts = {(time_t)(nap / 1000000000ull), (long)(nap % 1000000000ull)};
        nanosleep(&ts, NULL);
    }
    if (r == NVML_SUCCESS)
        LOGR(r, "timeoutms=%u device=%u type=0x%llx data=%llu", timeoutms, data->device->index, data->eventType,
             data->eventData);
    else
        LOGR(r, "timeoutms=%u", timeoutms);
    return r;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    setup();
    nvmlReturn_t r = initialised() ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (r == NVML_SUCCESS && !event_set_ok(set))
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS) {
        set->magic = 0;
        free(set);
    }
    LOGR0(r);
    return r;
}

/* The memory checks' prologue: the device, its health, ECC supported. */
static nvmlReturn_t ecc_query(nvmlDevice_t device, const void *out, unsigned *idx, struct health_dev *h,
                              const char *name)
{
    nvmlReturn_t r = device_query(device, idx, name);
    if (r == NVML_SUCCESS && out == NULL)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS) {
        *h = health_of(*idx);
        if (h->no_ecc)
            r = NVML_ERROR_NOT_SUPPORTED;
    }
    return r;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending)
{
    setup();
    unsigned idx = 0;
    struct health_dev h;
    nvmlReturn_t r = ecc_query(device, isPending, &idx, &h, __func__);
    if (r == NVML_SUCCESS)
        *isPending = h.retired_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    LOGR(r, "device=%u", idx);
    return r;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                       unsigned int *isPending, unsigned int *failureOccurred)
{
    setup();
    unsigned idx = 0;
    struct health_dev h;
    bool all = corrRows != NULL && uncRows != NULL && isPending != NULL && failureOccurred != NULL;
    nvmlReturn_t r = ecc_query(device, all ? corrRows : NULL, &idx, &h, __func__);
    if (r == NVML_SUCCESS) {
        *corrRows = 0;
        *uncRows = (h.remap_pending || h.remap_failure) ? 1 : 0;
        *isPending = h.remap_pending;
        *failureOccurred = h.remap_failure;
    }
    LOGR(r, "device=%u", idx);
    return r;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                         nvmlEccCounterType_t counterType, unsigned long long *eccCounts)
{
    setup();
    unsigned idx = 0;
    struct health_dev h;
    nvmlReturn_t r = ecc_query(device, eccCounts, &idx, &h, __func__);
    if (r == NVML_SUCCESS && ((unsigned)errorType > 1 || (unsigned)counterType > 1))
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS)
        *eccCounts = errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED ? h.ecc_uncorrected : 0;
    LOGR(r, "device=%u type=%d counter=%d", idx, (int)errorType, (int)counterType);
    return r;
}

/* ---- system ------------------------------------------------------------ */

const char *nvmlErrorString(nvmlReturn_t result)
{
    setup();
    const char *s;
    switch ((int)result) {
    case NVML_SUCCESS: s = "Success"; break;
    case NVML_ERROR_UNINITIALIZED: s = "Uninitialized"; break;
    case NVML_ERROR_INVALID_ARGUMENT: s = "Invalid Argument"; break;
    case NVML_ERROR_NOT_SUPPORTED: s = "Not Supported"; break;
    case NVML_ERROR_NOT_FOUND: s = "Not Found"; break;
    case NVML_ERROR_INSUFFICIENT_SIZE: s = "Insufficient Size"; break;
    case NVML_ERROR_FUNCTION_NOT_FOUND: s = "Function Not Found"; break;
    case NVML_ERROR_TIMEOUT: s = "Timeout"; break;
    case NVML_ERROR_GPU_IS_LOST: s = "GPU is lost"; break;
    case 25: s = "Argument version mismatch"; break;
    default: s = "Unknown Error"; break;
    }
    /* A string, not a status: the log's result field is "-". */
    nlog_s(__func__, "-", "result=%d", (int)result);
    return s;
}

static nvmlReturn_t driver_version(char *version, unsigned length)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    return copy_string(version, length, "580.95.05");
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    setup();
    nvmlReturn_t r = driver_version(version, length);
    LOGR(r, "length=%u", length);
    return r;
}

static nvmlReturn_t cuda_version(int *v)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (v == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *v = g_cfg.driver_version;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    setup();
    nvmlReturn_t r = cuda_version(cudaDriverVersion);
    LOGR0(r);
    return r;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    setup();
    nvmlReturn_t r = cuda_version(cudaDriverVersion);
    LOGR0(r);
    return r;
}
