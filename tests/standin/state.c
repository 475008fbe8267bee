/* Stand-in driver: the cross-process state, one file per device in
 * GPU_SHARE_STANDIN_STATE_DIR, each guarded by flock (see standin.h): the processes using
 * the device, its kernel queue, and the per-cgroup memory limits set through NVML. */
#define _GNU_SOURCE
#include "standin.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define SI_MAGIC 0x53494753u
#define SI_VERSION 2u  /* 2: cgroup per record, limits table */
#define SI_MAX_RECS 128
#define SI_MAX_LIMITS 64
#define SI_NBUCKET 512          /* busy time in 10 ms buckets: 5.12 s of history */
#define SI_BUCKET_US 10000ULL
#define SI_SECOND_US 1000000ULL
#define SI_STALE_US (60 * SI_SECOND_US)
#define SI_HEARTBEAT_S 5

/* One driver process on one device. */
typedef struct {
    uint32_t id;           /* 0: free slot */
    int32_t pid;           /* getpid() in its own pid namespace, for liveness */
    uint64_t start_ticks;  /* /proc/<pid>/stat starttime: tells pid reuse apart */
    uint64_t pidns;        /* pid namespace inode: liveness is checkable only inside it */
    uint64_t seen_us;      /* refreshed by every call and a heartbeat */
    uint64_t alloc_bytes;
    uint32_t ctx;          /* has a context on the device */
    uint32_t pad;
    uint64_t last_bucket;  /* newest bucket written */
    uint32_t busy[SI_NBUCKET];
    char cgroup[SI_CGROUP_LEN]; /* its cgroup's path ("" outside cgroup v2), see limits */
} si_rec;

/* Memory limits of one cgroup on the device; cgroup "" marks a free slot. */
typedef struct {
    char cgroup[SI_CGROUP_LEN];
    uint64_t soft, hard;   /* bytes; hard SI_NO_LIMIT: none */
} si_limit;

typedef struct {
    uint32_t magic, version;
    uint64_t busy_until;   /* end of the device's kernel queue, µs */
    si_rec recs[SI_MAX_RECS];
    si_limit limits[SI_MAX_LIMITS];
} si_file;

typedef struct {
    pid_t pid;   /* process that opened it: a forked child reopens (flock is per open) */
    int fd;
    si_file *f;
} si_open;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    pid_t pid;
    uint32_t id;
    uint64_t start, pidns;
    char cgroup[SI_CGROUP_LEN]; /* read once per process, like its id */
} g_self;
static si_open g_open[SI_MAX_DEV];
static uint32_t g_mine;  /* cfg_index bits of devices holding our record */
static pid_t g_hb_pid;   /* process whose heartbeat thread runs */

/* ---- this process ----------------------------------------------------------------- */

static int read_stat(pid_t pid, char *state, uint64_t *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *p = strrchr(buf, ')');  /* the command name may hold spaces and ')' */
    if (!p || !p[1] || !p[2])
        return -1;
    p += 2;
    *state = *p;
    for (int field = 3; field < 22; field++) {  /* field 22: starttime */
        p = strchr(p, ' ');
        if (!p)
            return -1;
        p++;
    }
    *start = strtoull(p, NULL, 10);
    return 0;
}

int si_clean_path(const char *in, char *out, size_t n)
{
    size_t len = 1;
    if (!in || in[0] != '/' || n < 2)
        return -1;
    out[0] = '/';
    for (const char *p = in; *p;) {
        while (*p == '/')
            p++;
        const char *e = p;
        while (*e && *e != '/')
            e++;
        size_t k = (size_t)(e - p);
        if (k == 2 && p[0] == '.' && p[1] == '.') {
            while (len > 1 && out[len - 1] != '/')
                len--;
            if (len > 1)
                len--;  /* the separator before the dropped element */
        } else if (k > 0 && !(k == 1 && p[0] == '.')) {
            if (len + (len > 1) + k >= n)
                return -1;
            if (len > 1)
                out[len++] = '/';
            memcpy(out + len, p, k);
            len += k;
        }
        p = e;
    }
    out[len] = '\0';
    return 0;
}

/* This process's cgroup as NVIDIA's hook names it: "/sys/fs/cgroup" joined with the
 * "0::" line of /proc/self/cgroup; "" without one (no cgroup v2 hierarchy) or when the
 * path is longer than a limit can name (so no limit can be set on it either). */
static void read_cgroup(char *out, size_t n)
{
    static const char root[] = "/sys/fs/cgroup/";
    char line[sizeof root + 4096];
    out[0] = '\0';
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f)
        return;
    memcpy(line, root, sizeof root);
    char *rest = line + sizeof root - 1;
    while (fgets(rest, (int)(sizeof line - (sizeof root - 1)), f)) {
        if (strncmp(rest, "0::", 3) != 0)
            continue;
        size_t k = strcspn(rest + 3, "\n");
        memmove(rest, rest + 3, k);
        rest[k] = '\0';
        if (si_clean_path(line, out, n) != 0)
            out[0] = '\0';
        break;
    }
    fclose(f);
}

static void atfork_prepare(void) { pthread_mutex_lock(&g_mu); }
static void atfork_parent(void) { pthread_mutex_unlock(&g_mu); }
static void atfork_child(void)
{
    g_mine = 0;  /* the child is another driver process: new id, no records yet */
    pthread_mutex_unlock(&g_mu);
}

/* The driver process id: not getpid(), which collides across containers; a hash of the
 * pid namespace, pid and start time, which both libraries compute alike. Called with
 * g_mu held; recomputed in a forked child. */
static void refresh_self(void)
{
    static int atfork_done;
    pid_t pid = getpid();
    if (g_self.pid == pid)
        return;
    if (!atfork_done) {
        atfork_done = 1;
        pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    }
    char st;
    struct stat sb;
    uint64_t start = 0;
    g_self.pid = pid;
    g_self.start = read_stat(pid, &st, &start) == 0 ? start : 0;
    g_self.pidns = stat("/proc/self/ns/pid", &sb) == 0 ? (uint64_t)sb.st_ino : 0;
    uint64_t h = si_mix64(g_self.pidns ^ si_mix64((uint64_t)pid ^ si_mix64(g_self.start + 1)));
    g_self.id = (uint32_t)(h & 0x7fffffffu);
    if (g_self.id == 0)
        g_self.id = 1;
    read_cgroup(g_self.cgroup, sizeof g_self.cgroup);
}

/* ---- state files ------------------------------------------------------------------ */

static const char *state_dir(void)
{
    const char *dir = getenv("GPU_SHARE_STANDIN_STATE_DIR");
    return dir && *dir ? dir : "/tmp/gpu-share-standin";
}

static void make_dirs(const char *dir)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            mkdir(buf, 0777);
            *p = '/';
        }
    }
    if (mkdir(buf, 0777) == 0)
        chmod(buf, 0777);  /* shared by every container: the umask must not narrow it */
}

static int map_file(si_open *o, const char *path)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0)
        return -1;
    struct stat sb;
    void *m = MAP_FAILED;
    fchmod(fd, 0666);  /* fails harmlessly on another user's file */
    while (flock(fd, LOCK_EX) != 0 && errno == EINTR)
        ;
    if (fstat(fd, &sb) == 0 && (sb.st_size == (off_t)sizeof(si_file) ||
                                (ftruncate(fd, 0) == 0 && ftruncate(fd, sizeof(si_file)) == 0)))
        m = mmap(NULL, sizeof(si_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m != MAP_FAILED) {
        si_file *f = m;
        if (f->magic != SI_MAGIC || f->version != SI_VERSION) {
            memset(f, 0, sizeof *f);
            f->magic = SI_MAGIC;
            f->version = SI_VERSION;
        }
        o->f = f;
        o->fd = fd;
    }
    flock(fd, LOCK_UN);
    if (m == MAP_FAILED)
        close(fd);
    return m == MAP_FAILED ? -1 : 0;
}

static void open_state(si_open *o, const si_device *d)
{
    if (o->f && o->fd >= 0)  /* inherited over fork: ours to drop, the parent keeps its */
        munmap(o->f, sizeof(si_file));
    if (o->fd >= 0)
        close(o->fd);
    o->pid = g_self.pid;
    o->fd = -1;
    o->f = NULL;
    char safe[SI_UUID_LEN], path[4200];
    size_t i;
    for (i = 0; d->uuid[i]; i++) {
        char c = d->uuid[i];
        int ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                 c == '-' || c == '_' || (c == '.' && i > 0);
        safe[i] = ok ? c : '_';
    }
    safe[i] = '\0';
    make_dirs(state_dir());
    snprintf(path, sizeof path, "%s/%s", state_dir(), safe);
    if (map_file(o, path) == 0)
        return;
    si_log("state file %s unusable (%s): this process counts alone", path, strerror(errno));
    void *m = mmap(NULL, sizeof(si_file), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    o->f = m == MAP_FAILED ? NULL : m;
}

static si_file *lock_dev(const si_device *d)
{
    pthread_mutex_lock(&g_mu);  /* flock does not exclude threads sharing the open file */
    refresh_self();
    si_open *o = &g_open[d->cfg_index];
    if (o->pid != g_self.pid)
        open_state(o, d);
    while (o->fd >= 0 && flock(o->fd, LOCK_EX) != 0 && errno == EINTR)
        ;
    return o->f;
}

static void unlock_dev(const si_device *d)
{
    si_open *o = &g_open[d->cfg_index];
    if (o->fd >= 0)
        flock(o->fd, LOCK_UN);
    pthread_mutex_unlock(&g_mu);
}

/* ---- records ---------------------------------------------------------------------- */

static int rec_dead(const si_rec *r, uint64_t now)
{
    char st;
    uint64_t start;
    if (r->id == g_self.id)
        return 0;
    if (now > r->seen_us + SI_STALE_US)
        return 1;
    if (!r->pidns || r->pidns != g_self.pidns)
        return 0;  /* another namespace's pid means nothing here: staleness only */
    if (read_stat(r->pid, &st, &start) != 0)
        return 1;
    return st == 'Z' || st == 'X' || start != r->start_ticks;
}

static void prune(si_file *f, uint64_t now)
{
    for (int i = 0; i < SI_MAX_RECS; i++)
        if (f->recs[i].id && rec_dead(&f->recs[i], now))
            memset(&f->recs[i], 0, sizeof f->recs[i]);
}

static uint64_t rec_used(const si_rec *r)
{
    return r->alloc_bytes + (r->ctx ? si_context_bytes() : 0);
}

static uint64_t used_total(const si_file *f)
{
    uint64_t sum = 0;
    for (int i = 0; i < SI_MAX_RECS; i++)
        if (f->recs[i].id)
            sum += rec_used(&f->recs[i]);
    return sum;
}

/* ---- per-cgroup memory limits ----------------------------------------------------- */

int si_limits_supported(void)
{
    const char *v = getenv("GPU_SHARE_STANDIN_MEMORY_LIMITS");
    return !(v && strcmp(v, "0") == 0);
}

static si_limit *find_limit(si_file *f, const char *cgroup)
{
    if (!cgroup[0])
        return NULL;
    for (int i = 0; i < SI_MAX_LIMITS; i++)
        if (strcmp(f->limits[i].cgroup, cgroup) == 0)
            return &f->limits[i];
    return NULL;
}

static uint64_t used_cgroup(const si_file *f, const char *cgroup)
{
    uint64_t sum = 0;
    for (int i = 0; i < SI_MAX_RECS; i++)
        if (f->recs[i].id && strcmp(f->recs[i].cgroup, cgroup) == 0)
            sum += rec_used(&f->recs[i]);
    return sum;
}

/* The hard limit on this process's cgroup, or SI_NO_LIMIT. A driver without the feature
 * (GPU_SHARE_STANDIN_MEMORY_LIMITS=0) enforces none. */
static uint64_t own_hard_limit(si_file *f)
{
    const si_limit *l = si_limits_supported() ? find_limit(f, g_self.cgroup) : NULL;
    return l ? l->hard : SI_NO_LIMIT;
}

/* Whether bytes more fit under this process's cgroup's hard limit (pruned state). */
static int cgroup_room(si_file *f, uint64_t bytes)
{
    uint64_t hard = own_hard_limit(f);
    if (hard == SI_NO_LIMIT)
        return 1;
    uint64_t used = used_cgroup(f, g_self.cgroup);
    return used <= hard && bytes <= hard - used;
}

static void *heartbeat(void *arg);

static void start_heartbeat(void)
{
    if (g_hb_pid == g_self.pid)
        return;
    pthread_t t;
    pthread_attr_t at;
    sigset_t all, old;
    g_hb_pid = g_self.pid;
    sigfillset(&all);  /* signals stay with the application's threads */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &at, heartbeat, NULL) != 0)
        g_hb_pid = 0;
    pthread_attr_destroy(&at);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static si_rec *own_rec(si_file *f, const si_device *d, int create, uint64_t now)
{
    si_rec *slot = NULL;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < SI_MAX_RECS; i++) {
            if (f->recs[i].id == g_self.id)
                return &f->recs[i];
            if (!f->recs[i].id && !slot)
                slot = &f->recs[i];
        }
        if (!create || slot)
            break;
        prune(f, now);
    }
    if (!create || !slot)
        return NULL;
    memset(slot, 0, sizeof *slot);
    slot->id = g_self.id;
    slot->pid = (int32_t)g_self.pid;
    slot->start_ticks = g_self.start;
    slot->pidns = g_self.pidns;
    slot->seen_us = now;
    memcpy(slot->cgroup, g_self.cgroup, sizeof slot->cgroup);
    g_mine |= 1u << d->cfg_index;
    start_heartbeat();
    return slot;
}

static void *heartbeat(void *arg)
{
    (void)arg;
    for (;;) {
        sleep(SI_HEARTBEAT_S);
        const si_device *devs;
        int n = si_present(&devs);
        for (int i = 0; i < n; i++) {
            si_file *f = lock_dev(&devs[i]);
            si_rec *r = f && (g_mine >> devs[i].cfg_index & 1)
                      ? own_rec(f, &devs[i], 0, 0) : NULL;
            if (r)
                r->seen_us = si_now_us();
            unlock_dev(&devs[i]);
        }
    }
    return NULL;
}

/* Busy time goes into the buckets it overlaps; buckets left behind are cleared. */
static void rec_advance(si_rec *r, uint64_t b)
{
    if (b <= r->last_bucket)
        return;
    if (b - r->last_bucket >= SI_NBUCKET)
        memset(r->busy, 0, sizeof r->busy);
    else
        for (uint64_t k = r->last_bucket + 1; k <= b; k++)
            r->busy[k % SI_NBUCKET] = 0;
    r->last_bucket = b;
}

static void rec_add_busy(si_rec *r, uint64_t s, uint64_t e)
{
    for (uint64_t b = s / SI_BUCKET_US; b * SI_BUCKET_US < e; b++) {
        uint64_t lo = s > b * SI_BUCKET_US ? s : b * SI_BUCKET_US;
        uint64_t hi = e < (b + 1) * SI_BUCKET_US ? e : (b + 1) * SI_BUCKET_US;
        rec_advance(r, b);
        if (b + SI_NBUCKET > r->last_bucket)
            r->busy[b % SI_NBUCKET] += (uint32_t)(hi - lo);
    }
}

/* Busy µs within [t0, t1); partial buckets count pro rata. */
static uint64_t rec_busy_in(const si_rec *r, uint64_t t0, uint64_t t1)
{
    uint64_t sum = 0;
    for (uint64_t b = t0 / SI_BUCKET_US; b * SI_BUCKET_US < t1; b++) {
        if (b > r->last_bucket || b + SI_NBUCKET <= r->last_bucket)
            continue;
        uint64_t lo = t0 > b * SI_BUCKET_US ? t0 : b * SI_BUCKET_US;
        uint64_t hi = t1 < (b + 1) * SI_BUCKET_US ? t1 : (b + 1) * SI_BUCKET_US;
        sum += r->busy[b % SI_NBUCKET] * (hi - lo) / SI_BUCKET_US;
    }
    return sum;
}

static unsigned percent(uint64_t busy, uint64_t window)
{
    uint64_t p = window ? (busy * 100 + window / 2) / window : 0;
    return p > 100 ? 100 : (unsigned)p;
}

/* ---- the operations --------------------------------------------------------------- */

int si_set_context(const si_device *d, int on)
{
    si_file *f = lock_dev(d);
    int rc = f ? 0 : -2;
    uint64_t now = si_now_us();
    si_rec *r = f ? own_rec(f, d, 0, now) : NULL;
    uint64_t ctx_bytes = si_context_bytes();
    if (f && on && !(r && r->ctx)) {
        prune(f, now);
        if (ctx_bytes > d->mem_bytes || used_total(f) > d->mem_bytes - ctx_bytes ||
            !cgroup_room(f, ctx_bytes))
            rc = -1;  /* no room for the context itself */
        else if ((r = own_rec(f, d, 1, now)) == NULL)
            rc = -1;
        else
            r->ctx = 1;
    } else if (r && !on) {
        r->ctx = 0;
        if (!r->alloc_bytes)
            memset(r, 0, sizeof *r);
    }
    if (rc == 0 && r && r->id)
        r->seen_us = now;
    unlock_dev(d);
    return rc;
}

int si_mem_add(const si_device *d, uint64_t bytes)
{
    si_file *f = lock_dev(d);
    int rc = f ? 0 : -2;
    uint64_t now = si_now_us();
    if (f) {
        prune(f, now);
        uint64_t used = used_total(f);
        si_rec *r = NULL;
        if (used > d->mem_bytes || bytes > d->mem_bytes - used || !cgroup_room(f, bytes) ||
            (r = own_rec(f, d, 1, now)) == NULL)
            rc = -1;
        else {
            r->alloc_bytes += bytes;
            r->seen_us = now;
        }
    }
    unlock_dev(d);
    return rc;
}

void si_mem_sub(const si_device *d, uint64_t bytes)
{
    si_file *f = lock_dev(d);
    si_rec *r = f ? own_rec(f, d, 0, 0) : NULL;
    if (r) {
        r->alloc_bytes -= bytes < r->alloc_bytes ? bytes : r->alloc_bytes;
        r->seen_us = si_now_us();
        if (!r->alloc_bytes && !r->ctx)
            memset(r, 0, sizeof *r);
    }
    unlock_dev(d);
}

/* Kernels of every process queue on the device's one timeline. */
uint64_t si_launch(const si_device *d, uint64_t dur_us)
{
    si_file *f = lock_dev(d);
    uint64_t now = si_now_us(), start = now;
    if (f && f->busy_until > now && f->busy_until < now + 60 * SI_SECOND_US)
        start = f->busy_until;
    uint64_t end = start + dur_us;
    si_rec *r = f ? own_rec(f, d, 1, now) : NULL;
    if (f)
        f->busy_until = end;
    if (r) {
        rec_add_busy(r, start, end);
        r->seen_us = now;
    }
    unlock_dev(d);
    return end;
}

int si_query(const si_device *d, uint64_t t0, uint64_t t1, si_proc *out, int max,
             uint64_t *used, unsigned *dev_util)
{
    si_file *f = lock_dev(d);
    uint64_t now = si_now_us(), dev_busy = 0, sum = 0;
    int n = 0;
    if (f)
        prune(f, now);
    for (int i = 0; f && i < SI_MAX_RECS; i++) {
        const si_rec *r = &f->recs[i];
        if (!r->id)
            continue;
        sum += rec_used(r);
        dev_busy += rec_busy_in(r, now - SI_SECOND_US, now);
        if (!r->ctx)
            continue;
        if (out && n < max) {
            out[n].id = r->id;
            out[n].used_bytes = rec_used(r);
            out[n].util = t1 > t0 ? percent(rec_busy_in(r, t0, t1), t1 - t0) : 0;
        }
        n++;
    }
    unlock_dev(d);
    if (used)
        *used = sum;
    if (dev_util)
        *dev_util = percent(dev_busy, SI_SECOND_US);
    return n;
}

void si_mem_view(const si_device *d, uint64_t *total, uint64_t *used, uint64_t *free_bytes)
{
    si_file *f = lock_dev(d);
    uint64_t t = d->mem_bytes, u = 0, fr;
    if (f) {
        prune(f, si_now_us());
        u = used_total(f);
    }
    fr = u < t ? t - u : 0;
    uint64_t hard = f ? own_hard_limit(f) : SI_NO_LIMIT;
    if (hard != SI_NO_LIMIT) {
        t = hard;
        u = used_cgroup(f, g_self.cgroup);
        if (fr > (u < t ? t - u : 0))
            fr = u < t ? t - u : 0;
    }
    unlock_dev(d);
    *total = t;
    *used = u;
    *free_bytes = fr;
}

int si_limit_set(const si_device *d, const char *cgroup, uint64_t soft, uint64_t hard)
{
    si_file *f = lock_dev(d);
    int rc = f ? 0 : -2;
    si_limit *l = f ? find_limit(f, cgroup) : NULL;
    if (f && soft == 0 && hard == SI_NO_LIMIT) {
        if (l)
            memset(l, 0, sizeof *l);  /* cleared: the cgroup has no limits again */
    } else if (f) {
        for (int i = 0; !l && i < SI_MAX_LIMITS; i++)
            if (!f->limits[i].cgroup[0])
                l = &f->limits[i];
        if (!l || strlen(cgroup) >= sizeof l->cgroup) {
            rc = -1;
        } else {
            snprintf(l->cgroup, sizeof l->cgroup, "%s", cgroup);
            l->soft = soft;
            l->hard = hard;
        }
    }
    unlock_dev(d);
    return rc;
}

int si_limit_get(const si_device *d, const char *cgroup, uint64_t *soft, uint64_t *hard,
                 uint64_t *used)
{
    si_file *f = lock_dev(d);
    int rc = f ? 1 : -2;
    si_limit *l = f ? find_limit(f, cgroup) : NULL;
    if (l) {
        prune(f, si_now_us());
        *soft = l->soft;
        *hard = l->hard;
        *used = used_cgroup(f, cgroup);
        rc = 0;
    }
    unlock_dev(d);
    return rc;
}
