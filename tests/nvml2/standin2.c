/*
 * standin2.c: a second, independent stand-in for NVIDIA's libnvidia-ml.so.1.
 *
 * Written from NVIDIA's nvml.h (the ABI: signatures, struct layouts, return codes) and the
 * ctypes structs of nvidia-ml-py 13 (pynvml.py), so that the real pynvml can load it through
 * LD_LIBRARY_PATH and poll N simulated Hopper GPUs (env NVML2_GPUS, default 8, at most 64).
 *
 *   gcc -shared -fPIC -O2 -Wall -Wextra -Werror -pthread -Wl,-soname,libnvidia-ml.so.1 \
 *       -o libnvidia-ml.so.1 standin2.c
 *
 * Usage from Python (build, environment for N GPUs, the calls answered): tests/nvml2/README.md;
 * tests/nvml2/build.py's environment(gpus, now_us=..., xids=...) sets the variables below.
 *
 * Time. Every reading is a pure function of (GPU index, timeline time). Timeline time is
 * CLOCK_REALTIME in microseconds, unless NVML2_NOW_US is set and non-empty: then that value is the
 * time. It is read with getenv on every call, so a benchmark can move time from Python
 * (os.environ["NVML2_NOW_US"] = str(t)). Event waits always time out on the real (monotonic) clock.
 *
 * GPUs, by index k % 8:
 *   0-3  fed:     busy bursts of ~96% of a 2-3.75 s period, gaps of 0-5%: ~94% on average
 *   4-6  starved: bursts of 40% of a 1.2-1.8 s period, idle between: ~40%, bursty samples
 *   7    idle:    0%, no processes, idle power
 * Busy GPUs run 1 or 2 processes with fixed pids (100000+k, and 200000+k on even fed GPUs).
 *
 * Utilization samples (nvmlDeviceGetSamples): one every 166,667 us of timeline time per GPU, on a
 * grid whose phase depends on the GPU; the driver's ring holds the newest RING_SAMPLES of them.
 * The ring is virtual (each value is computed from the sample's index), so it costs no memory and
 * nothing has to run between calls.
 *
 * GPM: a sample records the time and the GPU's cumulative busy time (a counter that only grows);
 * nvmlGpmMetricsGet turns two samples into activity over the interval between them.
 *
 * XID events (nvmlEventSetWait_v2): scripted by NVML2_XIDS, a comma-separated list of
 * GPU:XID@T_US, each an XID critical error on GPU index GPU at timeline time T_US (e.g.
 * "3:79@1700000000500000,0:48@1700000001000000"). It is read with getenv on every wait, like
 * NVML2_NOW_US. An event set sees the events timed after its creation, in time order (list order
 * among equal times), once each, on the GPUs registered for XID events on it.
 *
 * Threads: one mutex guards all shared state (init count, event sets, GPM sample slots); calls
 * hold it while they run (they are short). nvmlEventSetWait blocks on a condition variable,
 * releasing the mutex meanwhile, until the next scripted event is due (timeline on the real clock)
 * or the timeout passes; it never polls. With NVML2_NOW_US set, time only moves when the caller
 * moves it, so a blocked wait sees a newly due event at its timeout, or at once in the next wait.
 * Nothing is allocated per call: event sets and GPM samples come from fixed pools.
 */

#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- nvml.h: return codes ------------------------------------------------------------------ */

typedef enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_DEPRECATED = 26,
    NVML_ERROR_NOT_READY = 27,
    NVML_ERROR_GPU_NOT_FOUND = 28,
    NVML_ERROR_INVALID_STATE = 29,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

/* ---- nvml.h: the types this library's functions take ---------------------------------------- */

typedef struct nvml2_device *nvmlDevice_t;     /* opaque to callers: nvmlDevice_st in nvml.h */
typedef struct nvml2_event_set *nvmlEventSet_t; /* nvmlEventSet_st */
typedef struct nvml2_gpm_sample *nvmlGpmSample_t; /* nvmlGpmSample_st */

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used; /* v1: includes the driver's reserve */
} nvmlMemory_t;

typedef struct {
    unsigned int version; /* nvmlMemory_v2 */
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

/* NVML_STRUCT_VERSION(Memory, 2): the struct's size with the version in the top byte */
#define NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t; /* _v3 functions take the same struct */

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    signed int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned long long timeStamp; /* CPU timestamp, us */
    nvmlValue_t sampleValue;
} nvmlSample_t;

typedef enum {
    NVML_TOTAL_POWER_SAMPLES = 0,
    NVML_GPU_UTILIZATION_SAMPLES = 1,
    NVML_MEMORY_UTILIZATION_SAMPLES = 2,
    NVML_ENC_UTILIZATION_SAMPLES = 3,
    NVML_DEC_UTILIZATION_SAMPLES = 4,
    NVML_PROCESSOR_CLK_SAMPLES = 5,
    NVML_MEMORY_CLK_SAMPLES = 6,
    NVML_MODULE_POWER_SAMPLES = 7,
    NVML_JPG_UTILIZATION_SAMPLES = 8,
    NVML_OFA_UTILIZATION_SAMPLES = 9,
    NVML_SAMPLINGTYPE_COUNT
} nvmlSamplingType_t;

typedef enum {
    NVML_VALUE_TYPE_DOUBLE = 0,
    NVML_VALUE_TYPE_UNSIGNED_INT = 1
} nvmlValueType_t;

typedef enum { NVML_TEMPERATURE_GPU = 0 } nvmlTemperatureSensors_t;
typedef enum { NVML_PCIE_UTIL_TX_BYTES = 0, NVML_PCIE_UTIL_RX_BYTES = 1 } nvmlPcieUtilCounter_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
} nvmlEventData_v1_t; /* what the unversioned nvmlEventSetWait fills */

/* nvmlEventType* masks */
#define EV_SINGLE_BIT_ECC 0x1ULL
#define EV_DOUBLE_BIT_ECC 0x2ULL
#define EV_XID_CRITICAL 0x8ULL
#define EV_DRAM_RETIREMENT 0x400ULL
#define EV_DRAM_RETIREMENT_FAILURE 0x800ULL
#define EV_NONFATAL_POISON 0x1000ULL
#define EV_FATAL_POISON 0x2000ULL
#define SUPPORTED_EVENTS                                                                           \
    (EV_SINGLE_BIT_ECC | EV_DOUBLE_BIT_ECC | EV_XID_CRITICAL | EV_DRAM_RETIREMENT |                \
     EV_DRAM_RETIREMENT_FAILURE | EV_NONFATAL_POISON | EV_FATAL_POISON)

/* nvmlClocksEventReason* bits */
#define CLOCKS_EVENT_GPU_IDLE 0x1ULL
#define CLOCKS_EVENT_SW_POWER_CAP 0x4ULL

/* ---- nvml.h: GPM ------------------------------------------------------------------------------ */

#define NVML_GPM_METRIC_MAX 477 /* as nvidia-ml-py 13's c_nvmlGpmMetricsGet_t */
#define NVML_GPM_METRICS_GET_VERSION 1
#define NVML_GPM_SUPPORT_VERSION 1

typedef struct {
    unsigned int metricId;   /* IN */
    nvmlReturn_t nvmlReturn; /* OUT */
    double value;            /* OUT */
    struct {
        char *shortName;
        char *longName;
        char *unit;
    } metricInfo; /* OUT */
} nvmlGpmMetric_t;

typedef struct {
    unsigned int version;
    unsigned int numMetrics;
    nvmlGpmSample_t sample1;
    nvmlGpmSample_t sample2;
    nvmlGpmMetric_t metrics[NVML_GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;

typedef struct {
    unsigned int version;
    unsigned int isSupportedDevice;
} nvmlGpmSupport_t;

enum {
    GPM_GRAPHICS_UTIL = 1,
    GPM_SM_UTIL = 2,
    GPM_SM_OCCUPANCY = 3,
    GPM_INTEGER_UTIL = 4,
    GPM_ANY_TENSOR_UTIL = 5,
    GPM_DFMA_TENSOR_UTIL = 6,
    GPM_HMMA_TENSOR_UTIL = 7,
    GPM_DMMA_TENSOR_UTIL = 8,
    GPM_IMMA_TENSOR_UTIL = 9,
    GPM_DRAM_BW_UTIL = 10,
    GPM_FP64_UTIL = 11,
    GPM_FP32_UTIL = 12,
    GPM_FP16_UTIL = 13,
    GPM_PCIE_TX_PER_SEC = 20,
    GPM_PCIE_RX_PER_SEC = 21,
    GPM_NVDEC_0_UTIL = 30,
    GPM_NVOFA_1_UTIL = 51,
    GPM_NVLINK_TOTAL_RX_PER_SEC = 60,
    GPM_NVLINK_TOTAL_TX_PER_SEC = 61,
    GPM_NVLINK_L0_RX_PER_SEC = 62,
    GPM_NVLINK_L17_TX_PER_SEC = 97
};

/* The ABI pynvml's ctypes structs expect (x86-64 and aarch64, LP64). */
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t");
_Static_assert(NVML_MEMORY_V2 == 0x02000028u, "nvmlMemory_v2 version");
_Static_assert(sizeof(nvmlProcessInfo_v2_t) == 24, "nvmlProcessInfo_v2_t");
_Static_assert(sizeof(nvmlSample_t) == 16, "nvmlSample_t");
_Static_assert(sizeof(nvmlEventData_t) == 32, "nvmlEventData_t");
_Static_assert(sizeof(nvmlGpmMetric_t) == 40, "nvmlGpmMetric_t");
_Static_assert(offsetof(nvmlGpmMetric_t, value) == 8, "nvmlGpmMetric_t.value");
_Static_assert(offsetof(nvmlGpmMetricsGet_t, sample1) == 8, "nvmlGpmMetricsGet_t.sample1");
_Static_assert(offsetof(nvmlGpmMetricsGet_t, metrics) == 24, "nvmlGpmMetricsGet_t.metrics");
_Static_assert(sizeof(nvmlGpmMetricsGet_t) == 24 + 40 * NVML_GPM_METRIC_MAX, "nvmlGpmMetricsGet_t");

/* ---- the simulated machine -------------------------------------------------------------------- */

#define MAX_GPUS 64
#define DEFAULT_GPUS 8
#define SAMPLE_PERIOD_US 166667ULL /* 1/6 s: the driver's utilization sampling period */
#define RING_SAMPLES 120u          /* samples the driver keeps per GPU (20 s) */
#define UTIL_WINDOW 6u             /* nvmlDeviceGetUtilizationRates: the last second's samples */
#define MAX_EVENT_SETS 64
#define MAX_GPM_SAMPLES 4096
#define MAX_PROCS 2
#define MAX_XIDS 256 /* scripted XID events read from NVML2_XIDS */

#define DRIVER_VERSION "550.90.07"
#define NVML_VERSION "12.550.90.07"
#define CUDA_DRIVER_VERSION 12040
#define GPU_NAME "NVIDIA H100 80GB HBM3"
#define MEM_TOTAL 85520809984ULL /* 81559 MiB */
#define MEM_RESERVED 536870912ULL /* 512 MiB kept by the driver and firmware */
#define POWER_LIMIT_MW 700000u
#define IDLE_POWER_MW 68000u
#define MIB (1024ULL * 1024ULL)
#define GIB (1024ULL * MIB)

enum kind { FED, STARVED, IDLE };

struct nvml2_device {
    unsigned int index;
    enum kind kind;
    /* bursts: busy for the first busy_us of every period_us, shifted by offset_us */
    uint64_t period_us, busy_us, offset_us;
    uint64_t grid_us; /* the sampling grid's phase: sample n is at grid_us + n * SAMPLE_PERIOD_US */
    unsigned int busy_lo, busy_hi, gap_lo, gap_hi; /* sample values, percent */
    unsigned int mem_util_pct;  /* memory utilization as a percentage of gpu utilization */
    unsigned int nprocs;
    unsigned int pid[MAX_PROCS];
    unsigned long long proc_mem[MAX_PROCS];
    /* GPM: each metric as a percentage of graphics activity */
    unsigned int sm_pct, occupancy_pct, tensor_pct, dram_pct, fp16_pct, fp32_pct, fp64_pct, int_pct;
    unsigned int nvlink_mib_s; /* NVLink MiB/s (each direction) while busy */
    char name[64];
    char uuid[80];
};

struct nvml2_event_set {
    int in_use;
    int closing;    /* freed (or NVML shut down) while a thread waits: released by the last waiter */
    int waiters;
    unsigned long long mask[MAX_GPUS]; /* event types registered per GPU */
    /* the last event delivered (or the set's creation): (timeline time, position in NVML2_XIDS) */
    uint64_t seen_us;
    int seen_pos;
    pthread_cond_t wake;
};

struct nvml2_gpm_sample {
    int in_use;
    int filled;
    unsigned int gpu;
    uint64_t t_us;
    uint64_t busy_us; /* cumulative busy time of the GPU at t_us */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static unsigned int g_inits;   /* nvmlInit calls not yet matched by nvmlShutdown */
static unsigned int g_count;   /* GPUs, fixed at the first nvmlInit */
static struct nvml2_device g_dev[MAX_GPUS];
static struct nvml2_event_set g_sets[MAX_EVENT_SETS];
static struct nvml2_gpm_sample g_gpm[MAX_GPM_SAMPLES];

static void init_once(void)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    for (int i = 0; i < MAX_EVENT_SETS; i++)
        pthread_cond_init(&g_sets[i].wake, &attr);
    pthread_condattr_destroy(&attr);
}

/* splitmix64: a well-mixed 64-bit hash, so that "noise" is reproducible */
static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

static uint64_t now_us(void)
{
    const char *fixed = getenv("NVML2_NOW_US");
    if (fixed != NULL && fixed[0] != '\0') {
        char *end = NULL;
        unsigned long long v = strtoull(fixed, &end, 10);
        if (end != fixed)
            return v;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000ULL + (uint64_t)ts.tv_nsec / 1000ULL;
}

static unsigned int gpus_from_env(void)
{
    const char *s = getenv("NVML2_GPUS");
    if (s == NULL || s[0] == '\0')
        return DEFAULT_GPUS;
    char *end = NULL;
    long n = strtol(s, &end, 10);
    if (end == s || n < 0)
        return DEFAULT_GPUS;
    return n > MAX_GPUS ? MAX_GPUS : (unsigned int)n;
}

static void setup_device(struct nvml2_device *d, unsigned int k)
{
    uint64_t h = mix(0x6e766d6c32ULL + k);
    unsigned int slot = k % 8;
    memset(d, 0, sizeof(*d));
    d->index = k;
    d->kind = slot < 4 ? FED : slot < 7 ? STARVED : IDLE;
    d->grid_us = (k * 20833ULL + (h & 0xffff)) % SAMPLE_PERIOD_US;
    switch (d->kind) {
    case FED:
        d->period_us = 2000000ULL + 250000ULL * slot + (h >> 20) % 100000ULL;
        d->busy_us = d->period_us * 96 / 100;
        d->busy_lo = 94, d->busy_hi = 100, d->gap_lo = 0, d->gap_hi = 5;
        d->mem_util_pct = 55;
        d->nprocs = (k % 2 == 0) ? 2 : 1;
        d->proc_mem[0] = 62 * GIB + k * GIB;
        d->sm_pct = 93, d->occupancy_pct = 58, d->tensor_pct = 64, d->dram_pct = 47;
        d->fp16_pct = 9, d->fp32_pct = 16, d->fp64_pct = 1, d->int_pct = 11;
        d->nvlink_mib_s = 96000;
        break;
    case STARVED:
        d->period_us = 1200000ULL + 300000ULL * (slot - 4) + (h >> 20) % 50000ULL;
        d->busy_us = d->period_us * 40 / 100;
        d->busy_lo = 86, d->busy_hi = 100, d->gap_lo = 0, d->gap_hi = 3;
        d->mem_util_pct = 35;
        d->nprocs = 1;
        d->proc_mem[0] = 34 * GIB + (slot - 4) * 2 * GIB;
        d->sm_pct = 88, d->occupancy_pct = 37, d->tensor_pct = 45, d->dram_pct = 30;
        d->fp16_pct = 6, d->fp32_pct = 14, d->fp64_pct = 1, d->int_pct = 9;
        d->nvlink_mib_s = 30000;
        break;
    case IDLE:
        d->period_us = 1000000ULL;
        d->busy_us = 0;
        d->nprocs = 0;
        break;
    }
    d->offset_us = d->period_us ? (h >> 8) % d->period_us : 0;
    if (d->nprocs > 0)
        d->pid[0] = 100000u + k;
    if (d->nprocs > 1) {
        d->pid[1] = 200000u + k;
        d->proc_mem[1] = 512 * MIB;
    }
    snprintf(d->name, sizeof(d->name), "%s", GPU_NAME);
    uint64_t a = mix(h), b = mix(a);
    snprintf(d->uuid, sizeof(d->uuid), "GPU-%08x-%04x-%04x-%04x-%08x%04x", (unsigned int)(a >> 32),
             (unsigned int)(a >> 16) & 0xffffu, 0x4000u | ((unsigned int)a & 0x0fffu),
             0x8000u | ((unsigned int)(b >> 48) & 0x3fffu), (unsigned int)(b & 0xffffffffu), k);
}

/* ---- the timeline: what each GPU does at a moment ----------------------------------------------- */

static int busy_at(const struct nvml2_device *d, uint64_t t)
{
    return d->busy_us > 0 && (t + d->offset_us) % d->period_us < d->busy_us;
}

/* Busy time from the epoch to t (us): a counter that only grows, as GPM's are. */
static uint64_t busy_total(const struct nvml2_device *d, uint64_t t)
{
    if (d->busy_us == 0)
        return 0;
    uint64_t s = t + d->offset_us;
    uint64_t in_period = s % d->period_us;
    return (s / d->period_us) * d->busy_us + (in_period < d->busy_us ? in_period : d->busy_us);
}

/* Index of the newest utilization sample at time t; -1 before the first. */
static int64_t newest_sample(const struct nvml2_device *d, uint64_t t)
{
    if (t < d->grid_us)
        return -1;
    return (int64_t)((t - d->grid_us) / SAMPLE_PERIOD_US);
}

static uint64_t sample_time(const struct nvml2_device *d, int64_t n)
{
    return d->grid_us + (uint64_t)n * SAMPLE_PERIOD_US;
}

/* GPU utilization (percent) of sample n. */
static unsigned int sample_util(const struct nvml2_device *d, int64_t n)
{
    if (d->kind == IDLE)
        return 0;
    uint64_t noise = mix(((uint64_t)d->index << 48) ^ (uint64_t)n);
    if (busy_at(d, sample_time(d, n)))
        return d->busy_lo + (unsigned int)(noise % (d->busy_hi - d->busy_lo + 1));
    return d->gap_lo + (unsigned int)(noise % (d->gap_hi - d->gap_lo + 1));
}

/* Mean utilization of the last UTIL_WINDOW samples at time t (0 before the first). */
static unsigned int util_now(const struct nvml2_device *d, uint64_t t)
{
    int64_t newest = newest_sample(d, t);
    if (newest < 0)
        return 0;
    unsigned int sum = 0, n = 0;
    for (int64_t i = newest; i >= 0 && n < UTIL_WINDOW; i--, n++)
        sum += sample_util(d, i);
    return (sum + n / 2) / n;
}

static unsigned int power_mw(unsigned int util)
{
    unsigned int p = IDLE_POWER_MW + util * 6000u;
    return p > POWER_LIMIT_MW ? POWER_LIMIT_MW : p;
}

static unsigned long long procs_memory(const struct nvml2_device *d)
{
    unsigned long long sum = 0;
    for (unsigned int i = 0; i < d->nprocs; i++)
        sum += d->proc_mem[i];
    return sum;
}

/* ---- checks every call makes (g_lock held) ------------------------------------------------------ */

static nvmlReturn_t check_init(void)
{
    return g_inits > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

static nvmlReturn_t check_device(nvmlDevice_t device)
{
    if (g_inits == 0)
        return NVML_ERROR_UNINITIALIZED;
    uintptr_t p = (uintptr_t)device, base = (uintptr_t)&g_dev[0];
    if (p < base || p >= (uintptr_t)&g_dev[g_count] || (p - base) % sizeof(g_dev[0]) != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

static struct nvml2_event_set *event_set(nvmlEventSet_t set)
{
    uintptr_t p = (uintptr_t)set, base = (uintptr_t)&g_sets[0];
    if (p < base || p >= (uintptr_t)&g_sets[MAX_EVENT_SETS] || (p - base) % sizeof(g_sets[0]) != 0)
        return NULL;
    return (set->in_use && !set->closing) ? set : NULL;
}

static struct nvml2_gpm_sample *gpm_sample(nvmlGpmSample_t s)
{
    uintptr_t p = (uintptr_t)s, base = (uintptr_t)&g_gpm[0];
    if (p < base || p >= (uintptr_t)&g_gpm[MAX_GPM_SAMPLES] || (p - base) % sizeof(g_gpm[0]) != 0)
        return NULL;
    return s->in_use ? s : NULL;
}

#define LOCKED(expr)                                                                               \
    do {                                                                                           \
        pthread_mutex_lock(&g_lock);                                                               \
        nvmlReturn_t locked_rc_ = (expr);                                                          \
        pthread_mutex_unlock(&g_lock);                                                             \
        return locked_rc_;                                                                         \
    } while (0)

static nvmlReturn_t copy_string(char *out, unsigned int length, const char *s)
{
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    size_t n = strlen(s);
    if ((size_t)length < n + 1)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, s, n + 1);
    return NVML_SUCCESS;
}

/* ---- init and shutdown ---------------------------------------------------------------------------- */

static nvmlReturn_t do_init(void)
{
    pthread_once(&g_once, init_once);
    pthread_mutex_lock(&g_lock);
    if (g_inits == 0) {
        g_count = gpus_from_env();
        for (unsigned int k = 0; k < g_count; k++)
            setup_device(&g_dev[k], k);
    }
    g_inits++;
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags; /* NO_GPUS, NO_ATTACH: nothing to attach here */
    return do_init();
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init(); }

EXPORT nvmlReturn_t nvmlInit(void) { return do_init(); }

static nvmlReturn_t shutdown_locked(void)
{
    if (g_inits == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (--g_inits > 0)
        return NVML_SUCCESS;
    /* the last user is gone: release what it left, as the real library frees its state */
    for (int i = 0; i < MAX_EVENT_SETS; i++) {
        struct nvml2_event_set *s = &g_sets[i];
        if (!s->in_use)
            continue;
        if (s->waiters > 0) {
            s->closing = 1;
            pthread_cond_broadcast(&s->wake);
        } else {
            s->in_use = 0;
        }
    }
    for (int i = 0; i < MAX_GPM_SAMPLES; i++)
        g_gpm[i].in_use = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlShutdown(void) { LOCKED(shutdown_locked()); }

EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: return "ECC is not supported for vGPU";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    default: return "Unknown Error";
    }
}

/* ---- system --------------------------------------------------------------------------------------- */

static nvmlReturn_t system_string(char *out, unsigned int length, const char *s)
{
    nvmlReturn_t rc = check_init();
    return rc != NVML_SUCCESS ? rc : copy_string(out, length, s);
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    LOCKED(system_string(version, length, DRIVER_VERSION));
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    LOCKED(system_string(version, length, NVML_VERSION));
}

static nvmlReturn_t cuda_version(int *out)
{
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *out = CUDA_DRIVER_VERSION; /* answered without nvmlInit, as the real one (it asks libcuda) */
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    return cuda_version(cudaDriverVersion);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return cuda_version(cudaDriverVersion);
}

/* ---- enumeration ---------------------------------------------------------------------------------- */

static nvmlReturn_t device_count(unsigned int *count)
{
    nvmlReturn_t rc = check_init();
    if (rc != NVML_SUCCESS)
        return rc;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = g_count;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) { LOCKED(device_count(deviceCount)); }

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) { LOCKED(device_count(deviceCount)); }

static nvmlReturn_t handle_by_index(unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t rc = check_init();
    if (rc != NVML_SUCCESS)
        return rc;
    if (device == NULL || index >= g_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_dev[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    LOCKED(handle_by_index(index, device));
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    LOCKED(handle_by_index(index, device));
}

static nvmlReturn_t handle_by_uuid(const char *uuid, nvmlDevice_t *device)
{
    nvmlReturn_t rc = check_init();
    if (rc != NVML_SUCCESS)
        return rc;
    if (uuid == NULL || device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int k = 0; k < g_count; k++) {
        if (strcmp(uuid, g_dev[k].uuid) == 0) {
            *device = &g_dev[k];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    LOCKED(handle_by_uuid(uuid, device));
}

/* ---- identity ------------------------------------------------------------------------------------- */

static nvmlReturn_t device_string(nvmlDevice_t device, char *out, unsigned int length, int uuid)
{
    nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS)
        return rc;
    return copy_string(out, length, uuid ? device->uuid : device->name);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    LOCKED(device_string(device, name, length, 0));
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    LOCKED(device_string(device, uuid, length, 1));
}

static nvmlReturn_t device_index(nvmlDevice_t device, unsigned int *index)
{
    nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS)
        return rc;
    if (index == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = device->index;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    LOCKED(device_index(device, index));
}

static nvmlReturn_t compute_capability(nvmlDevice_t device, int *major, int *minor)
{
    nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS)
        return rc;
    if (major == NULL || minor == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = 9; /* Hopper */
    *minor = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    LOCKED(compute_capability(device, major, minor));
}

/* ---- readings ------------------------------------------------------------------------------------- */

static nvmlReturn_t utilization(nvmlDevice_t device, nvmlUtilization_t *out)
{
    nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS)
        return rc;
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int u = util_now(device, now_us());
    out->gpu = u;
    out->memory = u * device->mem_util_pct / 100;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization_)
{
    LOCKED(utilization(device, utilization_));
}

static nvmlReturn_t memory_v1(nvmlDevice_t device, nvmlMemory_t *out)
{
    nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS)
        return rc;
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    out->total = MEM_TOTAL;
    out->used = MEM_RESERVED + procs_memory(device);
    out->free = MEM_TOTAL - out->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    LOCKED(memory_v1(device, memory));
}

static nvmlReturn_t memory_v2(nvmlDevice_t device, nvmlMemory_v2_t *out)
{
    nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS)
        return rc;
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (out->version != NVML_MEMORY_V2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    out->total = MEM_TOTAL;
    out->reserved = MEM_RESERVED;
    out->used = procs_memory(device);
    out->free = MEM_TOTAL - MEM_RESERVED - out->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    LOCKED(memory_v2(device, memory));
}

enum reading { POWER, POWER_LIMIT, TEMPERATURE, PCIE_TX, PCIE_RX, MAX_MIG };

static nvmlReturn_t uint_reading(nvmlDevice_t device, enum reading what, unsigned int *out)
{
    nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS)
        return rc;
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t t = now_us();
    switch (what) {
    case POWER:
        *out = power_mw(util_now(device, t));
        break;
    case POWER_LIMIT:
        *out = POWER_LIMIT_MW;
        break;
    case TEMPERATURE:
        *out = 29u + device->index % 3 + util_now(device, t) * 38u / 100u;
        break;
    case PCIE_TX:
    case PCIE_RX: {
        /* KB/s over the last 20 ms, as the driver's counter: host-to-device input while busy */
        unsigned int u = util_now(device, t);
        unsigned int jitter = (unsigned int)(mix(((uint64_t)device->index << 40) ^ (t / 20000)) % 20000u);
        unsigned int rx = device->kind == IDLE ? 0u : 150000u + u * 9000u + jitter;
        *out = what == PCIE_RX ? rx : rx / 12u + (device->kind == IDLE ? 0u : 800u);
        break;
    }
    case MAX_MIG:
        *out = 7; /* an H100 can hold 7 MIG instances */
        break;
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    LOCKED(uint_reading(device, POWER, power));
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    LOCKED(uint_reading(device, POWER_LIMIT, limit));
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    LOCKED(uint_reading(device, POWER_LIMIT, limit));
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                             unsigned int *temp)
{
    if (sensorType != NVML_TEMPERATURE_GPU) {
        pthread_mutex_lock(&g_lock);
        nvmlReturn_t rc = check_device(device);
        pthread_mutex_unlock(&g_lock);
        return rc != NVML_SUCCESS ? rc : NVML_ERROR_INVALID_ARGUMENT;
    }
    LOCKED(uint_reading(device, TEMPERATURE, temp));
}

EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter,
                                                unsigned int *value)
{
    if (counter != NVML_PCIE_UTIL_TX_BYTES && counter != NVML_PCIE_UTIL_RX_BYTES) {
        pthread_mutex_lock(&g_lock);
        nvmlReturn_t rc = check_device(device);
        pthread_mutex_unlock(&g_lock);
        return rc != NVML_SUCCESS ? rc : NVML_ERROR_INVALID_ARGUMENT;
    }
    LOCKED(uint_reading(device, counter == NVML_PCIE_UTIL_RX_BYTES ? PCIE_RX : PCIE_TX, value));
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    LOCKED(uint_reading(device, MAX_MIG, count));
}

static nvmlReturn_t clock_events(nvmlDevice_t device, unsigned long long *reasons)
{
    nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS)
        return rc;
    if (reasons == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t t = now_us();
    int64_t newest = newest_sample(device, t);
    unsigned int now = newest < 0 ? 0 : sample_util(device, newest);
    if (now < 10)
        *reasons = CLOCKS_EVENT_GPU_IDLE;
    else if (power_mw(util_now(device, t)) >= POWER_LIMIT_MW * 9 / 10)
        *reasons = CLOCKS_EVENT_SW_POWER_CAP;
    else
        *reasons = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                           unsigned long long *clocksEventReasons)
{
    LOCKED(clock_events(device, clocksEventReasons));
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                              unsigned long long *clocksThrottleReasons)
{
    LOCKED(clock_events(device, clocksThrottleReasons));
}

/* ---- processes ------------------------------------------------------------------------------------ */

/* nvml.h: call with *infoCount = 0 to learn the count: INSUFFICIENT_SIZE, or SUCCESS when none. */
static nvmlReturn_t processes(nvmlDevice_t device, unsigned int *infoCount, void *infos, int version,
                              int compute)
{
    nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS)
        return rc;
    if (infoCount == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = compute ? device->nprocs : 0;
    if (*infoCount < n) {
        *infoCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n > 0 && infos == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < n; i++) {
        if (version == 1) {
            nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)infos + i;
            memset(p, 0, sizeof(*p));
            p->pid = device->pid[i];
            p->usedGpuMemory = device->proc_mem[i];
        } else {
            nvmlProcessInfo_v2_t *p = (nvmlProcessInfo_v2_t *)infos + i;
            memset(p, 0, sizeof(*p));
            p->pid = device->pid[i];
            p->usedGpuMemory = device->proc_mem[i];
            p->gpuInstanceId = 0xFFFFFFFFu; /* no MIG */
            p->computeInstanceId = 0xFFFFFFFFu;
        }
    }
    *infoCount = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                             nvmlProcessInfo_v2_t *infos)
{
    LOCKED(processes(device, infoCount, infos, 3, 1));
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                             nvmlProcessInfo_v2_t *infos)
{
    LOCKED(processes(device, infoCount, infos, 2, 1));
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                          nvmlProcessInfo_v1_t *infos)
{
    LOCKED(processes(device, infoCount, infos, 1, 1));
}

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                              nvmlProcessInfo_v2_t *infos)
{
    LOCKED(processes(device, infoCount, infos, 3, 0));
}

EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                                nvmlProcessInfo_v2_t *infos)
{
    LOCKED(processes(device, infoCount, infos, 3, 0));
}

/* ---- utilization samples -------------------------------------------------------------------------- */

static unsigned int sample_value(const struct nvml2_device *d, nvmlSamplingType_t type, int64_t n)
{
    unsigned int u = sample_util(d, n);
    switch (type) {
    case NVML_TOTAL_POWER_SAMPLES: return power_mw(u);
    case NVML_GPU_UTILIZATION_SAMPLES: return u;
    case NVML_MEMORY_UTILIZATION_SAMPLES: return u * d->mem_util_pct / 100;
    case NVML_PROCESSOR_CLK_SAMPLES: return u >= 10 ? 1980u : 345u; /* MHz */
    case NVML_MEMORY_CLK_SAMPLES: return 2619u;
    default: return 0; /* encoders, decoders, JPEG, OFA: unused */
    }
}

/*
 * nvml.h: samples NULL asks for the count; lastSeenTimeStamp selects the samples strictly newer
 * than it (0: the whole ring); *sampleCount is the caller's room in, the number returned out.
 * NOT_FOUND when nothing is newer. With more newer samples than room (some arrived between the
 * size query and this call), the oldest are returned: the next call picks up the rest.
 */
static nvmlReturn_t samples(nvmlDevice_t device, nvmlSamplingType_t type, unsigned long long lastSeen,
                            nvmlValueType_t *valueType, unsigned int *count, nvmlSample_t *out)
{
    nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS)
        return rc;
    if (valueType == NULL || count == NULL || (unsigned int)type >= NVML_SAMPLINGTYPE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (type == NVML_MODULE_POWER_SAMPLES)
        return NVML_ERROR_NOT_SUPPORTED; /* module power: Grace Hopper only */
    int64_t newest = newest_sample(device, now_us());
    if (newest < 0)
        return NVML_ERROR_NOT_FOUND;
    int64_t first = newest - (int64_t)RING_SAMPLES + 1;
    if (first < 0)
        first = 0;
    if (lastSeen >= device->grid_us) {
        int64_t after = (int64_t)((lastSeen - device->grid_us) / SAMPLE_PERIOD_US) + 1;
        if (after > first)
            first = after;
    }
    if (first > newest)
        return NVML_ERROR_NOT_FOUND;
    unsigned int available = (unsigned int)(newest - first + 1);
    *valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
    if (out == NULL) {
        *count = available;
        return NVML_SUCCESS;
    }
    if (*count == 0) {
        *count = available;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned int n = available < *count ? available : *count;
    for (unsigned int i = 0; i < n; i++) {
        out[i].timeStamp = sample_time(device, first + i);
        out[i].sampleValue.ullVal = 0;
        out[i].sampleValue.uiVal = sample_value(device, type, first + i);
    }
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t device, nvmlSamplingType_t type,
                                         unsigned long long lastSeenTimeStamp, nvmlValueType_t *sampleValType,
                                         unsigned int *sampleCount, nvmlSample_t *samples_)
{
    LOCKED(samples(device, type, lastSeenTimeStamp, sampleValType, sampleCount, samples_));
}

/* ---- MIG (disabled on every GPU) ------------------------------------------------------------------ */

static nvmlReturn_t mig_mode(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS)
        return rc;
    if (current == NULL || pending == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *current = 0; /* NVML_DEVICE_MIG_DISABLE */
    *pending = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    LOCKED(mig_mode(device, currentMode, pendingMode));
}

static nvmlReturn_t no_mig_device(nvmlDevice_t device, void *out, nvmlReturn_t answer)
{
    nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS)
        return rc;
    return out == NULL ? NVML_ERROR_INVALID_ARGUMENT : answer;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                        nvmlDevice_t *migDevice)
{
    (void)index;
    LOCKED(no_mig_device(device, migDevice, NVML_ERROR_NOT_FOUND));
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    LOCKED(no_mig_device(device, id, NVML_ERROR_NOT_SUPPORTED));
}

static nvmlReturn_t is_mig_handle(nvmlDevice_t device, unsigned int *isMig)
{
    nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS)
        return rc;
    if (isMig == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *isMig = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    LOCKED(is_mig_handle(device, isMigDevice));
}

/* ---- events ---------------------------------------------------------------------------------------- */

static nvmlReturn_t supported_events(nvmlDevice_t device, unsigned long long *types)
{
    nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS)
        return rc;
    if (types == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *types = SUPPORTED_EVENTS;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    LOCKED(supported_events(device, eventTypes));
}

static nvmlReturn_t set_create(nvmlEventSet_t *set)
{
    nvmlReturn_t rc = check_init();
    if (rc != NVML_SUCCESS)
        return rc;
    if (set == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < MAX_EVENT_SETS; i++) {
        struct nvml2_event_set *s = &g_sets[i];
        if (!s->in_use) {
            s->in_use = 1;
            s->closing = 0;
            s->waiters = 0;
            memset(s->mask, 0, sizeof(s->mask));
            s->seen_us = now_us(); /* events at or before creation are not this set's */
            s->seen_pos = MAX_XIDS;
            *set = s;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_MEMORY;
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) { LOCKED(set_create(set)); }

static nvmlReturn_t set_free(nvmlEventSet_t set)
{
    nvmlReturn_t rc = check_init();
    if (rc != NVML_SUCCESS)
        return rc;
    struct nvml2_event_set *s = event_set(set);
    if (s == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (s->waiters > 0) { /* a thread waits on it: it goes when that wait ends */
        s->closing = 1;
        pthread_cond_broadcast(&s->wake);
    } else {
        s->in_use = 0;
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) { LOCKED(set_free(set)); }

static nvmlReturn_t register_events(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set)
{
    nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS)
        return rc;
    struct nvml2_event_set *s = event_set(set);
    if (s == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (types & ~SUPPORTED_EVENTS)
        return NVML_ERROR_NOT_SUPPORTED;
    s->mask[device->index] |= types;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
    LOCKED(register_events(device, eventTypes, set));
}

struct xid_event {
    unsigned int gpu, xid;
    uint64_t t_us;
    int pos;
};

static int time_frozen(void)
{
    const char *fixed = getenv("NVML2_NOW_US");
    return fixed != NULL && fixed[0] != '\0';
}

/*
 * The event set s has not yet seen that is due soonest (the earliest after its cursor): 1 and *out,
 * or 0 when none is left in NVML2_XIDS. Entries that do not parse, or name a GPU that does not
 * exist, are skipped.
 */
static int next_xid(const struct nvml2_event_set *s, struct xid_event *out)
{
    const char *p = getenv("NVML2_XIDS");
    int found = 0;
    for (int pos = 0; p != NULL && *p != '\0' && pos < MAX_XIDS; pos++) {
        char *end = NULL;
        unsigned long gpu = strtoul(p, &end, 10), xid = 0;
        unsigned long long t = 0;
        int ok = end != p && *end == ':';
        if (ok) {
            p = end + 1;
            xid = strtoul(p, &end, 10);
            ok = end != p && *end == '@';
        }
        if (ok) {
            p = end + 1;
            t = strtoull(p, &end, 10);
            ok = end != p && (*end == ',' || *end == '\0');
        }
        p = strchr(p, ',');
        p = p == NULL ? "" : p + 1;
        if (!ok || gpu >= g_count || !(s->mask[gpu] & EV_XID_CRITICAL))
            continue;
        if (t < s->seen_us || (t == s->seen_us && pos <= s->seen_pos))
            continue; /* already delivered, or before the set existed */
        if (!found || t < out->t_us) {
            *out = (struct xid_event){(unsigned int)gpu, (unsigned int)xid, t, pos};
            found = 1;
        }
    }
    return found;
}

static void add_us(struct timespec *ts, uint64_t us)
{
    uint64_t ns = (uint64_t)ts->tv_nsec + (us % 1000000ULL) * 1000ULL;
    ts->tv_sec += (time_t)(us / 1000000ULL + ns / 1000000000ULL);
    ts->tv_nsec = (long)(ns % 1000000000ULL);
}

static int before(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

/*
 * Blocks (mutex released) until the set's next scripted event is due, the timeout passes, or the
 * set is freed: one timed condition-variable wait per wake-up, against an absolute deadline on
 * CLOCK_MONOTONIC, so a spurious wake-up waits again only for the rest. With the timeline on the
 * real clock, an event due at T wakes the wait at T; with NVML2_NOW_US set, it is seen when the
 * wait starts or ends. `v2`: data is an nvmlEventData_t, else the unversioned nvmlEventData_v1_t.
 */
static nvmlReturn_t set_wait(nvmlEventSet_t set, void *data, unsigned int timeoutms, int v2)
{
    nvmlReturn_t rc = check_init();
    if (rc != NVML_SUCCESS)
        return rc;
    struct nvml2_event_set *s = event_set(set);
    if (s == NULL || data == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    add_us(&deadline, (uint64_t)timeoutms * 1000ULL);
    s->waiters++;
    struct xid_event ev = {0, 0, 0, 0};
    int got = 0, timed_out = 0;
    for (;;) {
        if (s->closing)
            break;
        uint64_t now = now_us();
        int pending = next_xid(s, &ev);
        if (pending && ev.t_us <= now) {
            got = 1;
            break;
        }
        if (timed_out)
            break;
        struct timespec wake = deadline, mono;
        clock_gettime(CLOCK_MONOTONIC, &mono);
        if (pending && !time_frozen()) {
            struct timespec due = mono;
            add_us(&due, ev.t_us - now);
            if (before(&due, &wake))
                wake = due;
        }
        if (!before(&mono, &deadline)) {
            timed_out = 1; /* look once more: time may have moved (NVML2_NOW_US) */
            continue;
        }
        int err = pthread_cond_timedwait(&s->wake, &g_lock, &wake);
        if (err == ETIMEDOUT && !before(&wake, &deadline))
            timed_out = 1;
    }
    s->waiters--;
    if (s->closing) {
        if (s->waiters == 0)
            s->in_use = 0;
        return NVML_ERROR_UNINITIALIZED;
    }
    if (!got)
        return NVML_ERROR_TIMEOUT;
    s->seen_us = ev.t_us;
    s->seen_pos = ev.pos;
    if (v2) {
        nvmlEventData_t *out = data;
        memset(out, 0, sizeof(*out));
        out->device = &g_dev[ev.gpu];
        out->eventType = EV_XID_CRITICAL;
        out->eventData = ev.xid;
        out->gpuInstanceId = 0xFFFFFFFFu; /* the whole GPU: no MIG instance */
        out->computeInstanceId = 0xFFFFFFFFu;
    } else {
        nvmlEventData_v1_t *out = data;
        memset(out, 0, sizeof(*out));
        out->device = &g_dev[ev.gpu];
        out->eventType = EV_XID_CRITICAL;
        out->eventData = ev.xid;
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    LOCKED(set_wait(set, data, timeoutms, 1));
}

EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_v1_t *data, unsigned int timeoutms)
{
    LOCKED(set_wait(set, data, timeoutms, 0));
}

/* ---- GPM ------------------------------------------------------------------------------------------- */

static nvmlReturn_t gpm_support(nvmlDevice_t device, nvmlGpmSupport_t *support)
{
    nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS)
        return rc;
    if (support == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (support->version != NVML_GPM_SUPPORT_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    support->isSupportedDevice = 1;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport)
{
    LOCKED(gpm_support(device, gpmSupport));
}

static nvmlReturn_t gpm_streaming(nvmlDevice_t device, unsigned int *state)
{
    nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS)
        return rc;
    if (state == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *state = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmQueryIfStreamingEnabled(nvmlDevice_t device, unsigned int *state)
{
    LOCKED(gpm_streaming(device, state));
}

static nvmlReturn_t gpm_alloc(nvmlGpmSample_t *sample)
{
    nvmlReturn_t rc = check_init();
    if (rc != NVML_SUCCESS)
        return rc;
    if (sample == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < MAX_GPM_SAMPLES; i++) {
        if (!g_gpm[i].in_use) {
            memset(&g_gpm[i], 0, sizeof(g_gpm[i]));
            g_gpm[i].in_use = 1;
            *sample = &g_gpm[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_MEMORY;
}

EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample) { LOCKED(gpm_alloc(gpmSample)); }

static nvmlReturn_t gpm_free(nvmlGpmSample_t sample)
{
    nvmlReturn_t rc = check_init();
    if (rc != NVML_SUCCESS)
        return rc;
    struct nvml2_gpm_sample *s = gpm_sample(sample);
    if (s == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    s->in_use = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t gpmSample) { LOCKED(gpm_free(gpmSample)); }

static nvmlReturn_t gpm_take(nvmlDevice_t device, nvmlGpmSample_t sample)
{
    nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS)
        return rc;
    struct nvml2_gpm_sample *s = gpm_sample(sample);
    if (s == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t t = now_us();
    s->gpu = device->index;
    s->t_us = t;
    s->busy_us = busy_total(device, t);
    s->filled = 1;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample)
{
    LOCKED(gpm_take(device, gpmSample));
}

EXPORT nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId, nvmlGpmSample_t gpmSample)
{
    (void)gpuInstanceId;
    LOCKED(no_mig_device(device, gpmSample, NVML_ERROR_NOT_SUPPORTED));
}

struct metric_name {
    const char *short_name, *long_name, *unit;
};

static struct metric_name metric_name(unsigned int id)
{
    switch (id) {
    case GPM_GRAPHICS_UTIL: return (struct metric_name){"gr_util", "graphics/compute activity", "%"};
    case GPM_SM_UTIL: return (struct metric_name){"sm_util", "SMs busy", "%"};
    case GPM_SM_OCCUPANCY: return (struct metric_name){"sm_occ", "warps resident vs max", "%"};
    case GPM_INTEGER_UTIL: return (struct metric_name){"int_util", "integer pipe activity", "%"};
    case GPM_ANY_TENSOR_UTIL: return (struct metric_name){"tensor_util", "any tensor pipe activity", "%"};
    case GPM_HMMA_TENSOR_UTIL: return (struct metric_name){"hmma_util", "HMMA tensor activity", "%"};
    case GPM_DRAM_BW_UTIL: return (struct metric_name){"dram_bw", "DRAM bandwidth vs peak", "%"};
    case GPM_FP64_UTIL: return (struct metric_name){"fp64_util", "FP64 pipe activity", "%"};
    case GPM_FP32_UTIL: return (struct metric_name){"fp32_util", "FP32 pipe activity", "%"};
    case GPM_FP16_UTIL: return (struct metric_name){"fp16_util", "FP16 pipe activity", "%"};
    case GPM_PCIE_TX_PER_SEC: return (struct metric_name){"pcie_tx", "PCIe from the GPU", "MiB/s"};
    case GPM_PCIE_RX_PER_SEC: return (struct metric_name){"pcie_rx", "PCIe to the GPU", "MiB/s"};
    case GPM_NVLINK_TOTAL_RX_PER_SEC: return (struct metric_name){"nvlink_rx", "NVLink received", "MiB/s"};
    case GPM_NVLINK_TOTAL_TX_PER_SEC: return (struct metric_name){"nvlink_tx", "NVLink sent", "MiB/s"};
    default: return (struct metric_name){NULL, NULL, NULL};
    }
}

/*
 * One metric over an interval where the GPU was busy for `busy` of `span` microseconds.
 * Activity (percent) while busy is the mean of the busy samples, while idle that of the gaps.
 */
static nvmlReturn_t metric_value(const struct nvml2_device *d, unsigned int id, double busy_frac, double *out)
{
    double hi = (d->busy_lo + d->busy_hi) / 2.0, lo = (d->gap_lo + d->gap_hi) / 2.0;
    double gr = d->kind == IDLE ? 0.0 : busy_frac * hi + (1.0 - busy_frac) * lo;
    double v;
    switch (id) {
    case GPM_GRAPHICS_UTIL: v = gr; break;
    case GPM_SM_UTIL: v = gr * d->sm_pct / 100.0; break;
    case GPM_SM_OCCUPANCY: v = gr * d->occupancy_pct / 100.0; break;
    case GPM_INTEGER_UTIL: v = gr * d->int_pct / 100.0; break;
    case GPM_ANY_TENSOR_UTIL:
    case GPM_HMMA_TENSOR_UTIL: v = gr * d->tensor_pct / 100.0; break;
    case GPM_DFMA_TENSOR_UTIL:
    case GPM_DMMA_TENSOR_UTIL:
    case GPM_IMMA_TENSOR_UTIL: v = 0.0; break;
    case GPM_DRAM_BW_UTIL: v = gr * d->dram_pct / 100.0; break;
    case GPM_FP64_UTIL: v = gr * d->fp64_pct / 100.0; break;
    case GPM_FP32_UTIL: v = gr * d->fp32_pct / 100.0; break;
    case GPM_FP16_UTIL: v = gr * d->fp16_pct / 100.0; break;
    case GPM_PCIE_RX_PER_SEC: v = d->kind == IDLE ? 0.0 : 140.0 + gr * 8.6; break;
    case GPM_PCIE_TX_PER_SEC: v = d->kind == IDLE ? 0.0 : 12.0 + gr * 0.7; break;
    case GPM_NVLINK_TOTAL_RX_PER_SEC:
    case GPM_NVLINK_TOTAL_TX_PER_SEC: v = d->nvlink_mib_s * busy_frac; break;
    default:
        if (id >= GPM_NVDEC_0_UTIL && id <= GPM_NVOFA_1_UTIL) {
            v = 0.0; /* video and JPEG engines: unused by training jobs */
        } else if (id >= GPM_NVLINK_L0_RX_PER_SEC && id <= GPM_NVLINK_L17_TX_PER_SEC) {
            v = d->nvlink_mib_s * busy_frac / 18.0; /* H100 SXM: 18 links */
        } else if (id == 0 || id >= NVML_GPM_METRIC_MAX) {
            return NVML_ERROR_INVALID_ARGUMENT;
        } else {
            return NVML_ERROR_NOT_SUPPORTED; /* C2C (Grace Hopper), per-link NVLink counters, ... */
        }
        break;
    }
    *out = v;
    return NVML_SUCCESS;
}

/*
 * Activity between two samples of one GPU. Samples taken at the same timeline time (a benchmark
 * holding NVML2_NOW_US still) give the activity at that moment rather than an error, so that a
 * benchmark measures the same work whatever it does with time; samples in either order are
 * accepted.
 */
static nvmlReturn_t gpm_metrics(nvmlGpmMetricsGet_t *get)
{
    nvmlReturn_t rc = check_init();
    if (rc != NVML_SUCCESS)
        return rc;
    if (get == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (get->version != NVML_GPM_METRICS_GET_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (get->numMetrics > NVML_GPM_METRIC_MAX)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct nvml2_gpm_sample *a = gpm_sample(get->sample1), *b = gpm_sample(get->sample2);
    if (a == NULL || b == NULL || !a->filled || !b->filled || a->gpu != b->gpu || a->gpu >= g_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (a->t_us > b->t_us) {
        struct nvml2_gpm_sample *swap = a;
        a = b;
        b = swap;
    }
    const struct nvml2_device *d = &g_dev[a->gpu];
    double busy_frac;
    if (b->t_us > a->t_us)
        busy_frac = (double)(b->busy_us - a->busy_us) / (double)(b->t_us - a->t_us);
    else
        busy_frac = busy_at(d, b->t_us) ? 1.0 : 0.0;
    for (unsigned int i = 0; i < get->numMetrics; i++) {
        nvmlGpmMetric_t *m = &get->metrics[i];
        struct metric_name name = metric_name(m->metricId);
        m->value = 0.0;
        m->nvmlReturn = metric_value(d, m->metricId, busy_frac, &m->value);
        m->metricInfo.shortName = (char *)name.short_name;
        m->metricInfo.longName = (char *)name.long_name;
        m->metricInfo.unit = (char *)name.unit;
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet) { LOCKED(gpm_metrics(metricsGet)); }
