/*
 * cuslice: declarations of the CUPTI activity-API functions and types that
 * cuslice uses to measure each process's GPU time (kernel records). Written
 * for cuslice from CUPTI's documented ABI; checked against NVIDIA's cupti.h
 * by the ABI test in hookgen/tests/abi.rs. The real functions live in
 * libcupti.so.13. No @hook annotations: cuslice calls CUPTI, it does not
 * intercept it (build.rs does not read this header).
 *
 * Result codes: checked against cupti_result.h of the nvidia-cuda-cupti
 * 13.5.25 wheel (PyPI) and public bindings (find_string
 * "CUPTI_ERROR_NOT_COMPATIBLE": the Go and Rust bindings give 14).
 * CUPTI_ERROR_NOT_COMPATIBLE is 14 (28 is
 * CUPTI_ERROR_UM_PROFILING_NOT_SUPPORTED).
 *
 * Two entry points of other CUPTI APIs are declared at the end: the shim
 * exports them in front of CUPTI's (the callback API's cuptiSubscribe, the
 * profiler's cuptiProfilerInitialize) to learn that the program uses CUPTI
 * itself, so that the meter never detaches CUPTI from under it. The ABI
 * test checks them against cupti.h and cupti_profiler_target.h (which
 * cupti.h does not include).
 */
#ifndef CUSLICE_CUPTI_H
#define CUSLICE_CUPTI_H

#include <stddef.h>
#include <stdint.h>

#include "cuslice_cuda.h" /* CUcontext */

/* Activity records are packed and 8-byte aligned (CUPTI's
 * ACTIVITY_RECORD_ALIGNMENT); CUPTIAPI is empty on Linux. */
#define CUSLICE_CUPTI_RECORD __attribute__((__packed__)) __attribute__((aligned(8)))

/* All values are non-negative: the underlying type is unsigned int, as the
 * real enum's. */
typedef enum {
    CUPTI_SUCCESS = 0,
    CUPTI_ERROR_INVALID_PARAMETER = 1,
    CUPTI_ERROR_INVALID_OPERATION = 7,
    CUPTI_ERROR_MAX_LIMIT_REACHED = 12,
    CUPTI_ERROR_NOT_COMPATIBLE = 14,
    CUPTI_ERROR_NOT_INITIALIZED = 15,
    CUPTI_ERROR_INVALID_KIND = 21,
    CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED = 39,
    CUPTI_ERROR_UNKNOWN = 999
} CUptiResult;

typedef enum {
    CUPTI_ACTIVITY_KIND_KERNEL = 3,
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL = 10
} CUpti_ActivityKind;

/* cuptiActivityFlushAll's flag: deliver buffers holding incomplete records too. */
typedef enum {
    CUPTI_ACTIVITY_FLAG_FLUSH_FORCED = 1
} CUpti_ActivityFlag;

/* The header of every activity record: what kind of record follows. */
typedef struct CUSLICE_CUPTI_RECORD {
    CUpti_ActivityKind kind;
} CUpti_Activity;

/* The part of a kernel record (CUPTI_ACTIVITY_KIND_KERNEL and
 * CONCURRENT_KERNEL) that cuslice reads, at the offsets of CUDA 13.0's
 * CUpti_ActivityKernel10 (216 bytes; later CUPTI versions append fields,
 * the offsets below stay). Timestamps are in ns. Our own name: the ABI test
 * checks each field that is not reserved* against CUpti_ActivityKernel10's
 * field of the same name, and the size and alignment. */
struct CUSLICE_CUPTI_RECORD cuslice_cupti_kernel_record {
    CUpti_ActivityKind kind;     /* 0 */
    uint8_t reserved0[12];       /* 4: cache and shared-memory configuration, registers */
    uint64_t start;              /* 16: when the kernel started executing */
    uint64_t end;                /* 24: when it finished */
    uint8_t reserved1[8];        /* 32: completed */
    uint32_t deviceId;           /* 40 */
    uint32_t contextId;          /* 44 */
    uint32_t streamId;           /* 48 */
    uint8_t reserved2[164];      /* 52: grid, block, memory, names, ids ... */
};

_Static_assert(sizeof(CUpti_Activity) == 8, "CUpti_Activity is 8 bytes");
_Static_assert(sizeof(struct cuslice_cupti_kernel_record) == 216, "CUpti_ActivityKernel10 is 216 bytes");
_Static_assert(_Alignof(struct cuslice_cupti_kernel_record) == 8, "activity records are 8-byte aligned");
_Static_assert(offsetof(struct cuslice_cupti_kernel_record, kind) == 0, "kind");
_Static_assert(offsetof(struct cuslice_cupti_kernel_record, start) == 16, "start");
_Static_assert(offsetof(struct cuslice_cupti_kernel_record, end) == 24, "end");
_Static_assert(offsetof(struct cuslice_cupti_kernel_record, deviceId) == 40, "deviceId");
_Static_assert(offsetof(struct cuslice_cupti_kernel_record, contextId) == 44, "contextId");
_Static_assert(offsetof(struct cuslice_cupti_kernel_record, streamId) == 48, "streamId");

/* CUPTI asks for an empty buffer: set *buffer (NULL: none, the records are
 * dropped), *size (its size in bytes) and *maxNumRecords (0: as many as fit). */
typedef void (*CUpti_BuffersCallbackRequestFunc)(uint8_t **buffer, size_t *size, size_t *maxNumRecords);

/* CUPTI hands back a buffer holding validSize bytes of records. context is
 * NULL and streamId 0 (deprecated since CUDA 8.0). */
typedef void (*CUpti_BuffersCallbackCompleteFunc)(CUcontext context, uint32_t streamId, uint8_t *buffer, size_t size,
                                                  size_t validSize);

CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc funcBufferRequested,
                                           CUpti_BuffersCallbackCompleteFunc funcBufferCompleted);
CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind);
CUptiResult cuptiActivityDisable(CUpti_ActivityKind kind);
CUptiResult cuptiActivityFlushAll(uint32_t flag);
CUptiResult cuptiActivityGetNextRecord(uint8_t *buffer, size_t validBufferSizeBytes, CUpti_Activity **record);
CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext context, uint32_t streamId, size_t *dropped);
CUptiResult cuptiGetTimestamp(uint64_t *timestamp);
CUptiResult cuptiGetResultString(CUptiResult result, const char **str);
/* Detaches CUPTI from the process (optional for cuslice: the meter detaches
 * it between probes where the library has it, unless CUSLICE_METER_DETACH=0
 * or the program uses CUPTI itself). */
CUptiResult cuptiFinalize(void);

/* ---- Entry points the shim fronts (it calls none of them itself) ---- */

/* The callback API: a subscriber, the handle CUPTI gives it, and the
 * function CUPTI calls for each callback it enables (userdata as given at
 * subscription, the callback's domain and id, and data that depends on
 * the domain; domain is CUPTI's CUpti_CallbackDomain, an enum of
 * unsigned values, passed as such). Only the handle type's name is needed
 * here. */
typedef struct CUpti_Subscriber_st *CUpti_SubscriberHandle;
typedef uint32_t CUpti_CallbackId;
typedef void (*CUpti_CallbackFunc)(void *userdata, uint32_t domain, CUpti_CallbackId cbid, const void *cbdata);

/* Registers the process's one callback subscriber (no callback enabled
 * yet); a second one -> CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED. */
CUptiResult cuptiSubscribe(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc callback, void *userdata);

/* cuptiSubscribe's successor (CUDA 13): the same, with optional parameters
 * (pParams may be NULL): structSize as for the profiler's parameters, a
 * name for the subscriber, where to write the name of an incompatible
 * subscriber already there and that buffer's size, and a request to allow
 * several subscribers (1) or not (0). */
typedef struct {
    size_t structSize;
    const char *subscriberName;
    char *oldSubscriberName;
    size_t oldSubscriberSize;
    uint8_t allowMultipleSubscribers;
    uint8_t padding[7];
} CUpti_SubscriberParams;

CUptiResult cuptiSubscribe_v2(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc callback, void *userdata,
                              CUpti_SubscriberParams *pParams);

/* The profiler API's first call (range profiling): structSize is the size
 * of the struct the caller knows (up to and including pPriv), pPriv is
 * NULL. */
typedef struct CUpti_Profiler_Initialize_Params {
    size_t structSize;
    void *pPriv;
} CUpti_Profiler_Initialize_Params;

CUptiResult cuptiProfilerInitialize(CUpti_Profiler_Initialize_Params *pParams);

#endif /* CUSLICE_CUPTI_H */
