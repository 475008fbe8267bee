/* Stand-in libcuda.so.1: modules, streams, events, kernel launches, error names and
 * symbol lookup (cuGetProcAddress). A kernel keeps its device busy for
 * GPU_SHARE_STANDIN_KERNEL_US on the device's timeline, which every process shares;
 * the busy time is what NVML reports as utilisation. */
#define _GNU_SOURCE
#include <cuda.h>
#include "standin.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SC_MAGIC_MOD 0x4d4f4431u
#define SC_MAGIC_FUNC 0x46554e31u
#define SC_MAGIC_STREAM 0x53545231u
#define SC_MAGIC_EVENT 0x45564e31u

struct CUmod_st { uint32_t magic; };
struct CUfunc_st { uint32_t magic; CUmodule mod; };
struct CUstream_st { uint32_t magic; struct CUctx_st *ctx; uint64_t busy_until; };
struct CUevent_st { uint32_t magic; int recorded; uint64_t t; };

/* ---- modules: any image loads, any name is a function ----------------------------- */

static CUresult module_new(CUmodule *module, const void *image)
{
    struct CUctx_st *c;
    CUresult rc = sc_current(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUmod_st *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->magic = SC_MAGIC_MOD;
    *module = m;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleLoad(CUmodule *module, const char *fname)
{
    if (fname && access(fname, R_OK) != 0)
        return CUDA_ERROR_FILE_NOT_FOUND;
    return module_new(module, fname);
}

CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image)
{
    return module_new(module, image);
}

CUresult CUDAAPI cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                                    CUjit_option *options, void **optionValues)
{
    (void)numOptions;
    (void)options;
    (void)optionValues;
    return module_new(module, image);
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    if (!sc_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!hmod || hmod->magic != SC_MAGIC_MOD)
        return CUDA_ERROR_INVALID_HANDLE;
    struct CUfunc_st *f = calloc(1, sizeof *f);
    if (!f)
        return CUDA_ERROR_OUT_OF_MEMORY;
    f->magic = SC_MAGIC_FUNC;
    f->mod = hmod;
    *hfunc = f;
    return CUDA_SUCCESS;
}

/* Modules and functions stay allocated (marked dead): stale handles fail cleanly. */
CUresult CUDAAPI cuModuleUnload(CUmodule hmod)
{
    if (!sc_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!hmod || hmod->magic != SC_MAGIC_MOD)
        return CUDA_ERROR_INVALID_HANDLE;
    hmod->magic = 0;
    return CUDA_SUCCESS;
}

/* ---- streams ---------------------------------------------------------------------- */

CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    struct CUctx_st *c;
    CUresult rc = sc_current(&c);
    (void)Flags;
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!phStream)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->magic = SC_MAGIC_STREAM;
    s->ctx = c;
    *phStream = s;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
    (void)priority;
    return cuStreamCreate(phStream, flags);
}

CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream)
{
    if (!sc_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!hStream || hStream->magic != SC_MAGIC_STREAM)
        return CUDA_ERROR_INVALID_HANDLE;
    hStream->magic = 0;
    return CUDA_SUCCESS;
}

/* The default streams (NULL, legacy, per-thread) stand for the current context. */
static CUresult stream_of(CUstream h, struct CUctx_st **ctx, struct CUstream_st **s)
{
    *s = NULL;
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
        return sc_current(ctx);
    if (!sc_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (h->magic != SC_MAGIC_STREAM)
        return CUDA_ERROR_INVALID_HANDLE;
    *s = h;
    *ctx = h->ctx;
    return (*ctx)->live ? CUDA_SUCCESS : CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

static uint64_t stream_end(struct CUctx_st *c, struct CUstream_st *s)
{
    return s ? s->busy_until : c->busy_until;
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream)
{
    struct CUctx_st *c;
    struct CUstream_st *s;
    CUresult rc = stream_of(hStream, &c, &s);
    if (rc == CUDA_SUCCESS)
        si_sleep_until(stream_end(c, s));
    return rc;
}

CUresult CUDAAPI cuStreamQuery(CUstream hStream)
{
    struct CUctx_st *c;
    struct CUstream_st *s;
    CUresult rc = stream_of(hStream, &c, &s);
    if (rc == CUDA_SUCCESS && si_now_us() < stream_end(c, s))
        rc = CUDA_ERROR_NOT_READY;
    return rc;
}

/* ---- events ----------------------------------------------------------------------- */

CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    (void)Flags;
    if (!sc_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!phEvent)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = SC_MAGIC_EVENT;
    *phEvent = e;
    return CUDA_SUCCESS;
}

static int valid_event(CUevent e) { return e && e->magic == SC_MAGIC_EVENT; }

/* An event completes when the work queued before it on its stream does. */
CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream)
{
    struct CUctx_st *c;
    struct CUstream_st *s;
    CUresult rc = stream_of(hStream, &c, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!valid_event(hEvent))
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t now = si_now_us(), end = stream_end(c, s);
    hEvent->t = end > now ? end : now;
    hEvent->recorded = 1;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent)
{
    if (!valid_event(hEvent))
        return CUDA_ERROR_INVALID_HANDLE;
    return hEvent->recorded && si_now_us() < hEvent->t ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent)
{
    if (!valid_event(hEvent))
        return CUDA_ERROR_INVALID_HANDLE;
    if (hEvent->recorded)
        si_sleep_until(hEvent->t);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    if (!pMilliseconds)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_event(hStart) || !valid_event(hEnd) || !hStart->recorded || !hEnd->recorded)
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t last = hStart->t > hEnd->t ? hStart->t : hEnd->t;
    if (si_now_us() < last)
        return CUDA_ERROR_NOT_READY;
    *pMilliseconds = (float)(((double)hEnd->t - (double)hStart->t) / 1000.0);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    return cuEventElapsedTime_v2(pMilliseconds, hStart, hEnd);
}

CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent)
{
    if (!valid_event(hEvent))
        return CUDA_ERROR_INVALID_HANDLE;
    hEvent->magic = 0;
    free(hEvent);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    struct CUctx_st *c;
    struct CUstream_st *s;
    CUresult rc = stream_of(hStream, &c, &s);
    (void)Flags;
    if (rc == CUDA_SUCCESS && !valid_event(hEvent))
        rc = CUDA_ERROR_INVALID_HANDLE;
    return rc;  /* one timeline per device: the order is kept anyway */
}

/* ---- launches --------------------------------------------------------------------- */

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, CUstream hStream)
{
    struct CUctx_st *c;
    struct CUstream_st *s;
    CUresult rc = stream_of(hStream, &c, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!f || f->magic != SC_MAGIC_FUNC || f->mod->magic != SC_MAGIC_MOD)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t end = si_launch(sc_device(c->dev), si_kernel_us());
    if (end > c->busy_until)
        c->busy_until = end;
    if (s && end > s->busy_until)
        s->busy_until = end;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                unsigned int gridDimZ, unsigned int blockDimX,
                                unsigned int blockDimY, unsigned int blockDimZ,
                                unsigned int sharedMemBytes, CUstream hStream,
                                void **kernelParams, void **extra)
{
    (void)sharedMemBytes;
    (void)kernelParams;
    (void)extra;
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream);
}

CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f,
                                  void **kernelParams, void **extra)
{
    (void)kernelParams;
    (void)extra;
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                  config->blockDimY, config->blockDimZ, config->hStream);
}

/* ---- error names ------------------------------------------------------------------ */

#define SC_ERRORS(X)                                                                     \
    X(CUDA_SUCCESS, "no error")                                                          \
    X(CUDA_ERROR_INVALID_VALUE, "invalid argument")                                      \
    X(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")                                         \
    X(CUDA_ERROR_NOT_INITIALIZED, "initialization error")                                \
    X(CUDA_ERROR_DEINITIALIZED, "driver shutting down")                                  \
    X(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library")                          \
    X(CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA-capable device(s) is/are busy or unavailable") \
    X(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected")                        \
    X(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")                               \
    X(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid")                        \
    X(CUDA_ERROR_INVALID_CONTEXT, "invalid device context")                              \
    X(CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "context already current")                     \
    X(CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image is available for execution")        \
    X(CUDA_ERROR_FILE_NOT_FOUND, "file not found")                                       \
    X(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, "shared object initialization failed")       \
    X(CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported")          \
    X(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle")                              \
    X(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state") \
    X(CUDA_ERROR_NOT_FOUND, "named symbol not found")                                    \
    X(CUDA_ERROR_NOT_READY, "device not ready")                                          \
    X(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered")            \
    X(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch")     \
    X(CUDA_ERROR_LAUNCH_TIMEOUT, "the launch timed out and was terminated")              \
    X(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "primary context active")                       \
    X(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed")                           \
    X(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure")                            \
    X(CUDA_ERROR_NOT_PERMITTED, "operation not permitted")                               \
    X(CUDA_ERROR_NOT_SUPPORTED, "operation not supported")                               \
    X(CUDA_ERROR_SYSTEM_NOT_READY, "system not yet initialized")                         \
    X(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "unsupported display driver / cuda driver combination") \
    X(CUDA_ERROR_TIMEOUT, "wait operation timed out")                                    \
    X(CUDA_ERROR_UNKNOWN, "unknown error")

static const struct { CUresult code; const char *name, *text; } g_errors[] = {
#define SC_ERR(code, text) {code, #code, text},
    SC_ERRORS(SC_ERR)
#undef SC_ERR
};

static CUresult error_lookup(CUresult error, const char **pStr, int name)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++) {
        if (g_errors[i].code == error) {
            *pStr = name ? g_errors[i].name : g_errors[i].text;
            return CUDA_SUCCESS;
        }
    }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr)
{
    return error_lookup(error, pStr, 1);
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr)
{
    return error_lookup(error, pStr, 0);
}

/* ---- symbol lookup ---------------------------------------------------------------- */

/* Every function this library exports (other files' included). */
#define SC_EXPORTS(X)                                                                         \
    X(cuInit) X(cuDriverGetVersion) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName)     \
    X(cuDeviceGetUuid) X(cuDeviceGetUuid_v2) X(cuDeviceTotalMem_v2) X(cuDeviceGetAttribute)   \
    X(cuDeviceGetPCIBusId) X(cuDeviceGetByPCIBusId) X(cuDeviceCanAccessPeer)                  \
    X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuDevicePrimaryCtxRelease_v2)  \
    X(cuDevicePrimaryCtxReset) X(cuDevicePrimaryCtxReset_v2) X(cuDevicePrimaryCtxGetState)    \
    X(cuDevicePrimaryCtxSetFlags) X(cuDevicePrimaryCtxSetFlags_v2)                            \
    X(cuCtxCreate_v2) X(cuCtxCreate_v3) X(cuCtxCreate_v4) X(cuCtxDestroy_v2)                  \
    X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxPushCurrent_v2) X(cuCtxPopCurrent_v2)        \
    X(cuCtxGetDevice) X(cuCtxSynchronize) X(cuCtxGetApiVersion) X(cuCtxGetFlags)              \
    X(cuCtxGetStreamPriorityRange)                                                            \
    X(cuMemAlloc_v2) X(cuMemAllocManaged) X(cuMemAllocPitch_v2) X(cuMemFree_v2)               \
    X(cuMemGetInfo_v2) X(cuMemGetAddressRange_v2) X(cuMemcpyHtoD_v2) X(cuMemcpyDtoH_v2)       \
    X(cuMemcpyDtoD_v2) X(cuMemsetD8_v2) X(cuMemsetD32_v2) X(cuMemHostAlloc)                   \
    X(cuMemAllocHost_v2) X(cuMemFreeHost) X(cuMemcpyHtoDAsync_v2) X(cuMemcpyDtoHAsync_v2)     \
    X(cuMemcpyDtoDAsync_v2) X(cuMemsetD8Async) X(cuMemsetD32Async)                           \
    X(cuModuleLoad) X(cuModuleLoadData) X(cuModuleLoadDataEx) X(cuModuleGetFunction)          \
    X(cuModuleUnload) X(cuStreamCreate) X(cuStreamCreateWithPriority) X(cuStreamDestroy_v2)   \
    X(cuStreamSynchronize) X(cuStreamQuery) X(cuStreamWaitEvent) X(cuEventCreate)             \
    X(cuEventRecord) X(cuEventQuery) X(cuEventSynchronize) X(cuEventElapsedTime)              \
    X(cuEventElapsedTime_v2) X(cuEventDestroy_v2) X(cuLaunchKernel) X(cuLaunchKernelEx)       \
    X(cuGetErrorName) X(cuGetErrorString) X(cuGetProcAddress) X(cuGetProcAddress_v2)

static const struct { const char *name; void *fn; } g_exports[] = {
#define SC_EXP(f) {#f, (void *)f},
    SC_EXPORTS(SC_EXP)
#undef SC_EXP
};

/* What a base name means from which CUDA version on, as the real driver maps it. */
static const struct { const char *base, *name; int since; } g_versioned[] = {
    {"cuDeviceTotalMem", "cuDeviceTotalMem_v2", 3020},
    {"cuCtxCreate", "cuCtxCreate_v2", 3020},
    {"cuMemGetInfo", "cuMemGetInfo_v2", 3020},
    {"cuMemAlloc", "cuMemAlloc_v2", 3020},
    {"cuMemAllocPitch", "cuMemAllocPitch_v2", 3020},
    {"cuMemFree", "cuMemFree_v2", 3020},
    {"cuMemGetAddressRange", "cuMemGetAddressRange_v2", 3020},
    {"cuMemAllocHost", "cuMemAllocHost_v2", 3020},
    {"cuMemcpyHtoD", "cuMemcpyHtoD_v2", 3020},
    {"cuMemcpyDtoH", "cuMemcpyDtoH_v2", 3020},
    {"cuMemcpyDtoD", "cuMemcpyDtoD_v2", 3020},
    {"cuMemsetD8", "cuMemsetD8_v2", 3020},
    {"cuMemsetD32", "cuMemsetD32_v2", 3020},
    {"cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2", 3020},
    {"cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync_v2", 3020},
    {"cuMemcpyDtoDAsync", "cuMemcpyDtoDAsync_v2", 3020},
    {"cuCtxDestroy", "cuCtxDestroy_v2", 4000},
    {"cuCtxPopCurrent", "cuCtxPopCurrent_v2", 4000},
    {"cuCtxPushCurrent", "cuCtxPushCurrent_v2", 4000},
    {"cuStreamDestroy", "cuStreamDestroy_v2", 4000},
    {"cuEventDestroy", "cuEventDestroy_v2", 4000},
    {"cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2", 11000},
    {"cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset_v2", 11000},
    {"cuDevicePrimaryCtxSetFlags", "cuDevicePrimaryCtxSetFlags_v2", 11000},
    {"cuDeviceGetUuid", "cuDeviceGetUuid_v2", 11040},
    {"cuEventElapsedTime", "cuEventElapsedTime_v2", 12080},
    {"cuGetProcAddress", "cuGetProcAddress_v2", 12000},
};

static void *find_export(const char *name)
{
    for (size_t i = 0; i < sizeof g_exports / sizeof g_exports[0]; i++)
        if (strcmp(g_exports[i].name, name) == 0)
            return g_exports[i].fn;
    return NULL;
}

CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                     cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
    (void)flags;  /* per-thread-stream variants are the same functions here */
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    const char *name = symbol;
    int too_old = 0;
    for (size_t i = 0; i < sizeof g_versioned / sizeof g_versioned[0]; i++) {
        if (strcmp(g_versioned[i].base, symbol) == 0) {
            too_old = cudaVersion < g_versioned[i].since;
            name = too_old ? symbol : g_versioned[i].name;
        }
    }
    *pfn = find_export(name);
    if (symbolStatus)
        *symbolStatus = *pfn ? CU_GET_PROC_ADDRESS_SUCCESS
                      : too_old ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                      : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                  cuuint64_t flags)
{
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}
