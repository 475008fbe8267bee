/* Stand-in driver: the device table (env or config file), what a container sees of it,
 * and small helpers both libraries share (see standin.h). */
#define _GNU_SOURCE
#include "standin.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define SI_SECOND_US 1000000ULL

static pthread_once_t g_cfg_once = PTHREAD_ONCE_INIT;
static si_device g_cfg[SI_MAX_DEV], g_present[SI_MAX_DEV];
static int g_ncfg, g_npresent, g_cuda[SI_MAX_DEV], g_ncuda;
static uint64_t g_kernel_us = 1000, g_ctx_bytes;

void si_log(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("gpu-share-standin: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

uint64_t si_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * SI_SECOND_US + (uint64_t)ts.tv_nsec / 1000;
}

void si_sleep_until(uint64_t t_us)
{
    uint64_t now;
    while ((now = si_now_us()) < t_us) {
        uint64_t d = t_us - now;
        struct timespec ts = {(time_t)(d / SI_SECOND_US), (long)(d % SI_SECOND_US) * 1000};
        nanosleep(&ts, NULL);
    }
}

/* ---- configuration ---------------------------------------------------------------- */

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
        *--e = '\0';
    return s;
}

static int parse_pos(const char *s, uint64_t *out)
{
    if (*s < '0' || *s > '9')
        return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v == 0)
        return 0;
    *out = v;
    return 1;
}

static uint64_t env_u64(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    uint64_t out;
    if (v && strcmp(v, "0") == 0)
        return 0;
    return (v && parse_pos(v, &out)) ? out : dflt;
}

static int find_cfg(const char *uuid)
{
    for (int i = 0; i < g_ncfg; i++)
        if (strcmp(g_cfg[i].uuid, uuid) == 0)
            return i;
    return -1;
}

static void add_entry(char *tok)
{
    char *eq = strchr(tok, '=');
    if (!eq)
        goto bad;
    *eq = '\0';
    char *uuid = trim(tok), *mem = eq + 1, *sms = strchr(mem, ':');
    if (sms)
        *sms++ = '\0';
    uint64_t mib, nsm = SI_DEFAULT_SMS;
    if (!*uuid || strlen(uuid) >= SI_UUID_LEN || !parse_pos(trim(mem), &mib) ||
        mib > (1ULL << 30) || (sms && (!parse_pos(trim(sms), &nsm) || nsm > 65536)))
        goto bad;
    if (find_cfg(uuid) >= 0 || g_ncfg == SI_MAX_DEV)
        goto bad;
    si_device *d = &g_cfg[g_ncfg];
    snprintf(d->uuid, sizeof d->uuid, "%s", uuid);
    d->mem_bytes = mib << 20;
    d->sms = (int)nsm;
    d->cfg_index = g_ncfg++;
    return;
bad:
    si_log("ignoring device entry \"%s\"", tok);
}

/* GPU_SHARE_STANDIN_DEVICES, else the config file (newlines read as ';'). */
static char *read_config(void)
{
    const char *env = getenv("GPU_SHARE_STANDIN_DEVICES");
    if (env)
        return strdup(env);
    const char *path = getenv("GPU_SHARE_STANDIN_CONFIG");
    FILE *f = fopen(path && *path ? path : "/etc/gpu-share-standin/devices", "r");
    if (!f)
        return NULL;
    char *buf = calloc(1, 16384);
    size_t n = buf ? fread(buf, 1, 16383, f) : 0;
    fclose(f);
    for (size_t i = 0; i < n; i++)
        if (buf[i] == '\n' || buf[i] == '\r')
            buf[i] = ';';
    return buf;
}

static const char *env_set(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* The runtime's visible-devices env: ours (in its order), else DUMMY_/NVIDIA_ (in
 * configured order); unset or "all" means all, "none"/"void" none. */
static void select_present(void)
{
    const char *v = env_set("GPU_SHARE_STANDIN_VISIBLE");
    int ordered = v != NULL, chosen[SI_MAX_DEV] = {0}, pick[SI_MAX_DEV], n = 0;
    if (!v)
        v = env_set("DUMMY_VISIBLE_DEVICES");
    if (!v)
        v = env_set("NVIDIA_VISIBLE_DEVICES");
    char *copy = strdup(v ? v : "all"), *save = NULL, *w = trim(copy);
    if (strcasecmp(w, "all") == 0) {
        for (int i = 0; i < g_ncfg; i++)
            pick[n++] = i;
    } else if (strcasecmp(w, "none") != 0 && strcasecmp(w, "void") != 0) {
        for (char *t = strtok_r(w, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            int k = find_cfg(trim(t));
            if (k < 0 || chosen[k])
                continue;
            chosen[k] = 1;
            if (ordered)
                pick[n++] = k;
        }
        for (int k = 0; !ordered && k < g_ncfg; k++)
            if (chosen[k])
                pick[n++] = k;
    }
    free(copy);
    for (int i = 0; i < n; i++)
        g_present[i] = g_cfg[pick[i]];
    g_npresent = n;
}

/* CUDA_VISIBLE_DEVICES: indexes or UUIDs of present devices; like CUDA, the list ends
 * at the first entry that names none. */
static void select_cuda(void)
{
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    g_ncuda = 0;
    if (!v) {
        for (int i = 0; i < g_npresent; i++)
            g_cuda[g_ncuda++] = i;
        return;
    }
    char *copy = strdup(v), *save = NULL;
    int used[SI_MAX_DEV] = {0};
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        t = trim(t);
        uint64_t idx;
        int k = -1;
        if (strcmp(t, "0") == 0)
            k = g_npresent > 0 ? 0 : -1;
        else if (parse_pos(t, &idx))
            k = idx < (uint64_t)g_npresent ? (int)idx : -1;
        for (int i = 0; k < 0 && i < g_npresent; i++)
            if (strcmp(g_present[i].uuid, t) == 0)
                k = i;
        if (k < 0 || used[k])
            break;
        used[k] = 1;
        g_cuda[g_ncuda++] = k;
    }
    free(copy);
}

static void load_config(void)
{
    char *cfg = read_config(), *save = NULL;
    for (char *t = cfg ? strtok_r(cfg, ";", &save) : NULL; t; t = strtok_r(NULL, ";", &save))
        if (*trim(t))
            add_entry(t);
    free(cfg);
    select_present();
    select_cuda();
    g_kernel_us = env_u64("GPU_SHARE_STANDIN_KERNEL_US", 1000);
    g_ctx_bytes = env_u64("GPU_SHARE_STANDIN_CONTEXT_MIB", 0) << 20;
}

int si_present(const si_device **devs)
{
    pthread_once(&g_cfg_once, load_config);
    *devs = g_present;
    return g_npresent;
}

int si_cuda_order(const int **nvml_index)
{
    pthread_once(&g_cfg_once, load_config);
    *nvml_index = g_cuda;
    return g_ncuda;
}

uint64_t si_kernel_us(void)
{
    pthread_once(&g_cfg_once, load_config);
    return g_kernel_us;
}

uint64_t si_context_bytes(void)
{
    pthread_once(&g_cfg_once, load_config);
    return g_ctx_bytes;
}

static uint64_t hash_str(const char *s, uint64_t h)
{
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return h;
}

uint64_t si_mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* A GPU-xxxxxxxx-xxxx-... UUID gives its 16 bytes, as CUDA and NVML agree on real
 * devices; any other string a stable hash of it. */
void si_uuid_bytes(const char *uuid, unsigned char out[16])
{
    const char *p = strchr(uuid, '-');
    int n = 0;
    for (p = p ? p + 1 : uuid; *p && n <= 32; p++) {
        int v = (*p >= '0' && *p <= '9') ? *p - '0'
              : (*p >= 'a' && *p <= 'f') ? *p - 'a' + 10
              : (*p >= 'A' && *p <= 'F') ? *p - 'A' + 10 : -1;
        if (v < 0 && *p != '-')
            break;
        if (v >= 0 && n < 32)
            out[n / 2] = (unsigned char)(n % 2 ? (out[n / 2] | v) : v << 4);
        n += v >= 0;
    }
    if (n == 32 && !*p)
        return;
    uint64_t h[2] = {si_mix64(hash_str(uuid, 0xcbf29ce484222325ULL)),
                     si_mix64(hash_str(uuid, 0x84222325cbf29ce4ULL))};
    for (int i = 0; i < 16; i++)
        out[i] = (unsigned char)(h[i / 8] >> (8 * (i % 8)));
}
