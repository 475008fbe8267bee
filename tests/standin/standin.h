/* gpu-share stand-in NVIDIA driver: what libcuda.so.1 and libnvidia-ml.so.1 share.
 *
 * Both libraries carry their own copy of devices.c and state.c. They agree without
 * talking to each other: the device table comes from the same env/config, the driver
 * process id is a hash of facts both can read, and everything cross-process lives in
 * one state file per device, guarded by flock. See README.md for the contract. */
#ifndef GPU_SHARE_STANDIN_H
#define GPU_SHARE_STANDIN_H

#include <stddef.h>
#include <stdint.h>

#define SI_MAX_DEV 16
#define SI_UUID_LEN 96
#define SI_DEFAULT_SMS 108
#define SI_DRIVER_CUDA 12090
#define SI_NAME "gpu-share stand-in"
#define SI_PCI_BUS(d) (0x10 + (d)->cfg_index) /* same bus on both APIs, whatever is visible */
#define SI_CGROUP_LEN 1024 /* longest cgroup path (with its NUL) that limits can name */
#define SI_NO_LIMIT UINT64_MAX /* NVML_DEVICE_MEMORY_LIMIT_MAX: no hard limit */

typedef struct {
    char uuid[SI_UUID_LEN];
    uint64_t mem_bytes;
    int sms;
    int cfg_index; /* position in the configured table: stable PCI bus, minor number */
} si_device;

typedef struct {
    uint32_t id;         /* driver process id (what NVML reports as pid) */
    uint64_t used_bytes; /* its allocations on the device, plus context memory */
    unsigned util;       /* percent of the device it kept busy in the asked window */
} si_proc;

/* Devices present in this process (the container's view), in NVML order. */
int si_present(const si_device **devs);
/* CUDA ordinals: indexes into si_present's list after CUDA_VISIBLE_DEVICES. */
int si_cuda_order(const int **nvml_index);

uint64_t si_now_us(void); /* CLOCK_REALTIME, like NVML's sample timestamps */
void si_sleep_until(uint64_t t_us);
uint64_t si_kernel_us(void);
uint64_t si_context_bytes(void); /* memory a context takes on its device */
uint64_t si_mix64(uint64_t x);
void si_uuid_bytes(const char *uuid, unsigned char out[16]);
void si_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Cross-process state of one device. Return 0 on success, -1 when the device is full
 * (or the record table is, or the caller's cgroup is at its hard limit on the device),
 * -2 when the state is unusable. */
int si_set_context(const si_device *d, int on);
int si_mem_add(const si_device *d, uint64_t bytes);
void si_mem_sub(const si_device *d, uint64_t bytes);
uint64_t si_launch(const si_device *d, uint64_t dur_us); /* returns the kernel's end */
/* Processes with a context on d (at most max written, the count returned), util being
 * their busy percent in [t0, t1) µs; *used is the device's memory in use, *dev_util its
 * busy percent over the last second. */
int si_query(const si_device *d, uint64_t t0, uint64_t t1, si_proc *out, int max,
             uint64_t *used, unsigned *dev_util);
/* Device memory as the calling process sees it: the device's, or where its cgroup has a
 * hard limit on d, total = that limit and used = what the cgroup's processes use (free
 * also no more than the device has left). */
void si_mem_view(const si_device *d, uint64_t *total, uint64_t *used, uint64_t *free_bytes);

/* Per-cgroup memory limits (NVML's nvmlDevice{Set,Get}MemoryLimits_v1), kept with the
 * device's state. A cgroup is named by its path as NVIDIA's hook passes it:
 * "/sys/fs/cgroup" joined with the "0::" line of /proc/<pid>/cgroup, cleaned. */
int si_limits_supported(void); /* 0 when GPU_SHARE_STANDIN_MEMORY_LIMITS=0 */
/* Go's filepath.Clean of an absolute path into out (n bytes); -1 when in is not
 * absolute or the result does not fit. */
int si_clean_path(const char *in, char *out, size_t n);
/* soft 0 and hard SI_NO_LIMIT clear. 0, -1 when the table is full, -2 state unusable. */
int si_limit_set(const si_device *d, const char *cgroup, uint64_t soft, uint64_t hard);
/* 0 with the limits and what the cgroup's processes use on d, 1 when it has none, -2. */
int si_limit_get(const si_device *d, const char *cgroup, uint64_t *soft, uint64_t *hard,
                 uint64_t *used);

#ifdef __cuda_cuda_h__
/* Internal to libcuda.so.1 (cuda.c, cuda_mem.c, cuda_exec.c). cuda.h renames these to
 * their _v2; the driver exports the old names too. */
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuDevicePrimaryCtxSetFlags
#undef cuGetProcAddress
CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev);
CUresult CUDAAPI cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags);
CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                  cuuint64_t flags);

#define SC_MAGIC_CTX 0x43545831u

struct CUctx_st {
    uint32_t magic;
    CUdevice dev;        /* CUDA ordinal */
    int primary;
    int live;
    unsigned flags;
    uint64_t busy_until; /* end of this context's last kernel, µs */
};

int sc_initialized(void);
const si_device *sc_device(CUdevice ord); /* NULL when the ordinal is invalid */
CUresult sc_current(struct CUctx_st **ctx);
void sc_mem_drop_ctx(struct CUctx_st *ctx); /* free what a dying context owned */
#endif

#endif
