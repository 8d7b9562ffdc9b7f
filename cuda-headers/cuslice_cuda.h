/*
 * cuslice: declarations of the CUDA driver API functions and types that the
 * shim intercepts or calls. Written for cuslice; checked against NVIDIA's
 * cuda.h by the ABI test in hookgen/tests/abi.rs. See README.md beside this
 * file for the @hook annotation.
 */
#ifndef CUSLICE_CUDA_H
#define CUSLICE_CUDA_H

#include <stddef.h>
#include <stdint.h>

/* ---- scalar types ---------------------------------------------------- */

typedef uint32_t cuuint32_t;
typedef uint64_t cuuint64_t;

typedef unsigned int CUdeviceptr_v1;
typedef unsigned long long CUdeviceptr_v2;
typedef CUdeviceptr_v2 CUdeviceptr;

typedef int CUdevice_v1;
typedef CUdevice_v1 CUdevice;

typedef unsigned long long CUmemGenericAllocationHandle_v1;
typedef CUmemGenericAllocationHandle_v1 CUmemGenericAllocationHandle;

/* ---- opaque handles -------------------------------------------------- */

typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;

/* Passed through by pointer only; their contents are never read. */
typedef struct CUexecAffinityParam_st CUexecAffinityParam;
typedef struct CUctxCreateParams_st CUctxCreateParams;
typedef struct CUlaunchAttribute_st CUlaunchAttribute;

/* ---- enums (only the values cuslice uses) ---------------------------- */

typedef enum cudaError_enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_UNKNOWN = 999
} CUresult;

typedef enum CUdriverProcAddress_flags_enum {
    CU_GET_PROC_ADDRESS_DEFAULT = 0,
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1,
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2
} CUdriverProcAddress_flags;

typedef enum CUdriverProcAddressQueryResult_enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2
} CUdriverProcAddressQueryResult;

typedef enum CUarray_format_enum {
    CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
    CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
    CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
    CU_AD_FORMAT_SIGNED_INT8 = 0x08,
    CU_AD_FORMAT_SIGNED_INT16 = 0x09,
    CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
    CU_AD_FORMAT_HALF = 0x10,
    CU_AD_FORMAT_FLOAT = 0x20
} CUarray_format;

typedef enum CUmemAllocationType_enum {
    CU_MEM_ALLOCATION_TYPE_INVALID = 0x0,
    CU_MEM_ALLOCATION_TYPE_PINNED = 0x1
} CUmemAllocationType;

typedef enum CUmemAllocationHandleType_enum {
    CU_MEM_HANDLE_TYPE_NONE = 0x0,
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1
} CUmemAllocationHandleType;

typedef enum CUmemLocationType_enum {
    CU_MEM_LOCATION_TYPE_INVALID = 0x0,
    CU_MEM_LOCATION_TYPE_DEVICE = 0x1,
    CU_MEM_LOCATION_TYPE_HOST = 0x2
} CUmemLocationType;

typedef enum CUmemPool_attribute_enum {
    CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
    CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
    CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
    CU_MEMPOOL_ATTR_USED_MEM_HIGH
} CUmemPool_attribute;

typedef enum CUevent_flags_enum {
    CU_EVENT_DEFAULT = 0x0,
    CU_EVENT_BLOCKING_SYNC = 0x1,
    CU_EVENT_DISABLE_TIMING = 0x2
} CUevent_flags;

typedef enum CUstreamCaptureStatus_enum {
    CU_STREAM_CAPTURE_STATUS_NONE = 0,
    CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
    CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2
} CUstreamCaptureStatus;

/* ---- structs the hooks read ------------------------------------------ */

typedef struct CUuuid_st {
    char bytes[16];
} CUuuid;

typedef struct CUmemLocation_st {
    CUmemLocationType type;
    union {
        int id;
        struct {
            unsigned char deviceId;
            unsigned char localityDomainId;
        } localized;
    };
} CUmemLocation_v1;
typedef CUmemLocation_v1 CUmemLocation;

typedef struct CUmemAllocationProp_st {
    CUmemAllocationType type;
    CUmemAllocationHandleType requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp_v1;
typedef CUmemAllocationProp_v1 CUmemAllocationProp;

typedef struct CUDA_ARRAY_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v2;
typedef CUDA_ARRAY_DESCRIPTOR_v2 CUDA_ARRAY_DESCRIPTOR;

typedef struct CUDA_ARRAY3D_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    size_t Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v2;
typedef CUDA_ARRAY3D_DESCRIPTOR_v2 CUDA_ARRAY3D_DESCRIPTOR;

typedef struct CUlaunchConfig_st {
    unsigned int gridDimX;
    unsigned int gridDimY;
    unsigned int gridDimZ;
    unsigned int blockDimX;
    unsigned int blockDimY;
    unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

/* ==== initialisation and entry points ================================= */

/** @hook override context */
CUresult cuInit(unsigned int Flags);

/** @hook override proc_address */
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);

/** @hook override proc_address */
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus);

/* ==== device memory: allocation families ============================== */

/** @hook override memory */
CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize);

/** @hook override memory */
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);

/** @hook override memory */
CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes,
                         unsigned int Height, unsigned int ElementSizeBytes);

/** @hook override memory */
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes);

/** @hook override memory */
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);

/** @hook override memory */
CUresult cuMemFree(CUdeviceptr_v1 dptr);

/** @hook override memory */
CUresult cuMemFree_v2(CUdeviceptr dptr);

/** @hook override memory */
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);

/** @hook override memory */
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);

/** @hook override memory */
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);

/** @hook override memory */
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream);

/** @hook override memory */
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream);

/** @hook override memory */
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);

/** @hook override memory */
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep);

/** @hook pass */
CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value);

/** @hook pass */
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value);

/** @hook override memory */
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags);

/** @hook override memory */
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);

/** @hook override memory */
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags);

/** @hook override memory */
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);

/** @hook override memory */
CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray);

/** @hook override memory */
CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray);

/** @hook override memory */
CUresult cuArrayDestroy(CUarray hArray);

/** @hook override memory */
CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                unsigned int numMipmapLevels);

/** @hook override memory */
CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray);

/* Pinned host memory: not device memory, so never counted; declared for
 * the fake driver and the tests. */

/** @hook real */
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags);

/** @hook real */
CUresult cuMemFreeHost(void *p);

/* ==== memory information ============================================== */

/** @hook post info */
CUresult cuMemGetInfo(unsigned int *free, unsigned int *total);

/** @hook post info */
CUresult cuMemGetInfo_v2(size_t *free, size_t *total);

/** @hook post info */
CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev);

/** @hook post info */
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);

/* ==== work submission ================================================= */

/** @hook pre launch */
CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra);

/** @hook pre launch */
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                             unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                             unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra);

/** @hook pre launch */
CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra);

/** @hook pre launch */
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra);

/** @hook pre launch */
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                   unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams);

/** @hook pre launch */
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams);

/** @hook pre launch */
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream);

/** @hook pre launch */
CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream);

/* ==== contexts ======================================================== */

/** @hook override context */
CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);

/** @hook override context */
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);

/** @hook override context */
CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
                        CUdevice dev);

/** @hook override context */
CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev);

/** @hook pass */
CUresult cuCtxDestroy_v2(CUcontext ctx);

/** @hook override context */
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);

/** @hook pass */
CUresult cuDevicePrimaryCtxRelease(CUdevice dev);

/** @hook pass */
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);

/** @hook pass */
CUresult cuDevicePrimaryCtxReset(CUdevice dev);

/** @hook pass */
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);

/* ==== called by the shim, never exported ============================== */

/** @hook real */
CUresult cuDriverGetVersion(int *driverVersion);

/** @hook real */
CUresult cuDeviceGet(CUdevice *device, int ordinal);

/** @hook real */
CUresult cuDeviceGetCount(int *count);

/** @hook real */
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);

/** @hook real */
CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev);

/** @hook real */
CUresult cuCtxGetCurrent(CUcontext *pctx);

/** @hook real */
CUresult cuCtxSetCurrent(CUcontext ctx);

/** @hook real */
CUresult cuCtxGetDevice(CUdevice *device);

/* Synchronising calls: a process that launches freely has work in flight
 * until they return (charged to its share), and a latency tenant's work in
 * flight holds other tenants back until then (src/hooks/sync.rs). */

/** @hook override sync */
CUresult cuCtxSynchronize(void);

/** @hook override sync */
CUresult cuCtxSynchronize_v2(CUcontext ctx);

/** @hook override sync */
CUresult cuStreamSynchronize(CUstream hStream);

/** @hook override sync */
CUresult cuStreamSynchronize_ptsz(CUstream hStream);

/** @hook real */
CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus);

/** @hook real */
CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags);

/** @hook real */
CUresult cuEventRecord(CUevent hEvent, CUstream hStream);

/** @hook real */
CUresult cuEventQuery(CUevent hEvent);

/** @hook override sync */
CUresult cuEventSynchronize(CUevent hEvent);

/** @hook real */
CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd);

/** @hook real */
CUresult cuEventDestroy_v2(CUevent hEvent);

#endif /* CUSLICE_CUDA_H */
