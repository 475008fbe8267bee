/* Stand-in libcuda.so.1: initialisation, devices and contexts. Memory is in
 * cuda_mem.c; modules, streams, events, launches and symbol lookup in cuda_exec.c. */
#define _GNU_SOURCE
#include <cuda.h>
#include "standin.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SC_STACK_MAX 32

static int g_init;
static pthread_mutex_t g_ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_dev_ctx[SI_MAX_DEV];  /* live contexts per ordinal (an active primary is one) */
static struct CUctx_st g_primary[SI_MAX_DEV];
static int g_prim_refs[SI_MAX_DEV];
static unsigned g_prim_flags[SI_MAX_DEV];

static __thread struct CUctx_st *t_stack[SC_STACK_MAX];
static __thread int t_depth;

int sc_initialized(void) { return g_init; }

static int ordinal_count(void)
{
    const int *order;
    return si_cuda_order(&order);
}

const si_device *sc_device(CUdevice ord)
{
    const int *order;
    const si_device *devs;
    int n = si_cuda_order(&order);
    si_present(&devs);
    return ord >= 0 && ord < n ? &devs[order[ord]] : NULL;
}

#define NEED_INIT() do { if (!g_init) return CUDA_ERROR_NOT_INITIALIZED; } while (0)
#define NEED_DEV(ord) do { NEED_INIT(); if (!sc_device(ord)) return CUDA_ERROR_INVALID_DEVICE; } \
    while (0)

CUresult sc_current(struct CUctx_st **ctx)
{
    if (!g_init)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (t_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    *ctx = t_stack[t_depth - 1];
    return (*ctx)->live ? CUDA_SUCCESS : CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

static int valid_ctx(CUcontext ctx)
{
    return ctx && ctx->magic == SC_MAGIC_CTX && ctx->live;
}

/* The driver process appears on the device (NVML's process list) with its first
 * context there and leaves with its last. Called with g_ctx_mu held. */
static CUresult dev_ctx_inc(CUdevice ord)
{
    if (g_dev_ctx[ord] == 0 && si_set_context(sc_device(ord), 1) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    g_dev_ctx[ord]++;
    return CUDA_SUCCESS;
}

static void dev_ctx_dec(CUdevice ord)
{
    if (g_dev_ctx[ord] > 0 && --g_dev_ctx[ord] == 0)
        si_set_context(sc_device(ord), 0);
}

/* ---- init and devices ------------------------------------------------------------- */

CUresult CUDAAPI cuInit(unsigned int Flags)
{
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal_count() == 0)
        return CUDA_ERROR_NO_DEVICE;
    g_init = 1;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = SI_DRIVER_CUDA;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetCount(int *count)
{
    NEED_INIT();
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = ordinal_count();
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal)
{
    NEED_INIT();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sc_device(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev)
{
    NEED_DEV(dev);
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", SI_NAME);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    NEED_DEV(dev);
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    si_uuid_bytes(sc_device(dev)->uuid, (unsigned char *)uuid->bytes);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    return cuDeviceGetUuid_v2(uuid, dev);
}

CUresult CUDAAPI cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    NEED_DEV(dev);
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = sc_device(dev)->mem_bytes;
    return CUDA_SUCCESS;
}

/* An H100-like device (compute capability 9.0); attributes it has no use for are 0. */
static const int g_attr[CU_DEVICE_ATTRIBUTE_MAX] = {
    [CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK] = 1024,
    [CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X] = 1024,
    [CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y] = 1024,
    [CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z] = 64,
    [CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X] = 2147483647,
    [CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y] = 65535,
    [CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z] = 65535,
    [CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK] = 49152,
    [CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY] = 65536,
    [CU_DEVICE_ATTRIBUTE_WARP_SIZE] = 32,
    [CU_DEVICE_ATTRIBUTE_MAX_PITCH] = 2147483647,
    [CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK] = 65536,
    [CU_DEVICE_ATTRIBUTE_CLOCK_RATE] = 1980000,
    [CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT] = 512,
    [CU_DEVICE_ATTRIBUTE_GPU_OVERLAP] = 1,
    [CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY] = 1,
    [CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH] = 131072,
    [CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_WIDTH] = 131072,
    [CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_HEIGHT] = 65536,
    [CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT] = 512,
    [CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS] = 1,
    [CU_DEVICE_ATTRIBUTE_ECC_ENABLED] = 1,
    [CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE] = 2619000,
    [CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH] = 5120,
    [CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE] = 52428800,
    [CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR] = 2048,
    [CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT] = 3,
    [CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING] = 1,
    [CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT] = 32,
    [CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR] = 9,
    [CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR] = 0,
    [CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED] = 1,
    [CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED] = 1,
    [CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED] = 1,
    [CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR] = 233472,
    [CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR] = 65536,
    [CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY] = 1,
    [CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO] = 2,
    [CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS] = 1,
    [CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED] = 1,
    [CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM] = 1,
    [CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH] = 1,
    [CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN] = 232448,
    [CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED] = 1,
    [CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED] = 1,
    [CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED] = 1,
    [CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR] = 32,
    [CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE] = 32505856,
    [CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE] = 134213632,
    [CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK] = 1024,
    [CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED] = 1,
    [CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH] = 1,
    [CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT] = 4,
    [CU_DEVICE_ATTRIBUTE_NUMA_ID] = -1,
    [CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID] = -1,
};

CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    NEED_DEV(dev);
    if (!pi || (int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    const si_device *d = sc_device(dev);
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = d->sms; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *pi = SI_PCI_BUS(d); break;
    default: *pi = g_attr[attrib]; break;
    }
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
    NEED_DEV(dev);
    if (!pciBusId || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", SI_PCI_BUS(sc_device(dev)));
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetByPCIBusId(CUdevice *dev, const char *pciBusId)
{
    unsigned dom = 0, bus, slot, fn;
    NEED_INIT();
    if (!dev || !pciBusId)
        return CUDA_ERROR_INVALID_VALUE;
    if (sscanf(pciBusId, "%x:%x:%x.%x", &dom, &bus, &slot, &fn) != 4 &&
        sscanf(pciBusId, "%x:%x.%x", &bus, &slot, &fn) != 3)
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < ordinal_count(); i++) {
        if (dom == 0 && slot == 0 && fn == 0 && (int)bus == SI_PCI_BUS(sc_device(i))) {
            *dev = i;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_DEVICE;
}

CUresult CUDAAPI cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
    NEED_DEV(dev);
    NEED_DEV(peerDev);
    if (!canAccessPeer)
        return CUDA_ERROR_INVALID_VALUE;
    *canAccessPeer = dev != peerDev;
    return CUDA_SUCCESS;
}

/* ---- primary contexts ------------------------------------------------------------- */

static void prim_deactivate(CUdevice dev)
{
    g_primary[dev].live = 0;
    sc_mem_drop_ctx(&g_primary[dev]);
    dev_ctx_dec(dev);
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    NEED_DEV(dev);
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&g_ctx_mu);
    if (g_prim_refs[dev] == 0 && (rc = dev_ctx_inc(dev)) == CUDA_SUCCESS) {
        struct CUctx_st *c = &g_primary[dev];
        memset(c, 0, sizeof *c);
        c->magic = SC_MAGIC_CTX;
        c->dev = dev;
        c->primary = 1;
        c->live = 1;
        c->flags = g_prim_flags[dev];
    }
    if (rc == CUDA_SUCCESS) {
        g_prim_refs[dev]++;
        *pctx = &g_primary[dev];
    }
    pthread_mutex_unlock(&g_ctx_mu);
    return rc;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    NEED_DEV(dev);
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&g_ctx_mu);
    if (g_prim_refs[dev] == 0)
        rc = CUDA_ERROR_INVALID_CONTEXT;
    else if (--g_prim_refs[dev] == 0)
        prim_deactivate(dev);
    pthread_mutex_unlock(&g_ctx_mu);
    return rc;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return cuDevicePrimaryCtxRelease_v2(dev);
}

CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    NEED_DEV(dev);
    pthread_mutex_lock(&g_ctx_mu);
    if (g_prim_refs[dev] > 0) {
        g_prim_refs[dev] = 0;
        prim_deactivate(dev);
    }
    g_prim_flags[dev] = 0;
    pthread_mutex_unlock(&g_ctx_mu);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev)
{
    return cuDevicePrimaryCtxReset_v2(dev);
}

CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    NEED_DEV(dev);
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_ctx_mu);
    *flags = g_prim_flags[dev];
    *active = g_prim_refs[dev] > 0;
    pthread_mutex_unlock(&g_ctx_mu);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    NEED_DEV(dev);
    pthread_mutex_lock(&g_ctx_mu);
    g_prim_flags[dev] = flags;
    g_primary[dev].flags = flags;
    pthread_mutex_unlock(&g_ctx_mu);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags)
{
    return cuDevicePrimaryCtxSetFlags_v2(dev, flags);
}

/* ---- created contexts and the per-thread stack ------------------------------------ */

static CUresult ctx_create(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    NEED_DEV(dev);
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (t_depth == SC_STACK_MAX)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct CUctx_st *c = calloc(1, sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_ctx_mu);
    CUresult rc = dev_ctx_inc(dev);
    pthread_mutex_unlock(&g_ctx_mu);
    if (rc != CUDA_SUCCESS) {
        free(c);
        return rc;
    }
    c->magic = SC_MAGIC_CTX;
    c->dev = dev;
    c->live = 1;
    c->flags = flags;
    t_stack[t_depth++] = c;
    *pctx = c;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return ctx_create(pctx, flags, dev);
}

CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray,
                                int numParams, unsigned int flags, CUdevice dev)
{
    (void)paramsArray;
    (void)numParams;
    return ctx_create(pctx, flags, dev);
}

CUresult CUDAAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                                unsigned int flags, CUdevice dev)
{
    (void)ctxCreateParams;
    return ctx_create(pctx, flags, dev);
}

/* The context object is kept (dead) so stale handles on other threads fail cleanly. */
CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx)
{
    NEED_INIT();
    if (!valid_ctx(ctx) || ctx->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    for (int i = t_depth - 1; i >= 0; i--) {
        if (t_stack[i] == ctx) {
            memmove(&t_stack[i], &t_stack[i + 1], (size_t)(t_depth - i - 1) * sizeof t_stack[0]);
            t_depth--;
        }
    }
    pthread_mutex_lock(&g_ctx_mu);
    ctx->live = 0;
    sc_mem_drop_ctx(ctx);
    dev_ctx_dec(ctx->dev);
    pthread_mutex_unlock(&g_ctx_mu);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
    NEED_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = t_depth ? t_stack[t_depth - 1] : NULL;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
    NEED_INIT();
    if (!ctx) {
        if (t_depth)
            t_depth--;
        return CUDA_SUCCESS;
    }
    if (!valid_ctx(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (t_depth == 0)
        t_depth = 1;
    t_stack[t_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx)
{
    NEED_INIT();
    if (!valid_ctx(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (t_depth == SC_STACK_MAX)
        return CUDA_ERROR_OUT_OF_MEMORY;
    t_stack[t_depth++] = ctx;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext *pctx)
{
    NEED_INIT();
    if (t_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    t_depth--;
    if (pctx)
        *pctx = t_stack[t_depth];
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice *device)
{
    struct CUctx_st *c;
    CUresult rc = sc_current(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    *device = c->dev;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSynchronize(void)
{
    struct CUctx_st *c;
    CUresult rc = sc_current(&c);
    if (rc == CUDA_SUCCESS)
        si_sleep_until(c->busy_until);
    return rc;
}

CUresult CUDAAPI cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
    NEED_INIT();
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    if (ctx && !valid_ctx(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    *version = 3020;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetFlags(unsigned int *flags)
{
    struct CUctx_st *c;
    CUresult rc = sc_current(&c);
    if (rc == CUDA_SUCCESS && !flags)
        return CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        *flags = c->flags;
    return rc;
}

CUresult CUDAAPI cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    NEED_INIT();
    if (leastPriority)
        *leastPriority = 0;
    if (greatestPriority)
        *greatestPriority = -5;
    return CUDA_SUCCESS;
}
