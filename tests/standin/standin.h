/* gpu-share stand-in NVIDIA driver: what libcuda.so.1 and libnvidia-ml.so.1 share.
 *
 * Both libraries carry their own copy of devices.c and state.c. They agree without
 * talking to each other: the device table comes from the same env/config, the driver
 * process id is a hash of facts both can read, and everything cross-process lives in
 * one state file per device, guarded by flock. See README.md for the contract. */
#ifndef GPU_SHARE_STANDIN_H
#define GPU_SHARE_STANDIN_H

#include <stdint.h>

#define SI_MAX_DEV 16
#define SI_UUID_LEN 96
#define SI_DEFAULT_SMS 108
#define SI_DRIVER_CUDA 12090
#define SI_NAME "gpu-share stand-in"
#define SI_PCI_BUS(d) (0x10 + (d)->cfg_index) /* same bus on both APIs, whatever is visible */

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
 * (or the record table is), -2 when the state is unusable. */
int si_set_context(const si_device *d, int on);
int si_mem_add(const si_device *d, uint64_t bytes);
void si_mem_sub(const si_device *d, uint64_t bytes);
uint64_t si_launch(const si_device *d, uint64_t dur_us); /* returns the kernel's end */
/* Processes with a context on d (at most max written, the count returned), util being
 * their busy percent in [t0, t1) µs; *used is the device's memory in use, *dev_util its
 * busy percent over the last second. */
int si_query(const si_device *d, uint64_t t0, uint64_t t1, si_proc *out, int max,
             uint64_t *used, unsigned *dev_util);

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
