/* gpu-workload: what a framework does with the driver, reduced to what the tests watch.
 * It dlopen()s libcuda.so.1 by name (so LD_LIBRARY_PATH picks the driver, and an
 * interposer such as HAMi-core sees the same lookups as from a real framework), gets
 * cuInit and cuGetProcAddress with dlsym and everything else through cuGetProcAddress,
 * allocates chunk by chunk until refused (or a target), launches kernels back to back,
 * frees, and prints one JSON object on stdout. Diagnostics go to stderr.
 * The kernel is real PTX (below), so the same program runs on an NVIDIA driver, which
 * JIT-compiles it for the GPU at hand; the stand-in driver accepts any image. */
#define _GNU_SOURCE
#include <cuda.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROC_VERSION 12090

typedef struct {
    int device;
    long chunk_mib, target_mib, max_chunks, grid, spin;
    double launch_s, hold_s;
} opts_t;

typedef struct {
    long long allocated_mib, total_mib, free_mib;
    long chunks, launches;
    double launch_elapsed;
    int refused, refused_code, free_errors, via_proc_address;
    const char *refused_error, *launch_error, *init_error;
} result_t;

static struct {
    __typeof__(cuInit) *Init;
    __typeof__(cuGetProcAddress_v2) *GetProcAddress;
    __typeof__(cuGetErrorName) *GetErrorName;
    __typeof__(cuDeviceGet) *DeviceGet;
    __typeof__(cuDevicePrimaryCtxRetain) *PrimaryCtxRetain;
    __typeof__(cuDevicePrimaryCtxRelease_v2) *PrimaryCtxRelease;
    __typeof__(cuCtxSetCurrent) *CtxSetCurrent;
    __typeof__(cuMemGetInfo_v2) *MemGetInfo;
    __typeof__(cuMemAlloc_v2) *MemAlloc;
    __typeof__(cuMemFree_v2) *MemFree;
    __typeof__(cuMemsetD8_v2) *MemsetD8;
    __typeof__(cuModuleLoadData) *ModuleLoadData;
    __typeof__(cuModuleGetFunction) *ModuleGetFunction;
    __typeof__(cuModuleUnload) *ModuleUnload;
    __typeof__(cuLaunchKernel) *LaunchKernel;
    __typeof__(cuStreamSynchronize) *StreamSynchronize;
} cu;

/* Base name for cuGetProcAddress, versioned symbol for the dlsym fallback. */
static const struct { const char *base, *symbol; void **slot; } g_syms[] = {
    {"cuDeviceGet", "cuDeviceGet", (void **)&cu.DeviceGet},
    {"cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", (void **)&cu.PrimaryCtxRetain},
    {"cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2", (void **)&cu.PrimaryCtxRelease},
    {"cuCtxSetCurrent", "cuCtxSetCurrent", (void **)&cu.CtxSetCurrent},
    {"cuMemGetInfo", "cuMemGetInfo_v2", (void **)&cu.MemGetInfo},
    {"cuMemAlloc", "cuMemAlloc_v2", (void **)&cu.MemAlloc},
    {"cuMemFree", "cuMemFree_v2", (void **)&cu.MemFree},
    {"cuMemsetD8", "cuMemsetD8_v2", (void **)&cu.MemsetD8},
    {"cuModuleLoadData", "cuModuleLoadData", (void **)&cu.ModuleLoadData},
    {"cuModuleGetFunction", "cuModuleGetFunction", (void **)&cu.ModuleGetFunction},
    {"cuModuleUnload", "cuModuleUnload", (void **)&cu.ModuleUnload},
    {"cuLaunchKernel", "cuLaunchKernel", (void **)&cu.LaunchKernel},
    {"cuStreamSynchronize", "cuStreamSynchronize", (void **)&cu.StreamSynchronize},
};

/* The kernel, in PTX as any CUDA 11+ driver JIT-compiles it for sm_70 and later (H100's
 * sm_90 included): spin(out, iters). Each thread steps a linear congruential generator
 * `iters` times from its global index; thread 0 of block 0 (and any thread whose value
 * happens to hit a constant) stores its value to *out when out is not 0. Every thread's
 * result decides whether it stores, so the compiler keeps every thread's loop. */
static const char g_spin_ptx[] =
    ".version 7.0\n"
    ".target sm_70\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry spin(\n"
    "    .param .u64 spin_out,\n"
    "    .param .u32 spin_iters\n"
    ")\n"
    "{\n"
    "    .reg .pred %p<6>;\n"
    "    .reg .b32 %r<8>;\n"
    "    .reg .b64 %rd<3>;\n"
    "\n"
    "    ld.param.u64 %rd1, [spin_out];\n"
    "    ld.param.u32 %r1, [spin_iters];\n"
    "    mov.u32 %r2, %tid.x;\n"
    "    mov.u32 %r3, %ctaid.x;\n"
    "    mov.u32 %r4, %ntid.x;\n"
    "    mad.lo.u32 %r5, %r3, %r4, %r2;\n"
    "    mov.u32 %r6, 0;\n"
    "    setp.eq.u32 %p1, %r1, 0;\n"
    "    @%p1 bra $L_done;\n"
    "$L_loop:\n"
    "    mad.lo.u32 %r5, %r5, 1664525, 1013904223;\n"
    "    add.u32 %r6, %r6, 1;\n"
    "    setp.lt.u32 %p1, %r6, %r1;\n"
    "    @%p1 bra $L_loop;\n"
    "$L_done:\n"
    "    or.b32 %r7, %r2, %r3;\n"
    "    setp.eq.u32 %p2, %r7, 0;\n"
    "    setp.eq.u32 %p3, %r5, 1592090350;\n"
    "    or.pred %p4, %p2, %p3;\n"
    "    setp.ne.u64 %p5, %rd1, 0;\n"
    "    and.pred %p4, %p4, %p5;\n"
    "    @!%p4 bra $L_end;\n"
    "    cvta.to.global.u64 %rd2, %rd1;\n"
    "    st.global.u32 [%rd2], %r5;\n"
    "$L_end:\n"
    "    ret;\n"
    "}\n";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_s(double s)
{
    double end = now_s() + s, left;
    while ((left = end - now_s()) > 0) {
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

static const char *err_name(CUresult rc)
{
    static char buf[8][32];
    static int next;
    const char *s = NULL;
    if (cu.GetErrorName && cu.GetErrorName(rc, &s) == CUDA_SUCCESS && s)
        return s;
    char *b = buf[next++ % 8];
    snprintf(b, sizeof buf[0], "CUresult(%d)", (int)rc);
    return b;
}

/* ---- output ----------------------------------------------------------------------- */

static void json_str(const char *s)
{
    if (!s) {
        fputs("null", stdout);
        return;
    }
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", *s);
        else
            putchar(*s);
    }
    putchar('"');
}

static void print_result(const opts_t *o, const result_t *r)
{
    double rate = r->launch_elapsed > 0 ? (double)r->launches / r->launch_elapsed : 0;
    printf("{\"device\":%d,\"chunk_mib\":%ld,\"allocated_mib\":%lld,\"chunks\":%ld,"
           "\"refused\":%s,\"refused_error\":",
           o->device, o->chunk_mib, r->allocated_mib, r->chunks, r->refused ? "true" : "false");
    json_str(r->refused_error);
    printf(",\"refused_code\":");
    if (r->refused)
        printf("%d", r->refused_code);
    else
        fputs("null", stdout);
    printf(",\"meminfo_total_mib\":%lld,\"meminfo_free_mib_before\":%lld,\"launches\":%ld,"
           "\"launch_seconds\":%.3f,\"launches_per_s\":%.1f,\"grid\":%ld,\"launch_error\":",
           r->total_mib, r->free_mib, r->launches, r->launch_elapsed, rate, o->grid);
    json_str(r->launch_error);
    printf(",\"free_errors\":%d,\"proc_address\":%s,\"init_error\":", r->free_errors,
           r->via_proc_address ? "true" : "false");
    json_str(r->init_error);
    printf("}\n");
    fflush(stdout);
}

static int fail_init(const opts_t *o, result_t *r, const char *what)
{
    r->init_error = what;
    print_result(o, r);
    return 3;
}

/* ---- options ---------------------------------------------------------------------- */

static void usage(void)
{
    fputs("usage: gpu-workload [--device N] [--chunk-mib M] [--target-mib T] [--max-chunks K]\n"
          "                    [--launch-seconds S] [--hold-seconds H] [--grid G] [--spin N]\n",
          stderr);
    exit(2);
}

static double num(const char *v, double lo)
{
    char *end;
    double d = v ? strtod(v, &end) : 0;
    if (!v || end == v || *end || d < lo)
        usage();
    return d;
}

static void parse(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){0, 256, 0, 100000, 16384, 2000, 0, 0};
    for (int i = 1; i < argc; i++) {
        char *a = argv[i], *v = strchr(a, '=');
        if (strncmp(a, "--", 2) != 0)
            usage();
        if (v)
            *v++ = '\0';
        else
            v = i + 1 < argc ? argv[++i] : NULL;
        if (!strcmp(a, "--device")) o->device = (int)num(v, 0);
        else if (!strcmp(a, "--chunk-mib")) o->chunk_mib = (long)num(v, 1);
        else if (!strcmp(a, "--target-mib")) o->target_mib = (long)num(v, 0);
        else if (!strcmp(a, "--max-chunks")) o->max_chunks = (long)num(v, 0);
        else if (!strcmp(a, "--launch-seconds")) o->launch_s = num(v, 0);
        else if (!strcmp(a, "--hold-seconds")) o->hold_s = num(v, 0);
        else if (!strcmp(a, "--grid")) o->grid = (long)num(v, 1);
        else if (!strcmp(a, "--spin")) o->spin = (long)num(v, 0);  /* a .u32 parameter */
        else usage();
    }
    if (o->spin > 0xffffffffL)
        usage();
}

/* ---- the run ---------------------------------------------------------------------- */

static const char *resolve(void *lib, result_t *r)
{
    r->via_proc_address = cu.GetProcAddress != NULL;
    for (size_t i = 0; i < sizeof g_syms / sizeof g_syms[0]; i++) {
        CUdriverProcAddressQueryResult st;
        *g_syms[i].slot = NULL;
        if (cu.GetProcAddress &&
            cu.GetProcAddress(g_syms[i].base, g_syms[i].slot, PROC_VERSION, 0, &st) != CUDA_SUCCESS)
            *g_syms[i].slot = NULL;
        if (!*g_syms[i].slot) {
            r->via_proc_address = 0;
            fprintf(stderr, "gpu-workload: cuGetProcAddress(%s) failed, using dlsym\n",
                    g_syms[i].base);
            *g_syms[i].slot = dlsym(lib, g_syms[i].symbol);
        }
        if (!*g_syms[i].slot)
            return g_syms[i].symbol;
    }
    return NULL;
}

static CUdeviceptr *allocate(const opts_t *o, result_t *r)
{
    CUdeviceptr *ptrs = calloc((size_t)o->max_chunks + 1, sizeof *ptrs);
    size_t bytes = (size_t)o->chunk_mib << 20;
    while (ptrs && r->chunks < o->max_chunks &&
           (o->target_mib == 0 || r->allocated_mib < o->target_mib)) {
        CUresult rc = cu.MemAlloc(&ptrs[r->chunks], bytes);
        if (rc != CUDA_SUCCESS) {
            r->refused = 1;
            r->refused_code = (int)rc;
            r->refused_error = err_name(rc);
            break;
        }
        if ((rc = cu.MemsetD8(ptrs[r->chunks], 0, bytes)) != CUDA_SUCCESS)
            fprintf(stderr, "gpu-workload: cuMemsetD8: %s\n", err_name(rc));
        r->chunks++;
        r->allocated_mib += o->chunk_mib;
    }
    return ptrs;
}

/* out: where the kernel stores its word (0: nowhere). */
static void launch(const opts_t *o, result_t *r, CUdeviceptr out)
{
    CUmodule mod = NULL;
    CUfunction fn;
    unsigned int iters = (unsigned int)o->spin;
    CUresult rc = cu.ModuleLoadData(&mod, g_spin_ptx);
    if (rc == CUDA_SUCCESS)
        rc = cu.ModuleGetFunction(&fn, mod, "spin");
    double t0 = now_s();
    void *params[] = {&out, &iters};
    while (rc == CUDA_SUCCESS && now_s() - t0 < o->launch_s) {
        rc = cu.LaunchKernel(fn, (unsigned)o->grid, 1, 1, 256, 1, 1, 0, NULL, params, NULL);
        if (rc == CUDA_SUCCESS)
            rc = cu.StreamSynchronize(NULL);
        r->launches += rc == CUDA_SUCCESS;
    }
    r->launch_elapsed = now_s() - t0;
    if (mod)
        cu.ModuleUnload(mod);
    if (rc != CUDA_SUCCESS) {
        r->launch_error = err_name(rc);
        fprintf(stderr, "gpu-workload: launch: %s\n", r->launch_error);
    }
}

int main(int argc, char **argv)
{
    opts_t o;
    result_t r = {0};
    static char why[512];
    parse(argc, argv, &o);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(why, sizeof why, "dlopen: %s", dlerror());
        return fail_init(&o, &r, why);
    }
    cu.Init = (__typeof__(cu.Init))dlsym(lib, "cuInit");
    cu.GetErrorName = (__typeof__(cu.GetErrorName))dlsym(lib, "cuGetErrorName");
    cu.GetProcAddress = (__typeof__(cu.GetProcAddress))dlsym(lib, "cuGetProcAddress_v2");
    if (!cu.Init)
        return fail_init(&o, &r, "dlsym: cuInit");
    CUresult rc = cu.Init(0);
    if (rc != CUDA_SUCCESS)
        return fail_init(&o, &r, err_name(rc));
    const char *missing = resolve(lib, &r);
    if (missing) {
        snprintf(why, sizeof why, "dlsym: %s", missing);
        return fail_init(&o, &r, why);
    }
    CUdevice dev;
    CUcontext ctx;
    if ((rc = cu.DeviceGet(&dev, o.device)) != CUDA_SUCCESS ||
        (rc = cu.PrimaryCtxRetain(&ctx, dev)) != CUDA_SUCCESS ||
        (rc = cu.CtxSetCurrent(ctx)) != CUDA_SUCCESS)
        return fail_init(&o, &r, err_name(rc));
    size_t mfree = 0, mtotal = 0;
    if ((rc = cu.MemGetInfo(&mfree, &mtotal)) != CUDA_SUCCESS)
        fprintf(stderr, "gpu-workload: cuMemGetInfo: %s\n", err_name(rc));
    r.total_mib = (long long)(mtotal >> 20);
    r.free_mib = (long long)(mfree >> 20);

    CUdeviceptr *ptrs = allocate(&o, &r);
    if (o.launch_s > 0)
        launch(&o, &r, r.chunks ? ptrs[0] : 0);
    if (o.hold_s > 0) {
        /* Not JSON: a runner waiting for the allocations to be in place reads this line. */
        printf("holding %lld MiB\n", r.allocated_mib);
        fflush(stdout);
    }
    sleep_s(o.hold_s);
    for (long i = r.chunks; i-- > 0;) {
        if ((rc = cu.MemFree(ptrs[i])) != CUDA_SUCCESS) {
            r.free_errors++;
            fprintf(stderr, "gpu-workload: cuMemFree: %s\n", err_name(rc));
        }
    }
    free(ptrs);
    cu.PrimaryCtxRelease(dev);
    print_result(&o, &r);
    return 0;
}
