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
static struct fake_state *g_state;
static int g_state_fd = -1; /* our own open file description, for liveness probes */
static struct nvmlDevice_st g_devs[FAKE_MAX_DEVICES];

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
    if (g_state != NULL)
        return g_state;
    if (g_cfg.state_path != NULL) {
        g_state = fake_state_attach(g_cfg.state_path, &g_state_fd);
        if (g_state == NULL) {
            fprintf(stderr, "%s: FAKE_CUDA_STATE=\"%s\": %s\n", WHO, g_cfg.state_path, strerror(errno));
            abort();
        }
        return g_state;
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
            g_state = p;
            g_state_fd = fd;
            break;
        }
        if (p != MAP_FAILED)
            munmap(p, sizeof(struct fake_state));
        close(fd);
    }
    closedir(d);
    return g_state;
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

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    setup();
    unsigned idx = 0;
    nvmlReturn_t r = device_index(device, &idx);
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

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    setup();
    unsigned idx = 0;
    nvmlReturn_t r = device_index(device, &idx);
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
    nvmlReturn_t r = device_index(device, &idx);
    if (r == NVML_SUCCESS && utilization == NULL)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS) {
        utilization->gpu = utilization_gpu(idx);
        utilization->memory = 0;
    }
    LOGR(r, "device=%u", idx);
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
