/*
 * cuslice: declarations of the NVML functions and types that the host
 * command (`cuslice status`, `top`, the exporter, `cuslice watch`, the OCI
 * hook) and the DRA plugin (`cuslice-dra-plugin`) call, beyond those of
 * cuslice_nvml.h, which it includes and they call too. Written for
 * cuslice; checked against NVIDIA's nvml.h by the ABI test in
 * hookgen/tests/abi.rs. No @hook annotations: the shim neither exports nor
 * calls these. host/build.rs turns every function declared here and in
 * cuslice_nvml.h into a function-pointer type (hookgen::loader_bindings)
 * for the host file layer's NVML loader, which loads NVML itself. See
 * README.md beside this file.
 */
#ifndef CUSLICE_NVML_HOST_H
#define CUSLICE_NVML_HOST_H

#include "cuslice_nvml.h"

/* usedGpuMemory when NVML cannot tell. */
#define NVML_VALUE_NOT_AVAILABLE (-1)
/* The largest device name (a UUID is shorter). */
#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96

typedef struct nvmlUtilization_st {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

/* What the unversioned process listing fills. */
typedef struct nvmlProcessInfo_v1_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

/* What the _v2 and _v3 process listings fill. */
typedef struct nvmlProcessInfo_v2_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t, nvmlProcessInfo_t;

typedef struct nvmlProcessUtilizationSample_st {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

const char *nvmlErrorString(nvmlReturn_t result);

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length);

/* The DRA plugin: the device node (/dev/nvidia<minor>) and the compute
 * capability it publishes. */
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber);

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor);

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization);

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos);

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_v2_t *infos);

/* The oldest listing, for a driver before the _v2 one (nvml.h declares it
 * under this name only with NVML_NO_UNVERSIONED_FUNC_DEFS). */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                  nvmlProcessInfo_v1_t *infos);

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                             nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp);

/* The driver's own per-cgroup memory limit (R615 on; cgroup v2): the OCI
 * hook sets a container's cgroup's hard limit to its quota, `status` reads
 * it. `nameSpace` is the cgroup's directory under /sys/fs/cgroup. Looked up
 * at run time: older drivers have neither. */
typedef struct {
    const char *nameSpace;
    unsigned long long softLimit;
    unsigned long long hardLimit;
} nvmlSetMemoryLimits_v1_t;

typedef struct {
    const char *nameSpace;
    unsigned long long softLimit;
    unsigned long long hardLimit;
    unsigned long long currentUsed;
} nvmlGetMemoryLimits_v1_t;

nvmlReturn_t nvmlDeviceSetMemoryLimits_v1(nvmlDevice_t device, nvmlSetMemoryLimits_v1_t *limits);

nvmlReturn_t nvmlDeviceGetMemoryLimits_v1(nvmlDevice_t device, nvmlGetMemoryLimits_v1_t *limits);

/* GPU health (host/src/gpu/health/): the XID events the health source waits
 * for, and the checks of a GPU's memory it makes now and then. */

/* A set of devices' events, waited on together. */
typedef struct nvmlEventSet_st *nvmlEventSet_t;

/* Event types, a bit mask (nvmlDeviceRegisterEvents): a double-bit ECC
 * error, and an XID error (NVML delivers every XID under this type,
 * whatever its name says: which of them count is cuslice's to judge). */
#define nvmlEventTypeDoubleBitEccError 0x0000000000000002LL
#define nvmlEventTypeXidCriticalError 0x0000000000000008LL

/* One event: the device, its type and, for an XID event, the XID. */
typedef struct nvmlEventData_st {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

typedef enum nvmlEnableState_enum {
    NVML_FEATURE_DISABLED = 0,
    NVML_FEATURE_ENABLED = 1
} nvmlEnableState_t;

/* Which ECC errors a count is of: corrected (single-bit) or not. */
typedef enum nvmlMemoryErrorType_enum {
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0,
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
} nvmlMemoryErrorType_t;

/* Since the driver loaded (volatile) or over the GPU's life (aggregate). */
typedef enum nvmlEccCounterType_enum {
    NVML_VOLATILE_ECC = 0,
    NVML_AGGREGATE_ECC = 1
} nvmlEccCounterType_t;

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set);

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes);

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                      nvmlEventSet_t set);

/* Returns at once with an event ready, else sleeps until one comes or
 * `timeoutms` passes (NVML_ERROR_TIMEOUT). */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms);

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set);

/* Whether pages are retired and waiting for a reset or reboot to take
 * effect (GPUs before Ampere retire pages; Ampere and later remap rows). */
nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending);

/* Rows remapped for correctable and uncorrectable errors, whether a
 * remapping waits for a reset, and whether one ever failed. */
nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                       unsigned int *isPending, unsigned int *failureOccurred);

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                         nvmlEccCounterType_t counterType, unsigned long long *eccCounts);

#endif /* CUSLICE_NVML_HOST_H */
