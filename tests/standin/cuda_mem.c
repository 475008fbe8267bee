/* Stand-in libcuda.so.1: device memory. Nothing backs it: pointers are handed out from a
 * per-process address counter, so a 16 GiB allocation costs nothing, and copies only
 * check that the range lies inside an allocation. What is allocated is counted in the
 * device's state file, which is what makes the device fill up across processes. */
#define _GNU_SOURCE
#include <cuda.h>
#include "standin.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define SC_ADDR_BASE 0x7f0000000000ULL
#define SC_ADDR_ALIGN (2ULL << 20)
#define SC_PITCH_ALIGN 512

typedef struct {
    CUdeviceptr ptr;
    size_t size;
    struct CUctx_st *ctx;
    void *host;  /* pinned host memory: real host memory, not on the device */
} sc_alloc;

static pthread_mutex_t g_mem_mu = PTHREAD_MUTEX_INITIALIZER;
static sc_alloc *g_allocs;
static size_t g_nalloc, g_cap;
static CUdeviceptr g_next = SC_ADDR_BASE;

static int table_add(sc_alloc a)
{
    if (g_nalloc == g_cap) {
        size_t cap = g_cap ? g_cap * 2 : 256;
        sc_alloc *n = realloc(g_allocs, cap * sizeof *n);
        if (!n)
            return -1;
        g_allocs = n;
        g_cap = cap;
    }
    g_allocs[g_nalloc++] = a;
    return 0;
}

/* Newest first: frees tend to come in reverse order. */
static sc_alloc *find_exact(CUdeviceptr ptr, int host)
{
    for (size_t i = g_nalloc; i-- > 0;)
        if (g_allocs[i].ptr == ptr && (g_allocs[i].host != NULL) == host)
            return &g_allocs[i];
    return NULL;
}

static sc_alloc *find_range(CUdeviceptr ptr, size_t n)
{
    for (size_t i = g_nalloc; i-- > 0;) {
        sc_alloc *a = &g_allocs[i];
        if (!a->host && ptr >= a->ptr && ptr - a->ptr < a->size && n <= a->size - (ptr - a->ptr))
            return a;
    }
    return NULL;
}

static void table_remove(sc_alloc *a)
{
    *a = g_allocs[--g_nalloc];
}

static CUresult dev_alloc(CUdeviceptr *dptr, size_t bytes)
{
    struct CUctx_st *c;
    CUresult rc = sc_current(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!dptr || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    const si_device *d = sc_device(c->dev);
    int got = si_mem_add(d, bytes);
    if (got != 0)
        return got == -1 ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_UNKNOWN;
    pthread_mutex_lock(&g_mem_mu);
    sc_alloc a = {g_next, bytes, c, NULL};
    if (table_add(a) == 0) {
        g_next += (bytes + SC_ADDR_ALIGN - 1) / SC_ADDR_ALIGN * SC_ADDR_ALIGN;
        *dptr = a.ptr;
    } else {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&g_mem_mu);
    if (rc != CUDA_SUCCESS)
        si_mem_sub(d, bytes);
    return rc;
}

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    return dev_alloc(dptr, bytesize);
}

CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    return dev_alloc(dptr, bytesize);
}

CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                    size_t Height, unsigned int ElementSizeBytes)
{
    if (!pPitch || !WidthInBytes || !Height ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t pitch = (WidthInBytes + SC_PITCH_ALIGN - 1) / SC_PITCH_ALIGN * SC_PITCH_ALIGN;
    if (Height > SIZE_MAX / pitch)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = dev_alloc(dptr, pitch * Height);
    if (rc == CUDA_SUCCESS)
        *pPitch = pitch;
    return rc;
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr)
{
    if (!sc_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (dptr == 0)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&g_mem_mu);
    sc_alloc *a = find_exact(dptr, 0), copy = {0, 0, NULL, NULL};
    if (a) {
        copy = *a;
        table_remove(a);
    }
    pthread_mutex_unlock(&g_mem_mu);
    if (!copy.ptr)
        return CUDA_ERROR_INVALID_VALUE;
    si_mem_sub(sc_device(copy.ctx->dev), copy.size);
    return CUDA_SUCCESS;
}

void sc_mem_drop_ctx(struct CUctx_st *ctx)
{
    uint64_t bytes = 0;
    pthread_mutex_lock(&g_mem_mu);
    for (size_t i = g_nalloc; i-- > 0;) {
        sc_alloc *a = &g_allocs[i];
        if (a->ctx != ctx)
            continue;
        if (a->host)
            free(a->host);
        else
            bytes += a->size;
        table_remove(a);
    }
    pthread_mutex_unlock(&g_mem_mu);
    if (bytes)
        si_mem_sub(sc_device(ctx->dev), bytes);
}

CUresult CUDAAPI cuMemGetInfo_v2(size_t *pfree, size_t *total)
{
    struct CUctx_st *c;
    CUresult rc = sc_current(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pfree || !total)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t t, used, free_bytes;
    si_mem_view(sc_device(c->dev), &t, &used, &free_bytes);  /* a cgroup's limit, if any */
    *total = t;
    *pfree = free_bytes;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    if (!sc_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&g_mem_mu);
    sc_alloc *a = find_range(dptr, 0);
    if (a && pbase)
        *pbase = a->ptr;
    if (a && psize)
        *psize = a->size;
    pthread_mutex_unlock(&g_mem_mu);
    return a ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/* A copy or set touching [ptr, ptr+n) needs a context and an allocation holding it. */
static CUresult check_range(CUdeviceptr ptr, size_t n)
{
    struct CUctx_st *c;
    CUresult rc = sc_current(&c);
    if (rc != CUDA_SUCCESS || n == 0)
        return rc;
    pthread_mutex_lock(&g_mem_mu);
    sc_alloc *a = find_range(ptr, n);
    pthread_mutex_unlock(&g_mem_mu);
    return a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    if (!srcHost && ByteCount)
        return CUDA_ERROR_INVALID_VALUE;
    return check_range(dstDevice, ByteCount);
}

/* Device memory holds nothing, so it reads back as zeros. */
CUresult CUDAAPI cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    if (!dstHost && ByteCount)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = check_range(srcDevice, ByteCount);
    if (rc == CUDA_SUCCESS && ByteCount)
        memset(dstHost, 0, ByteCount);
    return rc;
}

CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
    CUresult rc = check_range(srcDevice, ByteCount);
    return rc == CUDA_SUCCESS ? check_range(dstDevice, ByteCount) : rc;
}

CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    (void)uc;
    return check_range(dstDevice, N);
}

CUresult CUDAAPI cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
    (void)ui;
    if (N > SIZE_MAX / 4)
        return CUDA_ERROR_INVALID_VALUE;
    return check_range(dstDevice, N * 4);
}

/* ---- pinned host memory: plain host memory owned by the context ------------------- */

CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    struct CUctx_st *c;
    CUresult rc = sc_current(&c);
    (void)Flags;
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pp || !bytesize)
        return CUDA_ERROR_INVALID_VALUE;
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytesize) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_mem_mu);
    sc_alloc a = {(CUdeviceptr)(uintptr_t)p, bytesize, c, p};
    rc = table_add(a) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_unlock(&g_mem_mu);
    if (rc != CUDA_SUCCESS)
        free(p);
    else
        *pp = p;
    return rc;
}

CUresult CUDAAPI cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    return cuMemHostAlloc(pp, bytesize, 0);
}

CUresult CUDAAPI cuMemFreeHost(void *p)
{
    if (!sc_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&g_mem_mu);
    sc_alloc *a = p ? find_exact((CUdeviceptr)(uintptr_t)p, 1) : NULL;
    if (a)
        table_remove(a);
    pthread_mutex_unlock(&g_mem_mu);
    if (!a)
        return CUDA_ERROR_INVALID_VALUE;
    free(p);
    return CUDA_SUCCESS;
}

/* ---- asynchronous copies and sets: as immediate as the synchronous ones ----------- */

CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost,
                                      size_t ByteCount, CUstream hStream)
{
    (void)hStream;
    return cuMemcpyHtoD_v2(dstDevice, srcHost, ByteCount);
}

CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                      CUstream hStream)
{
    (void)hStream;
    return cuMemcpyDtoH_v2(dstHost, srcDevice, ByteCount);
}

CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                      size_t ByteCount, CUstream hStream)
{
    (void)hStream;
    return cuMemcpyDtoD_v2(dstDevice, srcDevice, ByteCount);
}

CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                                 CUstream hStream)
{
    (void)hStream;
    return cuMemsetD8_v2(dstDevice, uc, N);
}

CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N,
                                  CUstream hStream)
{
    (void)hStream;
    return cuMemsetD32_v2(dstDevice, ui, N);
}
