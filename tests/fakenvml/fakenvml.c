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
 *   s I T_US PERCENT                             a driver utilization sample
 *   t I T_US MEMUSED POWER_MW TEMP RX_KB TX_KB N [PID MEM]*N   device state from T on
 *   fault no_driver                              nvmlInit fails with DRIVER_NOT_LOADED
 *   fault init_error CODE                        nvmlInit fails with CODE (4: NO_PERMISSION)
 *   fault lost I FROM_US UNTIL_US                GPU I reports GPU_IS_LOST in [FROM, UNTIL)
 *   fault unsupported FUNCTION                   FUNCTION answers NOT_SUPPORTED
 *   fault block FUNCTION I SECONDS FROM_US       FUNCTION on GPU I (-1: any) sleeps SECONDS once t >= FROM
 *   fault procs_grow I N                         GPU I's process list grows by N between two calls
 *
 * Build: gcc -shared -fPIC -O2 -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1 fakenvml.c
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NOT_FOUND = 6, NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9, NVML_ERROR_GPU_IS_LOST = 15, NVML_ERROR_UNKNOWN = 999,
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
typedef struct {
    int index;
    char uuid[96], name[96];
    unsigned long long mem_total;
    unsigned int power_limit_mw;
    sample_t *s; size_t ns, cap_s;
    row_t *r; size_t nr, cap_r;
    unsigned long long lost_from, lost_until;
    int procs_grow, grow_calls;
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
static unsigned long long epoch_us, util_period_us = 166667, timeline_len;
static char driver_version[32] = "560.35.03";
static int cuda_version = 12060;
static char unsupported[64][64];
static int nunsupported;
static struct { char fn[64]; int gpu; double seconds; unsigned long long from; } blocks[16];
static int nblocks;

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
        else if (sscanf(line, "driver %31s", driver_version) == 1) {}
        else if (sscanf(line, "cuda %d", &cuda_version) == 1) {}
        else if (strncmp(line, "gpu ", 4) == 0) {
            unsigned int limit;
            char uuid[96];
            if (sscanf(line, "gpu %d %llu %u %95s %n", &i, &a, &limit, uuid, &n) >= 4 && i >= 0 && i < MAX_GPUS) {
                gpu_t *g = &gpus[i];
                g->index = i; g->mem_total = a; g->power_limit_mw = limit;
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
        }
    }
    fclose(f);
    for (int k = 0; k < MAX_GPUS; k++) handles[k].index = k;
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
        if (dev < handles || dev >= handles + ngpus) return NVML_ERROR_INVALID_ARGUMENT;
        gpu_t *g = &gpus[dev->index];
        if (g->lost_until && t >= g->lost_from && t < g->lost_until) return NVML_ERROR_GPU_IS_LOST;
    }
    return NVML_SUCCESS;
}
#define ENTER(dev) do { nvmlReturn_t _r = enter(__func__, dev); if (_r) return _r; } while (0)

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
    if (!epoch_us) epoch_us = realtime_us();
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

/* Buffered samples newer than lastSeen (µs on the driver's clock), newest BUFFER_SAMPLES at most. */
nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t d, int type, unsigned long long lastSeen, int *valueType,
                                  unsigned int *count, nvmlSample_t *samples) {
    ENTER(d);
    if (type != 1) return NVML_ERROR_NOT_SUPPORTED; /* only NVML_GPU_UTILIZATION_SAMPLES */
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    const gpu_t *g = &gpus[d->index];
    unsigned long long t = now_us(), span = timeline_len + 1;
    unsigned long long lap = (loop_timeline && timeline_len) ? t / span : 0;
    /* candidates: this lap and the one before, so a loop boundary loses nothing */
    static __thread nvmlSample_t found[2 * BUFFER_SAMPLES];
    unsigned int n = 0;
    for (long long l = (long long)lap - 1; l <= (long long)lap; l++) {
        if (l < 0) continue;
        for (size_t k = 0; k < g->ns; k++) {
            unsigned long long abs_t = (unsigned long long)l * (loop_timeline ? span : 0) + g->s[k].t;
            if (abs_t > t) break;
            unsigned long long ts = BOOT_US + abs_t;
            if (ts <= lastSeen) continue;
            if (n == 2 * BUFFER_SAMPLES) { memmove(found, found + 1, (n - 1) * sizeof *found); n--; }
            found[n].timeStamp = ts; found[n].sampleValue.uiVal = g->s[k].v; n++;
        }
        if (!loop_timeline) break;
    }
    unsigned int first = n > BUFFER_SAMPLES ? n - BUFFER_SAMPLES : 0;
    n -= first;
    if (n == 0) return NVML_ERROR_NOT_FOUND;
    if (valueType) *valueType = 1; /* NVML_VALUE_TYPE_UNSIGNED_INT */
    if (!samples) { *count = n; return NVML_SUCCESS; }
    if (*count < n) n = *count;
    memcpy(samples, found + first, n * sizeof *samples);
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *p) {
    ENTER(d);
    const row_t *r = row_at(&gpus[d->index], now_us());
    *p = r ? r->power_mw : 0;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *p) { ENTER(d); *p = gpus[d->index].power_limit_mw; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t d, unsigned int *p) { ENTER(d); *p = gpus[d->index].power_limit_mw; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *t) {
    ENTER(d);
    if (sensor != 0) return NVML_ERROR_NOT_SUPPORTED;
    const row_t *r = row_at(&gpus[d->index], now_us());
    *t = r ? r->temp : 30;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, int counter, unsigned int *v) {
    ENTER(d);
    const row_t *r = row_at(&gpus[d->index], now_us());
    *v = r ? (counter == 1 ? r->rx_kb : r->tx_kb) : 0;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t d, int *s) { ENTER(d); *s = 0; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t d, int *m) { ENTER(d); *m = 1; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t d, int *m) { ENTER(d); *m = 0; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t d, int *m) { ENTER(d); *m = 0; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t d, int *m) { ENTER(d); *m = 0; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *m) { ENTER(d); *m = 0; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *c, unsigned int *p) { ENTER(d); (void)c; (void)p; return NVML_ERROR_NOT_SUPPORTED; }
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
            p->pid = pid; p->usedGpuMemory = mem; p->gpuInstanceId = p->computeInstanceId = 0xFFFFFFFFu;
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
