/* A wall clock off by CLOCKSHIFT_SECONDS for one process and its children (LD_PRELOAD):
 * what a host whose clock is wrong shows its programs. Only the wall clock moves
 * (CLOCK_REALTIME and its variants, gettimeofday, time); the monotonic and boot clocks stay
 * true, as they do on such a host, and so does every timed wait on them.
 *
 * Used by tests/faults/test_host_clocks.py where libfaketime cannot run CPython 3.11+:
 * with CLOCK_MONOTONIC faked its timed waits never return, and with it left alone its
 * time.sleep() fails with EINVAL (libfaketime 0.9.10, wolfcw/libfaketime#426). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long long shift_ns(void) {
    static long long shift = -1;
    static int known = 0;
    if (!known) {
        const char *text = getenv("CLOCKSHIFT_SECONDS");
        shift = text ? (long long)(strtod(text, NULL) * 1e9) : 0;
        known = 1;
    }
    return shift;
}

static int is_wall(clockid_t clock) {
    return clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE || clock == CLOCK_TAI;
}

static void add_ns(struct timespec *ts, long long ns) {
    long long total = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + ns;
    ts->tv_sec = (time_t)(total / 1000000000LL);
    ts->tv_nsec = (long)(total % 1000000000LL);
    if (ts->tv_nsec < 0) {
        ts->tv_nsec += 1000000000L;
        ts->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real)
        real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int done = real(clock, ts);
    if (done == 0 && is_wall(clock))
        add_ns(ts, shift_ns());
    return done;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    int done = clock_gettime(CLOCK_REALTIME, &ts);
    if (done == 0) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    (void)tz;
    return done;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out)
        *out = ts.tv_sec;
    return ts.tv_sec;
}

/* An absolute deadline on the wall clock was read from the shifted clock: the kernel
 * waits on the true one. */
int clock_nanosleep(clockid_t clock, int flags, const struct timespec *req,
                    struct timespec *rem) {
    static int (*real)(clockid_t, int, const struct timespec *, struct timespec *);
    if (!real)
        real = (int (*)(clockid_t, int, const struct timespec *, struct timespec *))dlsym(
            RTLD_NEXT, "clock_nanosleep");
    if ((flags & TIMER_ABSTIME) && is_wall(clock)) {
        struct timespec true_deadline = *req;
        add_ns(&true_deadline, -shift_ns());
        return real(clock, flags, &true_deadline, rem);
    }
    return real(clock, flags, req, rem);
}
