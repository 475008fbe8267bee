/* Stand-in libnvidia-ml.so.1: the same devices as the CUDA side, and the processes,
 * memory and utilisation that every process's libcuda.so.1 wrote to the state files.
 * A process's pid here is its driver process id, as real NVML reports host pids that a
 * container cannot map to its own. The old unversioned entry points (v1 structs) are
 * exported too: HAMi-core calls them. */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>
#include "standin.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#define SN_DRIVER "615.00-standin"
#define SN_NVML "12.615.00-standin"
#define SN_MAX_PROCS 256

struct nvmlDevice_st { int index; };

static struct nvmlDevice_st g_handles[SI_MAX_DEV];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_refs;

/* The utilisation sample period (GPU_SHARE_STANDIN_SAMPLE_MS, default 100). */
static uint64_t sample_us(void)
{
    const char *v = getenv("GPU_SHARE_STANDIN_SAMPLE_MS");
    long ms = v ? atol(v) : 0;
    return (uint64_t)(ms > 0 ? ms : 100) * 1000;
}

static int initialized(void)
{
    pthread_mutex_lock(&g_mu);
    int on = g_refs > 0;
    pthread_mutex_unlock(&g_mu);
    return on;
}

/* The device behind a handle, or an error for the caller to return. */
static nvmlReturn_t dev_of(nvmlDevice_t h, const si_device **d)
{
    const si_device *devs;
    int n = si_present(&devs);
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (h < g_handles || h >= g_handles + n)
        return NVML_ERROR_INVALID_ARGUMENT;
    *d = &devs[h->index];
    return NVML_SUCCESS;
}

#define DEV_OR_RETURN(h, d)                  \
    const si_device *d;                      \
    do {                                     \
        nvmlReturn_t r_ = dev_of((h), &d);   \
        if (r_ != NVML_SUCCESS)              \
            return r_;                       \
    } while (0)

static nvmlReturn_t put_str(char *dst, unsigned int len, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) >= len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* ---- init, system ----------------------------------------------------------------- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    const si_device *devs;
    (void)flags;
    if (si_present(&devs) == 0)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < SI_MAX_DEV; i++)
        g_handles[i].index = i;
    g_refs++;
    pthread_mutex_unlock(&g_mu);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&g_mu);
    nvmlReturn_t rc = g_refs > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (g_refs > 0)
        g_refs--;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    case NVML_ERROR_OPERATING_SYSTEM: return "Operating System Error";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    return initialized() ? put_str(version, length, SN_DRIVER) : NVML_ERROR_UNINITIALIZED;
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    return put_str(version, length, SN_NVML);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = SI_DRIVER_CUDA;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* ---- device handles --------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    const si_device *devs;
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = (unsigned)si_present(&devs);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    const si_device *devs;
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= (unsigned)si_present(&devs))
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_handles[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    const si_device *devs;
    int n = si_present(&devs);
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < n; i++) {
        if (strcmp(devs[i].uuid, uuid) == 0) {
            *device = &g_handles[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* Accepts both "0000:10:00.0" and "00000000:10:00.0". */
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    const si_device *devs;
    unsigned dom, bus, slot, fn;
    int n = si_present(&devs);
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!pciBusId || !device || sscanf(pciBusId, "%x:%x:%x.%x", &dom, &bus, &slot, &fn) != 4)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < n; i++) {
        if (dom == 0 && slot == 0 && fn == 0 && (int)bus == SI_PCI_BUS(&devs[i])) {
            *device = &g_handles[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

/* ---- device facts ----------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    DEV_OR_RETURN(device, d);
    (void)d;
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)device->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    DEV_OR_RETURN(device, d);
    return put_str(uuid, length, d->uuid);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    DEV_OR_RETURN(device, d);
    (void)d;
    return put_str(name, length, SI_NAME);
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    DEV_OR_RETURN(device, d);
    if (!minorNumber)
        return NVML_ERROR_INVALID_ARGUMENT;
    *minorNumber = (unsigned)d->cfg_index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMultiGpuBoard(nvmlDevice_t device, unsigned int *multiGpuBool)
{
    DEV_OR_RETURN(device, d);
    (void)d;
    if (!multiGpuBool)
        return NVML_ERROR_INVALID_ARGUMENT;
    *multiGpuBool = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                  unsigned int *pendingMode)
{
    DEV_OR_RETURN(device, d);
    (void)d;
    (void)currentMode;
    (void)pendingMode;
    return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    DEV_OR_RETURN(device, d);
    (void)d;
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = 9;
    *minor = 0;
    return NVML_SUCCESS;
}

/* v1 callers pass the old 52-byte struct: only its common head is written. */
static nvmlReturn_t pci_info(nvmlDevice_t device, nvmlPciInfo_t *pci, int legacy)
{
    DEV_OR_RETURN(device, d);
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlPciInfo_t p;
    memset(&p, 0, sizeof p);
    snprintf(p.busIdLegacy, sizeof p.busIdLegacy, "0000:%02x:00.0", SI_PCI_BUS(d));
    snprintf(p.busId, sizeof p.busId, "00000000:%02x:00.0", SI_PCI_BUS(d));
    p.bus = (unsigned)SI_PCI_BUS(d);
    p.pciDeviceId = 0x233010de;
    p.pciSubSystemId = 0x16c110de;
    if (legacy) {
        memcpy(pci, &p, offsetof(nvmlPciInfo_t, busId));
        memset(pci->busId, 0, 16);
    } else {
        *pci = p;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return pci_info(device, pci, 0);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return pci_info(device, pci, 0);
}

nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return pci_info(device, pci, 1);
}

/* ---- memory, processes, utilisation ----------------------------------------------- */

/* In a cgroup with a hard limit on the device: total is the limit, used what the
 * cgroup's processes use (see si_mem_view). */
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    DEV_OR_RETURN(device, d);
    uint64_t total, used, free_bytes;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    si_mem_view(d, &total, &used, &free_bytes);
    if (used > total)
        used = total;
    memory->total = total;
    memory->used = used;
    memory->free = free_bytes;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    nvmlMemory_t m;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = nvmlDeviceGetMemoryInfo(device, &m);
    if (rc != NVML_SUCCESS)
        return rc;
    memory->version = nvmlMemory_v2;
    memory->total = m.total;
    memory->reserved = 0;
    memory->used = m.used;
    memory->free = m.free;
    return NVML_SUCCESS;
}

/* The processes with a context on the device, written as the caller's struct version:
 * size 0 for v1, 1 for v2/v3 (same layout). */
static nvmlReturn_t processes(nvmlDevice_t device, unsigned int *count, void *infos, int v2)
{
    DEV_OR_RETURN(device, d);
    static __thread si_proc procs[SN_MAX_PROCS];
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    int n = si_query(d, 0, 0, procs, SN_MAX_PROCS, NULL, NULL);
    if (n > SN_MAX_PROCS)
        n = SN_MAX_PROCS;
    if ((unsigned)n > *count || (n > 0 && !infos)) {
        *count = (unsigned)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int i = 0; i < n; i++) {
        if (v2) {
            nvmlProcessInfo_v2_t *p = (nvmlProcessInfo_v2_t *)infos + i;
            p->pid = procs[i].id;
            p->usedGpuMemory = procs[i].used_bytes;
            p->gpuInstanceId = p->computeInstanceId = 0xFFFFFFFFu;
        } else {
            nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)infos + i;
            p->pid = procs[i].id;
            p->usedGpuMemory = procs[i].used_bytes;
        }
    }
    *count = (unsigned)n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                  nvmlProcessInfo_v1_t *infos)
{
    return processes(device, infoCount, infos, 0);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                     unsigned int *infoCount,
                                                     nvmlProcessInfo_v2_t *infos)
{
    return processes(device, infoCount, infos, 1);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                     unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    return processes(device, infoCount, infos, 1);
}

/* No graphics and no MPS: the lists are empty. */
static nvmlReturn_t no_processes(nvmlDevice_t device, unsigned int *count)
{
    DEV_OR_RETURN(device, d);
    (void)d;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}

#define SN_EMPTY_LIST(name, type)                                                      \
    nvmlReturn_t name(nvmlDevice_t device, unsigned int *infoCount, type *infos)       \
    {                                                                                  \
        (void)infos;                                                                   \
        return no_processes(device, infoCount);                                        \
    }
SN_EMPTY_LIST(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t)
SN_EMPTY_LIST(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_v2_t)
SN_EMPTY_LIST(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t)
SN_EMPTY_LIST(nvmlDeviceGetMPSComputeRunningProcesses, nvmlProcessInfo_v1_t)
SN_EMPTY_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlProcessInfo_v2_t)
SN_EMPTY_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlProcessInfo_t)

/* Like the driver, utilisation is sampled per period: one sample per process that kept
 * the device busy in the last completed period, if that period ended after
 * lastSeenTimeStamp (µs). smUtil is its busy share of the period in percent. */
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                             nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp)
{
    DEV_OR_RETURN(device, d);
    static __thread si_proc procs[SN_MAX_PROCS];
    if (!processSamplesCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t now = si_now_us(), period = sample_us();
    uint64_t t1 = now - now % period;
    if (lastSeenTimeStamp >= t1)
        return NVML_ERROR_NOT_FOUND;
    int n = si_query(d, t1 - period, t1, procs, SN_MAX_PROCS, NULL, NULL), busy = 0;
    for (int i = 0; i < n && i < SN_MAX_PROCS; i++)
        if (procs[i].util > 0)
            procs[busy++] = procs[i];
    if (busy == 0)
        return NVML_ERROR_NOT_FOUND;
    if (!utilization || (unsigned)busy > *processSamplesCount) {
        *processSamplesCount = (unsigned)busy;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int i = 0; i < busy; i++) {
        memset(&utilization[i], 0, sizeof utilization[i]);
        utilization[i].pid = procs[i].id;
        utilization[i].timeStamp = t1;
        utilization[i].smUtil = procs[i].util;
    }
    *processSamplesCount = (unsigned)busy;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    DEV_OR_RETURN(device, d);
    unsigned util = 0;
    if (!utilization)
        return NVML_ERROR_INVALID_ARGUMENT;
    si_query(d, 0, 0, NULL, 0, NULL, &util);
    utilization->gpu = util;
    utilization->memory = 0;
    return NVML_SUCCESS;
}

/* ---- per-cgroup memory limits ----------------------------------------------------- */

/* CUDA 12.9's nvml.h does not declare these yet; the structs are laid out as NVIDIA's
 * newer header documents them (what go-nvml passes). */
#ifdef NVML_DEVICE_MEMORY_LIMIT_MAX
typedef nvmlSetMemoryLimits_v1_t sn_set_limits_v1;
typedef nvmlGetMemoryLimits_v1_t sn_get_limits_v1;
#else
#define NVML_DEVICE_MEMORY_LIMIT_MAX 0xFFFFFFFFFFFFFFFFULL
typedef struct {
    const char *nameSpace;        /* in: the cgroup's full path under /sys/fs/cgroup */
    unsigned long long softLimit; /* in: bytes */
    unsigned long long hardLimit; /* in: bytes, NVML_DEVICE_MEMORY_LIMIT_MAX: none */
} sn_set_limits_v1;
typedef struct {
    const char *nameSpace;          /* in */
    unsigned long long softLimit;   /* out */
    unsigned long long hardLimit;   /* out */
    unsigned long long currentUsed; /* out: what the cgroup's processes use on the device */
} sn_get_limits_v1;
nvmlReturn_t nvmlDeviceSetMemoryLimits_v1(nvmlDevice_t device, sn_set_limits_v1 *limits);
nvmlReturn_t nvmlDeviceGetMemoryLimits_v1(nvmlDevice_t device, sn_get_limits_v1 *limits);
#endif

#define SN_CGROUP2_MAGIC 0x63677270 /* statfs f_type of a cgroup v2 file system */

/* The cgroup a nameSpace names, cleaned into cg: INVALID_ARGUMENT when it is missing,
 * not absolute or too long; OPERATING_SYSTEM when it is not a cgroup v2 directory (the
 * driver cannot open it as a cgroup). */
static nvmlReturn_t limits_cgroup(const char *ns, char cg[SI_CGROUP_LEN])
{
    struct stat sb;
    struct statfs fs;
    if (!ns || si_clean_path(ns, cg, SI_CGROUP_LEN) != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (stat(cg, &sb) != 0 || !S_ISDIR(sb.st_mode) || statfs(cg, &fs) != 0 ||
        (unsigned long)fs.f_type != SN_CGROUP2_MAGIC)
        return NVML_ERROR_OPERATING_SYSTEM;
    return NVML_SUCCESS;
}

/* Limits are bytes; soft above hard, or a limit above the device's memory (hard
 * NVML_DEVICE_MEMORY_LIMIT_MAX meaning none), is invalid; soft 0 with hard MAX clears. A
 * process whose cgroup has a hard limit is refused device memory past it (all the
 * cgroup's processes together), and sees the limit as its total. Root only. */
nvmlReturn_t nvmlDeviceSetMemoryLimits_v1(nvmlDevice_t device, sn_set_limits_v1 *limits)
{
    DEV_OR_RETURN(device, d);
    char cg[SI_CGROUP_LEN];
    if (!limits)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!si_limits_supported())
        return NVML_ERROR_NOT_SUPPORTED;
    if (geteuid() != 0)
        return NVML_ERROR_NO_PERMISSION;
    unsigned long long soft = limits->softLimit, hard = limits->hardLimit;
    int clear = soft == 0 && hard == NVML_DEVICE_MEMORY_LIMIT_MAX;
    if (!clear && (soft > hard || soft > d->mem_bytes ||
                   (hard != NVML_DEVICE_MEMORY_LIMIT_MAX && hard > d->mem_bytes)))
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = limits_cgroup(limits->nameSpace, cg);
    if (rc != NVML_SUCCESS)
        return rc;
    switch (si_limit_set(d, cg, soft, hard)) {
    case 0:
        return NVML_SUCCESS;
    case -1:
        si_log("no room for the limits of %s on %s", cg, d->uuid);
        return NVML_ERROR_UNKNOWN;
    default:
        return NVML_ERROR_UNKNOWN;
    }
}

nvmlReturn_t nvmlDeviceGetMemoryLimits_v1(nvmlDevice_t device, sn_get_limits_v1 *limits)
{
    DEV_OR_RETURN(device, d);
    char cg[SI_CGROUP_LEN];
    uint64_t soft, hard, used;
    if (!limits)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!si_limits_supported())
        return NVML_ERROR_NOT_SUPPORTED;
    nvmlReturn_t rc = limits_cgroup(limits->nameSpace, cg);
    if (rc != NVML_SUCCESS)
        return rc;
    switch (si_limit_get(d, cg, &soft, &hard, &used)) {
    case 0:
        limits->softLimit = soft;
        limits->hardLimit = hard;
        limits->currentUsed = used;
        return NVML_SUCCESS;
    case 1:
        return NVML_ERROR_NOT_FOUND;
    default:
        return NVML_ERROR_UNKNOWN;
    }
}
