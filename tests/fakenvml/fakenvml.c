/*
 * A stand-in for NVIDIA's libnvidia-ml.so.1, for tests on machines without a GPU.
 *
 * The unmodified pynvml (and gpustat, nvitop) load it through LD_LIBRARY_PATH. It exports the
 * NVML functions they call, with NVML's struct layouts, versioned names and return codes. Its GPUs
 * and their utilization/power/memory timeline come from a config file written by
 * tests/fakenvml/timeline.py from a `gpumon record --simulate ...` trace, so every workload pattern
 * is defined once, in gpumon's simulator.
 *
 * Environment:
 *   FAKENVML_CONFIG   the config file (required: without it nvmlInit reports DRIVER_NOT_LOADED)
 *   FAKENVML_NOW_US   freeze the timeline at this many microseconds (peers compared at one instant)
 *
 * Config (one record per line, '#' comments):
 *   epoch_us E          timeline t=0 is CLOCK_REALTIME E µs (0: the first nvmlInit of the process)
 *   loop 0|1            replay the timeline in a loop
 *   util_period_us P    nvmlDeviceGetUtilizationRates averages the samples of the last P µs
 *   driver V / cuda N   versions reported
 *   gpu I MEMTOTAL POWERLIMIT_MW UUID NAME...
 *   s I T_US PERCENT                             a driver utilization sample (s and t lines in any
 *                                                order: each unit's are put in time order at load)
 *   t I T_US MEMUSED POWER_MW TEMP RX_KB TX_KB N [PID MEM]*N   device state from T on
 *   fault no_driver                              nvmlInit fails with DRIVER_NOT_LOADED
 *   fault init_error CODE                        nvmlInit fails with CODE (4: NO_PERMISSION)
 *   fault init_delay_us D                        the process's first nvmlInit takes D µs (a driver
 *                                                without persistence mode sets its GPUs up then;
 *                                                later ones find NVML up and return at once)
 *   fault lost I FROM_US UNTIL_US                GPU I reports GPU_IS_LOST in [FROM, UNTIL)
 *   fault unsupported FUNCTION                   FUNCTION answers NOT_SUPPORTED
 *   fault block FUNCTION I SECONDS FROM_US       FUNCTION on GPU I (-1: any) sleeps SECONDS once t >= FROM
 *   fault procs_grow I N                         GPU I's process list grows by N between two calls
 *   mig I PARENT GI CI MEMTOTAL UUID PROFILE...  a MIG instance: unit I (not counted by GetCount, its
 *                                                s/t lines are its own timeline) on GPU PARENT, which
 *                                                is then in MIG mode (no utilization, no samples)
 *   gpm I SM OCC TENSOR DRAM FP16 FP32 FP64      GPU or MIG unit I has GPM (Hopper): each metric is that
 *                                                share (0-1) of the unit's utilization timeline; without
 *                                                this line GPM is not supported on I (pre-Hopper)
 *   clocks I FROM_US UNTIL_US BITS               clock-event reasons BITS on GPU I in [FROM, UNTIL)
 *                                                (outside: GpuIdle 0x1 while utilization is 0, else 0)
 *   xid I AT_US CODE [GI CI]                     an XID event on GPU I once t >= AT (for a registered set)
 *
 * Build: gcc -shared -fPIC -O2 -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1 fakenvml.c
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NOT_FOUND = 6, NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9, NVML_ERROR_TIMEOUT = 10, NVML_ERROR_GPU_IS_LOST = 15, NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 64
#define MAX_PROCS 16
#define BUFFER_SAMPLES 120
#define BOOT_US 1000000000ULL /* sample timestamps count from a made-up boot, as NVML's own clock */

typedef struct { unsigned long long t; unsigned int v; } sample_t;
typedef struct {
    unsigned long long t, mem_used;
    unsigned int power_mw, temp, rx_kb, tx_kb, nproc;
    unsigned int pid[MAX_PROCS];
    unsigned long long pmem[MAX_PROCS];
} row_t;

/* A stable insertion sort by .t: one pass over a timeline already in order (every generator writes
 * them so), and a config written out of order still answers as its times say. */
#define SORT_BY_T(type, items, n) do {                                                      \
        for (size_t j_ = 1; j_ < (n); j_++) {                                                \
            type x_ = (items)[j_];                                                           \
            size_t i_ = j_;                                                                  \
            for (; i_ > 0 && (items)[i_ - 1].t > x_.t; i_--) (items)[i_] = (items)[i_ - 1];  \
            (items)[i_] = x_;                                                                \
        }                                                                                    \
    } while (0)

typedef struct {
    int index;
    char uuid[96], name[96];
    unsigned long long mem_total;
    unsigned int power_limit_mw;
    sample_t *s; size_t ns, cap_s;
    row_t *r; size_t nr, cap_r;
    unsigned long long lost_from, lost_until;
    int procs_grow, grow_calls;
    int configured, is_mig, parent, mig_mode, nmig, mig[8];
    unsigned int gi, ci;
    char profile[32];
    int gpm;
    double gpm_share[7]; /* SM, occupancy, tensor, DRAM, FP16, FP32, FP64 */
    struct { unsigned long long from, until, bits; } clocks[8];
    int nclocks;
} gpu_t;
typedef struct nvmlDevice_st { int index; } *nvmlDevice_t;

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned long long bar1Total, bar1Free, bar1Used; } nvmlBAR1Memory_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef union { double dVal; unsigned int uiVal; unsigned long ulVal; unsigned long long ullVal; long long sllVal; } nvmlValue_t;
typedef struct { unsigned long long timeStamp; nvmlValue_t sampleValue; } nvmlSample_t;
typedef struct {
    char busIdLegacy[16]; unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

static gpu_t gpus[MAX_GPUS];
static struct nvmlDevice_st handles[MAX_GPUS];
static int ngpus, loaded, initialised, fault_no_driver, fault_init_error, loop_timeline;
static unsigned long long epoch_us, util_period_us = 166667, timeline_len, init_delay_us;
static char driver_version[32] = "560.35.03";
static int cuda_version = 12060;
static char unsupported[64][64];
static int nunsupported;
static struct { char fn[64]; int gpu; double seconds; unsigned long long from; } blocks[16];
static int nblocks;
#define MAX_XIDS 64
static struct { int gpu; unsigned long long at, code; unsigned int gi, ci; int delivered; } xids[MAX_XIDS];
static int nxids;
static pthread_mutex_t event_lock = PTHREAD_MUTEX_INITIALIZER;

static unsigned long long realtime_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000ULL;
}

/* Timeline time: µs since the epoch (or frozen), without looping. */
static unsigned long long now_us(void) {
    const char *frozen = getenv("FAKENVML_NOW_US");
    if (frozen && *frozen) return strtoull(frozen, NULL, 10);
    unsigned long long rt = realtime_us();
    return rt > epoch_us ? rt - epoch_us : 0;
}

static void *grow(void *p, size_t *cap, size_t n, size_t size) {
    if (n < *cap) return p;
    *cap = *cap ? *cap * 2 : 256;
    return realloc(p, *cap * size);
}

static void load_config(void) {
    const char *path = getenv("FAKENVML_CONFIG");
    if (!path) return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        int i, n = 0;
        unsigned long long a, b, c;
        char word[64];
        if (line[0] == '#' || line[0] == 0) continue;
        if (sscanf(line, "epoch_us %llu", &a) == 1) epoch_us = a;
        else if (sscanf(line, "loop %d", &i) == 1) loop_timeline = i;
        else if (sscanf(line, "util_period_us %llu", &a) == 1) util_period_us = a ? a : 1;
        else if (sscanf(line, "fault init_delay_us %llu", &a) == 1) init_delay_us = a;
        else if (sscanf(line, "driver %31s", driver_version) == 1) {}
        else if (sscanf(line, "cuda %d", &cuda_version) == 1) {}
        else if (strncmp(line, "gpu ", 4) == 0) {
            unsigned int limit;
            char uuid[96];
            if (sscanf(line, "gpu %d %llu %u %95s %n", &i, &a, &limit, uuid, &n) >= 4 && i >= 0 && i < MAX_GPUS) {
                gpu_t *g = &gpus[i];
                g->index = i; g->mem_total = a; g->power_limit_mw = limit; g->configured = 1;
                snprintf(g->uuid, sizeof g->uuid, "%s", uuid);
                snprintf(g->name, sizeof g->name, "%s", line + n);
                if (i + 1 > ngpus) ngpus = i + 1;
            }
        } else if (sscanf(line, "s %d %llu %llu", &i, &a, &b) == 3 && i >= 0 && i < MAX_GPUS) {
            gpu_t *g = &gpus[i];
            g->s = grow(g->s, &g->cap_s, g->ns, sizeof(sample_t));
            g->s[g->ns].t = a; g->s[g->ns].v = (unsigned int)b; g->ns++;
            if (a > timeline_len) timeline_len = a;
        } else if (strncmp(line, "t ", 2) == 0) {
            row_t r = {0};
            char *p = line + 2;
            if (sscanf(p, "%d %llu %llu %u %u %u %u %u%n", &i, &r.t, &r.mem_used, &r.power_mw, &r.temp,
                       &r.rx_kb, &r.tx_kb, &r.nproc, &n) < 8 || i < 0 || i >= MAX_GPUS) continue;
            p += n;
            if (r.nproc > MAX_PROCS) r.nproc = MAX_PROCS;
            for (unsigned int k = 0; k < r.nproc; k++) {
                if (sscanf(p, "%u %llu%n", &r.pid[k], &r.pmem[k], &n) < 2) { r.nproc = k; break; }
                p += n;
            }
            gpu_t *g = &gpus[i];
            g->r = grow(g->r, &g->cap_r, g->nr, sizeof(row_t));
            g->r[g->nr++] = r;
            if (r.t > timeline_len) timeline_len = r.t;
        } else if (strcmp(line, "fault no_driver") == 0) fault_no_driver = 1;
        else if (sscanf(line, "fault init_error %d", &n) == 1) fault_init_error = n;
        else if (sscanf(line, "fault lost %d %llu %llu", &i, &a, &b) == 3 && i >= 0 && i < MAX_GPUS) {
            gpus[i].lost_from = a; gpus[i].lost_until = b;
        } else if (sscanf(line, "fault unsupported %63s", word) == 1 && nunsupported < 64) {
            snprintf(unsupported[nunsupported++], 64, "%s", word);
        } else if (sscanf(line, "fault block %63s %d %lf %llu", word, &i, &blocks[nblocks].seconds, &c) == 4 && nblocks < 16) {
            snprintf(blocks[nblocks].fn, 64, "%s", word);
            blocks[nblocks].gpu = i; blocks[nblocks].from = c; nblocks++;
        } else if (sscanf(line, "fault procs_grow %d %d", &i, &n) == 2 && i >= 0 && i < MAX_GPUS) {
            gpus[i].procs_grow = n;
        } else if (strncmp(line, "mig ", 4) == 0) {
            int parent;
            unsigned int gi, ci;
            char uuid[96];
            if (sscanf(line, "mig %d %d %u %u %llu %95s %n", &i, &parent, &gi, &ci, &a, uuid, &n) >= 6 &&
                i >= 0 && i < MAX_GPUS && parent >= 0 && parent < MAX_GPUS && gpus[parent].nmig < 8) {
                gpu_t *g = &gpus[i], *p = &gpus[parent];
                g->index = i; g->configured = 1; g->is_mig = 1; g->parent = parent; g->gi = gi; g->ci = ci;
                g->mem_total = a;
                snprintf(g->uuid, sizeof g->uuid, "%s", uuid);
                snprintf(g->profile, sizeof g->profile, "%s", line + n);
                p->mig_mode = 1; p->mig[p->nmig++] = i;
            }
        } else if (strncmp(line, "gpm ", 4) == 0) {
            double f[7];
            if (sscanf(line, "gpm %d %lf %lf %lf %lf %lf %lf %lf", &i, &f[0], &f[1], &f[2], &f[3], &f[4], &f[5], &f[6]) == 8 &&
                i >= 0 && i < MAX_GPUS) {
                gpus[i].gpm = 1;
                memcpy(gpus[i].gpm_share, f, sizeof f);
            }
        } else if (sscanf(line, "clocks %d %llu %llu %llu", &i, &a, &b, &c) == 4 && i >= 0 && i < MAX_GPUS &&
                   gpus[i].nclocks < 8) {
            gpu_t *g = &gpus[i];
            g->clocks[g->nclocks].from = a; g->clocks[g->nclocks].until = b; g->clocks[g->nclocks].bits = c;
            g->nclocks++;
        } else if (strncmp(line, "xid ", 4) == 0 && nxids < MAX_XIDS) {
            unsigned int gi = 0xFFFFFFFFu, ci = 0xFFFFFFFFu;
            if (sscanf(line, "xid %d %llu %llu %u %u", &i, &a, &b, &gi, &ci) >= 3 && i >= 0 && i < MAX_GPUS) {
                xids[nxids].gpu = i; xids[nxids].at = a; xids[nxids].code = b;
                xids[nxids].gi = gi; xids[nxids].ci = ci; xids[nxids].delivered = 0; nxids++;
            }
        }
    }
    fclose(f);
    for (int k = 0; k < MAX_GPUS; k++) {
        /* the timelines are read by binary search: in time order, lines of one time as written */
        SORT_BY_T(sample_t, gpus[k].s, gpus[k].ns);
        SORT_BY_T(row_t, gpus[k].r, gpus[k].nr);
        handles[k].index = k;
        /* a MIG instance's name is its parent's, with the profile, as NVML names it */
        if (gpus[k].is_mig) {
            char name[96];
            snprintf(name, sizeof name, "%s MIG %s", gpus[gpus[k].parent].name, gpus[k].profile);
            snprintf(gpus[k].name, sizeof gpus[k].name, "%s", name);
        }
    }
}

/* Every call passes through here: faults first, then the answer. */
static nvmlReturn_t enter(const char *fn, nvmlDevice_t dev) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    for (int k = 0; k < nunsupported; k++)
        if (strcmp(unsupported[k], fn) == 0) return NVML_ERROR_NOT_SUPPORTED;
    unsigned long long t = now_us();
    for (int k = 0; k < nblocks; k++)
        if (strcmp(blocks[k].fn, fn) == 0 && t >= blocks[k].from &&
            (blocks[k].gpu < 0 || (dev && dev->index == blocks[k].gpu)))
            usleep((useconds_t)(blocks[k].seconds * 1e6));
    if (dev) {
        if (dev < handles || dev >= handles + MAX_GPUS || !gpus[dev->index].configured) return NVML_ERROR_INVALID_ARGUMENT;
        gpu_t *g = &gpus[dev->index];
        if (g->is_mig) g = &gpus[g->parent]; /* a lost GPU takes its MIG instances with it */
        if (g->lost_until && t >= g->lost_from && t < g->lost_until) return NVML_ERROR_GPU_IS_LOST;
    }
    return NVML_SUCCESS;
}
#define ENTER(dev) do { nvmlReturn_t _r = enter(__func__, dev); if (_r) return _r; } while (0)
/* What a MIG-enabled GPU and its instances do not report (nvml.h): utilization and its samples */
#define NOT_ON_MIG(dev) do { if (gpus[(dev)->index].is_mig || gpus[(dev)->index].mig_mode) return NVML_ERROR_NOT_SUPPORTED; } while (0)
/* What only the parent reports: power, temperature, PCIe */
#define NOT_ON_MIG_HANDLE(dev) do { if (gpus[(dev)->index].is_mig) return NVML_ERROR_NOT_SUPPORTED; } while (0)

static unsigned long long loop_t(unsigned long long t) {
    return (loop_timeline && timeline_len) ? t % (timeline_len + 1) : t;
}

static const row_t *row_at(const gpu_t *g, unsigned long long t) {
    if (!g->nr) return NULL;
    t = loop_t(t);
    size_t lo = 0, hi = g->nr;
    while (hi - lo > 1) { size_t mid = (lo + hi) / 2; if (g->r[mid].t <= t) lo = mid; else hi = mid; }
    return &g->r[lo];
}

/* -- init and system ------------------------------------------------------------------------ */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    if (!loaded || ngpus == 0) { load_config(); loaded = 1; } /* a driver that appears later is found */
    if (fault_no_driver || !getenv("FAKENVML_CONFIG") || ngpus == 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    if (fault_init_error) return fault_init_error;
    static int ever_initialised;
    if (init_delay_us && !ever_initialised) {
        struct timespec ts = { (time_t)(init_delay_us / 1000000ULL), (long)(init_delay_us % 1000000ULL) * 1000L };
        while (nanosleep(&ts, &ts) != 0) {}
    }
    if (!epoch_us) epoch_us = realtime_us();
    ever_initialised = 1;
    initialised++;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    initialised--;
    return NVML_SUCCESS;
}
const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case 0: return "Success";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case 15: return "GPU is lost";
    default: return "Unknown Error";
    }
}
static nvmlReturn_t copy_str(char *dst, unsigned int len, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len) { ENTER(NULL); return copy_str(v, len, driver_version); }
nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned int len) {
    ENTER(NULL);
    char buf[48];
    snprintf(buf, sizeof buf, "12.%s", driver_version);
    return copy_str(v, len, buf);
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { ENTER(NULL); *v = cuda_version; return NVML_SUCCESS; }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { ENTER(NULL); *v = cuda_version; return NVML_SUCCESS; }
nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int len) {
    ENTER(NULL);
    char path[64], buf[256] = {0};
    snprintf(path, sizeof path, "/proc/%u/comm", pid);
    FILE *f = fopen(path, "r");
    if (!f) return NVML_ERROR_NOT_FOUND;
    if (!fgets(buf, sizeof buf, f)) buf[0] = 0;
    fclose(f);
    char *nl = strchr(buf, '\n');
    if (nl) *nl = 0;
    return copy_str(name, len, buf);
}

/* -- devices -------------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { ENTER(NULL); *n = (unsigned int)ngpus; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return nvmlDeviceGetCount_v2(n); }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *h) {
    ENTER(NULL);
    if (i >= (unsigned int)ngpus || !h) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter(__func__, &handles[i]);
    if (r) return r;
    *h = &handles[i];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *h) { return nvmlDeviceGetHandleByIndex_v2(i, h); }
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *h) {
    ENTER(NULL);
    for (int i = 0; i < ngpus; i++)
        if (strcmp(gpus[i].uuid, uuid) == 0) { *h = &handles[i]; return NVML_SUCCESS; }
    return NVML_ERROR_NOT_FOUND;
}
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i) { ENTER(d); *i = (unsigned int)d->index; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) { ENTER(d); return copy_str(name, len, gpus[d->index].name); }
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) { ENTER(d); return copy_str(uuid, len, gpus[d->index].uuid); }
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
    ENTER(d);
    memset(p, 0, sizeof *p);
    p->bus = 0x10 + (unsigned int)d->index;
    p->pciDeviceId = 0x233010DE;
    snprintf(p->busId, sizeof p->busId, "00000000:%02X:00.0", p->bus);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "0000:%02X:00.0", p->bus);
    return NVML_SUCCESS;
}

/* Utilization: the mean of the driver samples in the last util_period_us. */
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    ENTER(d);
    NOT_ON_MIG(d);
    const gpu_t *g = &gpus[d->index];
    unsigned long long t = loop_t(now_us());
    unsigned long long from = t > util_period_us ? t - util_period_us : 0;
    unsigned long long sum = 0, n = 0;
    const sample_t *last = NULL;
    for (size_t k = 0; k < g->ns && g->s[k].t <= t; k++) {
        last = &g->s[k];
        if (g->s[k].t > from) { sum += g->s[k].v; n++; }
    }
    u->gpu = n ? (unsigned int)((sum + n / 2) / n) : (last ? last->v : 0);
    u->memory = u->gpu * 2 / 5;
    return NVML_SUCCESS;
}

static const unsigned long long RESERVED = 512ULL << 20;
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    ENTER(d);
    const gpu_t *g = &gpus[d->index];
    const row_t *r = row_at(g, now_us());
    unsigned long long used = (r ? r->mem_used : 0) + RESERVED; /* v1 "used" includes the reserve */
    m->total = g->mem_total; m->used = used; m->free = g->mem_total - used;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    ENTER(d);
    if (m->version != 0x02000028) return 25; /* ARGUMENT_VERSION_MISMATCH */
    const gpu_t *g = &gpus[d->index];
    const row_t *r = row_at(g, now_us());
    m->total = g->mem_total; m->reserved = RESERVED; m->used = r ? r->mem_used : 0;
    m->free = g->mem_total - m->used - RESERVED;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t d, nvmlBAR1Memory_t *m) {
    ENTER(d);
    m->bar1Total = 128ULL << 30; m->bar1Used = 64ULL << 20; m->bar1Free = m->bar1Total - m->bar1Used;
    return NVML_SUCCESS;
}

/* The first of the unit's utilization samples later than t (on the lap), by binary search. */
static size_t first_after(const gpu_t *g, unsigned long long t) {
    size_t lo = 0, hi = g->ns;
    while (lo < hi) { size_t mid = (lo + hi) / 2; if (g->s[mid].t <= t) lo = mid + 1; else hi = mid; }
    return lo;
}

/* Buffered samples newer than lastSeen (µs on the driver's clock), newest BUFFER_SAMPLES at most. */
nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t d, int type, unsigned long long lastSeen, int *valueType,
                                  unsigned int *count, nvmlSample_t *samples) {
    ENTER(d);
    NOT_ON_MIG(d);
    if (type != 1) return NVML_ERROR_NOT_SUPPORTED; /* only NVML_GPU_UTILIZATION_SAMPLES */
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    const gpu_t *g = &gpus[d->index];
    unsigned long long t = now_us(), span = timeline_len + 1;
    unsigned long long lap = (loop_timeline && timeline_len) ? t / span : 0;
    /* candidates: this lap and the one before, so a loop boundary loses nothing; each lap's range
       found by binary search, as a driver reads its ring of recent samples, never the whole past
       (a scan of the scripted timeline made every call cost what two laps of it hold) */
    static __thread nvmlSample_t found[BUFFER_SAMPLES];
    size_t from[2] = {0, 0}, to[2] = {0, 0};
    unsigned long long base[2] = {0, 0};
    size_t total = 0;
    for (int i = 0; i < 2; i++) {
        long long l = (long long)lap - 1 + i;
        if (l < 0) continue; /* (without a loop, lap is 0: only the timeline itself) */
        base[i] = (unsigned long long)l * span; /* at most t: l is this lap or the one before */
        /* to: the first sample after now; from: the first after lastSeen (and not after to) */
        to[i] = first_after(g, t - base[i]);
        unsigned long long lap_start = BOOT_US + base[i];
        from[i] = lastSeen < lap_start ? 0 : first_after(g, lastSeen - lap_start);
        if (from[i] > to[i]) from[i] = to[i];
        total += to[i] - from[i];
    }
    /* the newest BUFFER_SAMPLES of them, oldest first */
    size_t skip = total > BUFFER_SAMPLES ? total - BUFFER_SAMPLES : 0;
    unsigned int n = 0;
    for (int i = 0; i < 2; i++) {
        size_t k = from[i];
        size_t len = to[i] - from[i];
        if (skip >= len) { skip -= len; continue; }
        k += skip; skip = 0;
        for (; k < to[i]; k++) {
            found[n].timeStamp = BOOT_US + base[i] + g->s[k].t; found[n].sampleValue.uiVal = g->s[k].v; n++;
        }
    }
    if (n == 0) return NVML_ERROR_NOT_FOUND;
    if (valueType) *valueType = 1; /* NVML_VALUE_TYPE_UNSIGNED_INT */
    if (!samples) { *count = n; return NVML_SUCCESS; }
    if (*count < n) n = *count;
    memcpy(samples, found, n * sizeof *samples);
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *p) {
    ENTER(d);
    NOT_ON_MIG_HANDLE(d);
    const row_t *r = row_at(&gpus[d->index], now_us());
    *p = r ? r->power_mw : 0;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *p) { ENTER(d); NOT_ON_MIG_HANDLE(d); *p = gpus[d->index].power_limit_mw; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t d, unsigned int *p) { ENTER(d); *p = gpus[d->index].power_limit_mw; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *t) {
    ENTER(d);
    NOT_ON_MIG_HANDLE(d);
    if (sensor != 0) return NVML_ERROR_NOT_SUPPORTED;
    const row_t *r = row_at(&gpus[d->index], now_us());
    *t = r ? r->temp : 30;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, int counter, unsigned int *v) {
    ENTER(d);
    NOT_ON_MIG_HANDLE(d);
    const row_t *r = row_at(&gpus[d->index], now_us());
    *v = r ? (counter == 1 ? r->rx_kb : r->tx_kb) : 0;
    return NVML_SUCCESS;
}
/* nvml.h's nvmlFieldValue_t; the two fields answered are the PCIe byte counters (each row's
 * KB/s from its time until the next row's, summed, lap after lap when the timeline loops). */
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    int valueType; /* nvmlValueType_t: 3 = unsigned long long */
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;
#define FI_PCIE_COUNT_TX_BYTES 197
#define FI_PCIE_COUNT_RX_BYTES 198
static double *pcie_sum[MAX_GPUS][2]; /* bytes from the first row to each row, per direction */
static double pcie_bytes_until(const gpu_t *g, unsigned long long t, int rx) {
    if (!g->nr || t <= g->r[0].t) return 0;
    double **sum = &pcie_sum[g - gpus][rx];
    if (!*sum) { /* once: the timeline does not change after it is loaded */
        double *s = malloc(g->nr * sizeof(double));
        if (!s) return 0;
        s[0] = 0;
        for (size_t k = 1; k < g->nr; k++)
            s[k] = s[k - 1] + (rx ? g->r[k - 1].rx_kb : g->r[k - 1].tx_kb) * 1024.0 * (double)(g->r[k].t - g->r[k - 1].t) / 1e6;
        *sum = s;
    }
    size_t lo = 0, hi = g->nr;
    while (hi - lo > 1) { size_t mid = (lo + hi) / 2; if (g->r[mid].t <= t) lo = mid; else hi = mid; }
    return (*sum)[lo] + (rx ? g->r[lo].rx_kb : g->r[lo].tx_kb) * 1024.0 * (double)(t - g->r[lo].t) / 1e6;
}
static unsigned long long pcie_count(const gpu_t *g, unsigned long long t, int rx) {
    if (!(loop_timeline && timeline_len)) return (unsigned long long)pcie_bytes_until(g, t, rx);
    unsigned long long span = timeline_len + 1;
    return (unsigned long long)((double)(t / span) * pcie_bytes_until(g, span, rx) + pcie_bytes_until(g, t % span, rx));
}
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t d, int count, nvmlFieldValue_t *values) {
    ENTER(d);
    if (count < 0 || (count > 0 && !values)) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long t = now_us();
    for (int k = 0; k < count; k++) {
        nvmlFieldValue_t *v = &values[k];
        v->timestamp = (long long)(epoch_us + t); /* when the counters were read: the timeline's time */
        v->latencyUsec = 0;
        unsigned int id = v->fieldId;
        if ((id != FI_PCIE_COUNT_TX_BYTES && id != FI_PCIE_COUNT_RX_BYTES) || gpus[d->index].is_mig) {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            continue;
        }
        v->valueType = 3;
        v->value.ullVal = pcie_count(&gpus[d->index], t, id == FI_PCIE_COUNT_RX_BYTES);
        v->nvmlReturn = NVML_SUCCESS;
    }
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t d, int *s) { ENTER(d); *s = 0; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t d, int *m) { ENTER(d); *m = 1; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t d, int *m) { ENTER(d); *m = 0; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t d, int *m) { ENTER(d); *m = 0; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t d, int *m) { ENTER(d); *m = 0; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetDriverModel(nvmlDevice_t d, int *c, int *p) { ENTER(d); (void)c; (void)p; return NVML_ERROR_NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetDriverModel_v2(nvmlDevice_t d, int *c, int *p) { ENTER(d); (void)c; (void)p; return NVML_ERROR_NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t d, unsigned int *s) { ENTER(d); (void)s; return NVML_ERROR_NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t d, unsigned int f, unsigned int *s) { ENTER(d); (void)f; (void)s; return NVML_ERROR_NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int a, int b, unsigned long long *c) { ENTER(d); (void)a; (void)b; (void)c; return NVML_ERROR_NOT_SUPPORTED; }
typedef struct { unsigned int version; int sensorType; int temperature; } nvmlTemperature_v1_t;
nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t d, nvmlTemperature_v1_t *t) {
    ENTER(d);
    if (t->version != (12u | (1u << 24))) return 25; /* ARGUMENT_VERSION_MISMATCH */
    if (t->sensorType != 0) return NVML_ERROR_NOT_SUPPORTED;
    const row_t *r = row_at(&gpus[d->index], now_us());
    t->temperature = r ? (int)r->temp : 30;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t d, unsigned int *u, unsigned int *p) { ENTER(d); *u = 0; *p = 167000; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t d, unsigned int *u, unsigned int *p) { ENTER(d); *u = 0; *p = 167000; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *c) { ENTER(d); *c = type == 2 ? 2619 : 1980; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t d, int type, unsigned int *c) { ENTER(d); *c = type == 2 ? 2619 : 1980; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, void *u, unsigned int *n, unsigned long long t) { ENTER(d); (void)u; (void)n; (void)t; return NVML_ERROR_NOT_SUPPORTED; }

/* Process lists: a first call with too small a buffer answers INSUFFICIENT_SIZE with the count. */
static nvmlReturn_t processes(nvmlDevice_t d, unsigned int *count, void *out, size_t size) {
    gpu_t *g = &gpus[d->index];
    const row_t *r = row_at(g, now_us());
    unsigned int n = r ? r->nproc : 0;
    if (g->procs_grow && n) n += (unsigned int)(g->procs_grow * g->grow_calls++);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (n == 0) { *count = 0; return NVML_SUCCESS; }
    if (!out || *count < n) { *count = n; return NVML_ERROR_INSUFFICIENT_SIZE; }
    for (unsigned int k = 0; k < n; k++) {
        unsigned int pid = k < r->nproc ? r->pid[k] : 900000 + k;
        unsigned long long mem = k < r->nproc ? r->pmem[k] : 1ULL << 20;
        if (size == sizeof(nvmlProcessInfo_t)) {
            nvmlProcessInfo_t *p = (nvmlProcessInfo_t *)out + k;
            p->pid = pid; p->usedGpuMemory = mem;
            p->gpuInstanceId = g->is_mig ? g->gi : 0xFFFFFFFFu;
            p->computeInstanceId = g->is_mig ? g->ci : 0xFFFFFFFFu;
        } else {
            nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)out + k;
            p->pid = pid; p->usedGpuMemory = mem;
        }
    }
    *count = n;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p) { ENTER(d); return processes(d, c, p, sizeof *p); }
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p) { ENTER(d); return processes(d, c, p, sizeof *p); }
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v1_t *p) { ENTER(d); return processes(d, c, p, sizeof *p); }
static nvmlReturn_t none(unsigned int *c) { if (!c) return NVML_ERROR_INVALID_ARGUMENT; *c = 0; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, void *p) { ENTER(d); (void)p; return none(c); }
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, void *p) { ENTER(d); (void)p; return none(c); }
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t d, unsigned int *c, void *p) { ENTER(d); (void)p; return none(c); }

/* -- MIG -------------------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *m) { ENTER(d); *m = (unsigned int)gpus[d->index].is_mig; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *c, unsigned int *p) {
    ENTER(d);
    const gpu_t *g = &gpus[d->index];
    if (g->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->gpm) return NVML_ERROR_NOT_SUPPORTED; /* MIG came with A100/H100; the stand-in ties it to GPM */
    *c = *p = (unsigned int)g->mig_mode;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *n) {
    ENTER(d);
    const gpu_t *g = &gpus[d->index];
    if (g->is_mig || !g->gpm) return NVML_ERROR_NOT_SUPPORTED;
    *n = g->mig_mode ? 7 : 0; /* slots, some empty (NOT_FOUND), as a 7-slice H100 has */
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *mig) {
    ENTER(d);
    const gpu_t *g = &gpus[d->index];
    if (g->is_mig || !g->mig_mode) return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= 7) return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= (unsigned int)g->nmig) return NVML_ERROR_NOT_FOUND;
    *mig = &handles[g->mig[index]];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t d, nvmlDevice_t *parent) {
    ENTER(d);
    if (!gpus[d->index].is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *parent = &handles[gpus[d->index].parent];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id) {
    ENTER(d);
    if (!gpus[d->index].is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *id = gpus[d->index].gi;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id) {
    ENTER(d);
    if (!gpus[d->index].is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *id = gpus[d->index].ci;
    return NVML_SUCCESS;
}

/* -- GPM (nvml.h: nvmlGpmSupport_t, nvmlGpmMetricsGet_t) -------------------------------------------- */

typedef struct { unsigned int version, isSupportedDevice; } nvmlGpmSupport_t;
typedef struct nvmlGpmSample_st { int unit; unsigned long long t; int taken; } *nvmlGpmSample_t;
typedef struct { char *shortName, *longName, *unit; } nvmlGpmMetricInfo_t;
typedef struct { unsigned int metricId; nvmlReturn_t nvmlReturn; double value; nvmlGpmMetricInfo_t metricInfo; } nvmlGpmMetric_t;
#define NVML_GPM_METRIC_MAX 477
typedef struct {
    unsigned int version, numMetrics;
    nvmlGpmSample_t sample1, sample2;
    nvmlGpmMetric_t metrics[NVML_GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;

nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t d, nvmlGpmSupport_t *s) {
    ENTER(d);
    if (!s || s->version != 1) return 25; /* ARGUMENT_VERSION_MISMATCH */
    s->isSupportedDevice = (unsigned int)gpus[d->index].gpm;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *s) {
    ENTER(NULL);
    if (!s) return NVML_ERROR_INVALID_ARGUMENT;
    *s = calloc(1, sizeof **s);
    return *s ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}
nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t s) { ENTER(NULL); free(s); return NVML_SUCCESS; }
static nvmlReturn_t take_gpm(int unit, nvmlGpmSample_t s) {
    if (!gpus[unit].gpm) return NVML_ERROR_NOT_SUPPORTED;
    if (!s) return NVML_ERROR_INVALID_ARGUMENT;
    s->unit = unit; s->t = now_us(); s->taken = 1;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t d, nvmlGpmSample_t s) { ENTER(d); return take_gpm(d->index, s); }
nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t d, unsigned int gi, nvmlGpmSample_t s) {
    ENTER(d);
    const gpu_t *g = &gpus[d->index];
    if (!g->gpm) return NVML_ERROR_NOT_SUPPORTED;
    for (int k = 0; k < g->nmig; k++)
        if (gpus[g->mig[k]].gi == gi) return take_gpm(g->mig[k], s);
    return NVML_ERROR_NOT_FOUND;
}

/* The mean of the unit's utilization samples in (t1, t2], 0-100: what GRAPHICS_UTIL counts (the last
   value before t2 where none lies between). The range is found by binary search: a driver computes
   GPM's metrics from two counter snapshots, never from the whole past. */
static double mean_util(const gpu_t *g, unsigned long long t1, unsigned long long t2) {
    unsigned long long a = loop_t(t1), b = loop_t(t2);
    if (b < a) a = 0; /* the loop wrapped: the lap's start */
    size_t from = first_after(g, a), to = first_after(g, b);
    if (from >= to) return to ? (double)g->s[to - 1].v : 0.0;
    double sum = 0;
    for (size_t k = from; k < to; k++) sum += g->s[k].v;
    return sum / (double)(to - from);
}
static char *METRIC_NAMES[] = {"", "gr_util", "sm_util", "sm_occupancy"};

nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *m) {
    ENTER(NULL);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != 1) return 25;
    if (!m->sample1 || !m->sample2 || !m->sample1->taken || !m->sample2->taken ||
        m->sample1->unit != m->sample2->unit || m->numMetrics > NVML_GPM_METRIC_MAX)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlGpmSample_t s1 = m->sample1, s2 = m->sample2;
    if (s2->t < s1->t) { nvmlGpmSample_t x = s1; s1 = s2; s2 = x; }
    const gpu_t *g = &gpus[s1->unit];
    double util = mean_util(g, s1->t, s2->t);
    const row_t *r = row_at(g->is_mig ? &gpus[g->parent] : g, s2->t);
    for (unsigned int k = 0; k < m->numMetrics; k++) {
        nvmlGpmMetric_t *x = &m->metrics[k];
        x->nvmlReturn = NVML_SUCCESS;
        x->metricInfo.shortName = x->metricInfo.longName = METRIC_NAMES[0];
        x->metricInfo.unit = METRIC_NAMES[0];
        if (s2->t - s1->t < 100000) { x->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT; continue; } /* > 100 ms apart */
        switch (x->metricId) {
        case 1: x->value = util; x->metricInfo.shortName = METRIC_NAMES[1]; break;
        case 2: x->value = util * g->gpm_share[0]; x->metricInfo.shortName = METRIC_NAMES[2]; break;
        case 3: x->value = util * g->gpm_share[1]; x->metricInfo.shortName = METRIC_NAMES[3]; break;
        case 5: x->value = util * g->gpm_share[2]; break;
        case 10: x->value = util * g->gpm_share[3]; break;
        case 13: x->value = util * g->gpm_share[4]; break;
        case 12: x->value = util * g->gpm_share[5]; break;
        case 11: x->value = util * g->gpm_share[6]; break;
        case 20: x->value = r ? r->tx_kb / 1024.0 : 0; break; /* MiB/s */
        case 21: x->value = r ? r->rx_kb / 1024.0 : 0; break;
        case 60: x->value = g->is_mig ? 0 : (r ? r->rx_kb / 2048.0 : 0); break;
        case 61: x->value = g->is_mig ? 0 : (r ? r->tx_kb / 2048.0 : 0); break;
        default: x->nvmlReturn = NVML_ERROR_NOT_SUPPORTED; x->value = 0;
        }
    }
    return NVML_SUCCESS;
}

/* -- clock events ------------------------------------------------------------------------------ */

static nvmlReturn_t clock_reasons(nvmlDevice_t d, unsigned long long *bits) {
    const gpu_t *g = &gpus[d->index];
    if (g->is_mig) g = &gpus[g->parent];
    unsigned long long t = now_us();
    for (int k = 0; k < g->nclocks; k++)
        if (t >= g->clocks[k].from && t < g->clocks[k].until) { *bits = g->clocks[k].bits; return NVML_SUCCESS; }
    nvmlUtilization_t u = {0, 0};
    if (!g->mig_mode) nvmlDeviceGetUtilizationRates(&handles[g->index], &u);
    *bits = u.gpu == 0 ? 0x1ULL : 0; /* GpuIdle */
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *bits) { ENTER(d); return clock_reasons(d, bits); }
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *bits) { ENTER(d); return clock_reasons(d, bits); }

/* -- events (XIDs) ----------------------------------------------------------------------------- */

typedef struct nvmlEventSet_st { unsigned long long registered[MAX_GPUS]; } *nvmlEventSet_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
#define XID_CRITICAL 0x8ULL

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    ENTER(NULL);
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    *set = calloc(1, sizeof **set);
    return *set ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}
nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) { ENTER(NULL); free(set); return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
    ENTER(d);
    if (gpus[d->index].is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *types = XID_CRITICAL | 0x1ULL /* single-bit ECC */ | 0x2ULL /* double-bit ECC */;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
    ENTER(d);
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    if (gpus[d->index].is_mig) return NVML_ERROR_NOT_SUPPORTED;
    if (types & ~(XID_CRITICAL | 0x3ULL)) return NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&event_lock);
    set->registered[d->index] |= types;
    pthread_mutex_unlock(&event_lock);
    return NVML_SUCCESS;
}
/* Delivers each scripted XID once, to the first registered set that waits after its time; no GPU
 * loss check here: a GPU that falls off the bus reports its XID (79) while it is lost. Blocks as a
 * real driver does (it sleeps in the kernel): one sleep until the next scripted XID or the timeout,
 * never a polling loop, so an idle daemon's waiting thread costs what it would on a GPU machine. */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    ENTER(NULL);
    if (!set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    /* the timeout runs on the real clock; the scripted times on the timeline's (which may be frozen) */
    const char *frozen = getenv("FAKENVML_NOW_US");
    int still = frozen && *frozen;
    unsigned long long deadline = realtime_us() + (unsigned long long)timeout_ms * 1000ULL;
    for (;;) {
        unsigned long long t = now_us(), real = realtime_us();
        unsigned long long left = deadline > real ? deadline - real : 0;
        pthread_mutex_lock(&event_lock);
        for (int k = 0; k < nxids; k++) {
            if (xids[k].delivered || !(set->registered[xids[k].gpu] & XID_CRITICAL)) continue;
                if (t < xids[k].at) {
                if (!still && xids[k].at - t < left) left = xids[k].at - t;
                continue;
            }
            xids[k].delivered = 1;
            data->device = &handles[xids[k].gpu];
            data->eventType = XID_CRITICAL;
            data->eventData = xids[k].code;
            data->gpuInstanceId = xids[k].gi;
            data->computeInstanceId = xids[k].ci;
            pthread_mutex_unlock(&event_lock);
            return NVML_SUCCESS;
        }
        pthread_mutex_unlock(&event_lock);
        if (real >= deadline) return NVML_ERROR_TIMEOUT;
        /* a frozen timeline moves only when the test sets FAKENVML_NOW_US: look again every 20 ms */
        if (still && left > 20000ULL) left = 20000ULL;
        struct timespec ts = {(time_t)(left / 1000000ULL), (long)(left % 1000000ULL) * 1000L};
        while (nanosleep(&ts, &ts) != 0) {}
    }
}
nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    return nvmlEventSetWait_v2(set, data, timeout_ms);
}

/* Hopper (9.0) where GPM is configured, Ampere (8.0) otherwise: nvitop asks once MIG is answered. */
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
    ENTER(d);
    *major = gpus[d->index].gpm ? 9 : 8;
    *minor = 0;
    return NVML_SUCCESS;
}
