/*
 * The pacing page, the library's side of the contract in preload_shim/page.py: the helpers the
 * agent loads with ctypes (atomic loads, stores and adds, the flags, the seqlock write of a
 * token supply), the seqlock read, and drawing tokens from a supply and waiting for them,
 * with the page's waiters and wait counters and the eventfd that wakes the agent; claiming
 * space on the burst buffer for a write and waiting for it, with the same waiters.
 *
 * The page has two supplies, each a lane: the bytes' (reads and writes) and the metadata
 * operations' (one token per call, meta.c). They are drawn from and waited on alike; only
 * the bytes' waiters count on the page (they tell the controller the job waits for
 * bandwidth, which a metadata limit is not).
 */
#include "preload.h"

const struct lane LANE_BYTES = {OFF_SEQ, OFF_TAKEN, 1};
const struct lane LANE_META = {OFF_META_SEQ, OFF_META_TAKEN, 0};

/* A supply's fields follow its seqlock word: t0, filled0, rate, burst (page.py). */
#define AT_T0(seq) ((seq) + 8)
#define AT_FILLED0(seq) ((seq) + 16)
#define AT_RATE(seq) ((seq) + 24)
#define AT_BURST(seq) ((seq) + 32)

#define SLICE_NS 10000000LL /* the longest sleep of a wait */
/* Waiters whose beat is older than this are taken for dead (page.py's WAIT_STALE_NS). */
#define WAIT_STALE_NS 500000000LL

struct supply {
    int64_t t0;
    int64_t filled0;
    double rate;
    int64_t burst;
};

static double bits_to_double(uint64_t bits) {
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

static uint64_t double_to_bits(double d) {
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    return bits;
}

EXPORT int64_t burstctl_page_load(void *page, int offset) {
    return __atomic_load_n(I64(page, offset), __ATOMIC_ACQUIRE);
}

EXPORT void burstctl_page_store(void *page, int offset, int64_t value) {
    __atomic_store_n(I64(page, offset), value, __ATOMIC_RELEASE);
}

EXPORT int64_t burstctl_page_add(void *page, int offset, int64_t delta) {
    return __atomic_add_fetch(I64(page, offset), delta, __ATOMIC_ACQ_REL);
}

/* The agent's hold on the job's writes (node/stageout_open.py, Freeze): set, then the
 * writes in flight. Sequentially consistent, as enter_write's count and check are: either
 * the writer sees the hold, or the agent sees the writer (never neither). */
EXPORT int64_t burstctl_page_hold(void *page) {
    __atomic_store_n(I64(page, OFF_HOLD), 1, __ATOMIC_SEQ_CST);
    return __atomic_load_n(I64(page, OFF_WRITING), __ATOMIC_SEQ_CST);
}

EXPORT int64_t burstctl_page_writing(void *page) {
    return __atomic_load_n(I64(page, OFF_WRITING), __ATOMIC_SEQ_CST);
}

EXPORT void burstctl_page_release(void *page) {
    __atomic_store_n(I64(page, OFF_HOLD), 0, __ATOMIC_SEQ_CST);
}

/* A paced write to the burst buffer, while the agent stages out: counted in flight (settle
 * uncounts it), unless the agent holds the job's writes: then it waits, uncounted, until the
 * hold ends (a few ms: the agent checks drained chunks and punches them) or the agent is
 * dead, in slices a signal cuts short (the loop re-checks; a fatal signal ends the process).
 * 1: counted; 0: not (a dead agent punches nothing). */
int enter_write(void *page, int64_t dead_after_ns) {
    for (;;) {
        __atomic_fetch_add(I64(page, OFF_WRITING), 1, __ATOMIC_SEQ_CST);
        if (!__atomic_load_n(I64(page, OFF_HOLD), __ATOMIC_SEQ_CST))
            return 1;
        __atomic_fetch_sub(I64(page, OFF_WRITING), 1, __ATOMIC_SEQ_CST);
        while (__atomic_load_n(I64(page, OFF_HOLD), __ATOMIC_ACQUIRE)) {
            const char *why = "";
            if (!page_alive(page, mono_ns(), dead_after_ns, &why))
                return 0;
            struct timespec ts = {0, 200 * 1000};
            nanosleep(&ts, NULL); /* interrupted: the loop re-checks */
        }
    }
}

EXPORT uint32_t burstctl_page_or_flags(void *page, uint32_t bits) {
    return __atomic_or_fetch(U32(page, OFF_FLAGS), bits, __ATOMIC_ACQ_REL);
}

EXPORT uint32_t burstctl_page_flags(void *page) {
    return __atomic_load_n(U32(page, OFF_FLAGS), __ATOMIC_ACQUIRE);
}

/* The seqlock write of the supply whose seqlock word is at `at` (OFF_SEQ, OFF_META_SEQ; the
 * agent's side; one writer at a time). */
EXPORT int burstctl_page_publish(void *page, int at, int64_t t0_ns, int64_t filled0, double rate,
                                 int64_t burst) {
    uint64_t *seq = (uint64_t *)I64(page, at);
    uint64_t s = __atomic_load_n(seq, __ATOMIC_RELAXED);
    if (s & 1) /* a writer died mid-write: start from the next even value */
        s += 1;
    __atomic_store_n(seq, s + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(I64(page, AT_T0(at)), t0_ns, __ATOMIC_RELAXED);
    __atomic_store_n(I64(page, AT_FILLED0(at)), filled0, __ATOMIC_RELAXED);
    __atomic_store_n((uint64_t *)I64(page, AT_RATE(at)), double_to_bits(rate), __ATOMIC_RELAXED);
    __atomic_store_n(I64(page, AT_BURST(at)), burst, __ATOMIC_RELAXED);
    __atomic_store_n(seq, s + 2, __ATOMIC_RELEASE);
    return 0;
}

/* The seqlock read of a lane's supply: 0, or -1 when a writer stays mid-write for more than
 * `give_up_ns`. */
static int read_supply(void *page, const struct lane *lane, struct supply *out,
                       int64_t give_up_ns) {
    int at = lane->seq;
    uint64_t *seq = (uint64_t *)I64(page, at);
    int64_t start = 0;
    for (unsigned spins = 0;; spins++) {
        uint64_t s1 = __atomic_load_n(seq, __ATOMIC_ACQUIRE);
        if (!(s1 & 1)) {
            out->t0 = __atomic_load_n(I64(page, AT_T0(at)), __ATOMIC_RELAXED);
            out->filled0 = __atomic_load_n(I64(page, AT_FILLED0(at)), __ATOMIC_RELAXED);
            out->rate = bits_to_double(
                __atomic_load_n((uint64_t *)I64(page, AT_RATE(at)), __ATOMIC_RELAXED));
            out->burst = __atomic_load_n(I64(page, AT_BURST(at)), __ATOMIC_RELAXED);
            __atomic_thread_fence(__ATOMIC_ACQUIRE);
            if (__atomic_load_n(seq, __ATOMIC_RELAXED) == s1)
                return 0;
        }
        if (spins >= 64) {
            int64_t now = mono_ns();
            if (start == 0)
                start = now;
            else if (now - start > give_up_ns)
                return -1;
            sched_yield();
        }
    }
}

static double supply_filled(const struct supply *s, int64_t now) {
    if (isinf(s->rate))
        return INFINITY;
    int64_t dt = now - s->t0;
    if (dt < 0)
        dt = 0;
    return (double)s->filled0 + s->rate * ((double)dt / 1e9);
}

/* 0: the page is alive; else it is dead (why set). */
int page_alive(void *page, int64_t now, int64_t dead_after_ns, const char **why) {
    if (__atomic_load_n(U32(page, OFF_FLAGS), __ATOMIC_ACQUIRE) & FLAG_CLOSED) {
        *why = "closed";
        return 0;
    }
    int64_t hb = __atomic_load_n(I64(page, OFF_HEARTBEAT), __ATOMIC_ACQUIRE);
    if (now - hb > dead_after_ns) {
        *why = "stale";
        return 0;
    }
    return 1;
}

static void notify_waiting(int *eventfd_slot) {
    uint64_t one = 1;
    int eventfd = __atomic_load_n(eventfd_slot, __ATOMIC_ACQUIRE);
    if (eventfd >= 0 && real_write)
        (void)!real_write(eventfd, &one, sizeof one);
}

static void waiter_gone(void *page) {
    __atomic_fetch_sub(I64(page, OFF_WAITERS), 1, __ATOMIC_ACQ_REL);
}

/* Sleeps in slices until the lane's supply covers `target`, re-reading it each slice and (a
 * lane whose waiters count) stamping the page's wait beat. 0: covered (or unlimited now); 1:
 * the page died. `now` is the time of the last look. */
static int wait_for_tokens(void *page, const struct lane *lane, int64_t target, struct supply *s,
                           int64_t *now, int64_t dead_after_ns, const char **why) {
    for (;;) {
        double missing = (double)target - supply_filled(s, *now);
        if (missing <= 0)
            return 0;
        int64_t slice = SLICE_NS;
        if (s->rate > 0) {
            double t = missing / s->rate * 1e9;
            if (t < (double)slice)
                slice = t < 1000 ? 1000 : (int64_t)t;
        }
        struct timespec ts = {.tv_sec = slice / 1000000000LL, .tv_nsec = slice % 1000000000LL};
        nanosleep(&ts, NULL); /* interrupted: the loop re-checks */
        *now = mono_ns();
        if (lane->waiters)
            __atomic_store_n(I64(page, OFF_WAIT_BEAT), *now, __ATOMIC_RELEASE);
        if (!page_alive(page, *now, dead_after_ns, why))
            return 1;
        if (read_supply(page, lane, s, dead_after_ns) != 0) {
            *why = "stuck mid-update";
            return 1;
        }
        if (isinf(s->rate) && s->rate > 0)
            return 0;
    }
}

/* Reserves n tokens of the lane and waits for them. 0: done; 1: the page died (stop pacing).
 *
 * The pattern of every wait of the library (a new one follows it):
 * - the wait is a sleep in this process, in slices of at most SLICE_NS, re-reading the page
 *   after each: never a blocking call into the agent nor a futex the agent must wake, so a
 *   signal that kills (SIGKILL, or SIGTERM's default action) ends the process at once, and a
 *   handled one only makes the loop look again;
 * - a waiter counts itself on the page (`waiters`) and stamps the page's wait beat when it
 *   starts and after each slice: a process killed mid-wait cannot take itself off, and the
 *   agent counts the waiters only while the beat is fresh (page.py, WAIT_STALE_NS);
 * - the first waiter, or the first after the beat went stale, writes the eventfd, so that the
 *   agent tells the controller at once;
 * - a thread cancelled in the sleep (a cancellation point) takes itself off in a cleanup
 *   handler. */
int reserve_and_wait(void *page, const struct lane *lane, int64_t n, int *eventfd,
                     int64_t dead_after_ns, const char **why, int64_t *drawn) {
    struct supply s;
    *drawn = 0;
    int64_t now = mono_ns();
    if (!page_alive(page, now, dead_after_ns, why))
        return 1;
    if (read_supply(page, lane, &s, dead_after_ns) != 0) {
        *why = "stuck mid-update";
        return 1;
    }
    if (isinf(s.rate) && s.rate > 0)
        return 0;
    if (n < 0)
        n = 0;
    if (n > ((int64_t)1 << 60))
        n = (int64_t)1 << 60;
    int64_t *taken = I64(page, lane->taken);
    int64_t cur = __atomic_load_n(taken, __ATOMIC_RELAXED), target;
    do {
        double floor_ = supply_filled(&s, now) - (double)s.burst;
        int64_t base = cur;
        if (floor_ > (double)cur)
            base = floor_ >= 0x1p62 ? ((int64_t)1 << 62) : (int64_t)floor_;
        target = base + n;
    } while (!__atomic_compare_exchange_n(taken, &cur, target, 1, __ATOMIC_ACQ_REL,
                                          __ATOMIC_RELAXED));
    *drawn = n;
    if (supply_filled(&s, now) >= (double)target)
        return 0;
    int64_t start = now, end = now;
    if (!lane->waiters) /* a metadata call's wait: a sleep like any other, on the page alone */
        return wait_for_tokens(page, lane, target, &s, &end, dead_after_ns, why);
    int64_t beat = __atomic_exchange_n(I64(page, OFF_WAIT_BEAT), now, __ATOMIC_ACQ_REL);
    if (__atomic_fetch_add(I64(page, OFF_WAITERS), 1, __ATOMIC_ACQ_REL) == 0 ||
        now - beat >= WAIT_STALE_NS)
        notify_waiting(eventfd);
    /* nanosleep is a cancellation point: a thread cancelled while waiting is no waiter. */
    int dead;
    pthread_cleanup_push(waiter_gone, page);
    dead = wait_for_tokens(page, lane, target, &s, &end, dead_after_ns, why);
    pthread_cleanup_pop(0);
    waiter_gone(page);
    __atomic_fetch_add(I64(page, OFF_WAIT_NS), end - start, __ATOMIC_RELAXED);
    __atomic_fetch_add(I64(page, OFF_WAITS), 1, __ATOMIC_RELAXED);
    return dead;
}

/* The space claimed so far, if n more bytes fit under the agent's limit: one compare-and-swap
 * on space_claimed. 1: claimed; 0: they do not fit (*cur: the claims seen). */
static int try_claim(void *page, int64_t n, int64_t *cur) {
    int64_t *claimed = I64(page, OFF_SPACE_CLAIMED);
    *cur = __atomic_load_n(claimed, __ATOMIC_RELAXED);
    for (;;) {
        int64_t limit = __atomic_load_n(I64(page, OFF_SPACE_LIMIT), __ATOMIC_ACQUIRE);
        if (limit != SPACE_UNLIMITED && (*cur > limit || n > limit - *cur))
            return 0;
        if (__atomic_compare_exchange_n(claimed, cur, *cur + n, 1, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            return 1;
    }
}

/* Raises space_want to at least `want`: what a waiter needs the limit to reach. */
static void want_at_least(void *page, int64_t want) {
    int64_t *slot = I64(page, OFF_SPACE_WANT);
    int64_t cur = __atomic_load_n(slot, __ATOMIC_RELAXED);
    while (cur < want &&
           !__atomic_compare_exchange_n(slot, &cur, want, 1, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
    }
}

/* Claims n bytes of the job's space on the burst buffer for a write (page.py: the space),
 * waiting, as for tokens, in slices, as one of the page's waiters, until the agent's limit
 * covers them. 0: claimed (*claimed = n; the caller lands them after its call); 1: the page
 * died (stop pacing; nothing claimed). */
int claim_space(void *page, int64_t n, int *eventfd, int64_t dead_after_ns, const char **why,
                int64_t *claimed) {
    *claimed = 0;
    if (n <= 0)
        return 0;
    int64_t cur;
    if (try_claim(page, n, &cur)) {
        *claimed = n;
        return 0;
    }
    int64_t start = mono_ns(), now = start;
    want_at_least(page, cur + n);
    int64_t beat = __atomic_exchange_n(I64(page, OFF_WAIT_BEAT), now, __ATOMIC_ACQ_REL);
    if (__atomic_fetch_add(I64(page, OFF_WAITERS), 1, __ATOMIC_ACQ_REL) == 0 ||
        now - beat >= WAIT_STALE_NS)
        notify_waiting(eventfd);
    int dead = 0;
    pthread_cleanup_push(waiter_gone, page);
    for (;;) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = SLICE_NS};
        nanosleep(&ts, NULL); /* interrupted by a signal: the loop re-checks */
        now = mono_ns();
        __atomic_store_n(I64(page, OFF_WAIT_BEAT), now, __ATOMIC_RELEASE);
        if (!page_alive(page, now, dead_after_ns, why)) {
            dead = 1;
            break;
        }
        if (try_claim(page, n, &cur)) {
            *claimed = n;
            break;
        }
        want_at_least(page, cur + n);
    }
    pthread_cleanup_pop(0);
    waiter_gone(page);
    __atomic_fetch_add(I64(page, OFF_WAIT_NS), now - start, __ATOMIC_RELAXED);
    __atomic_fetch_add(I64(page, OFF_WAITS), 1, __ATOMIC_RELAXED);
    return dead;
}

/* The library's draw and wait, for tests and tools (uses BURSTCTL_PRELOAD_DEAD_AFTER), from
 * the bytes' supply or (`metadata` not 0) the metadata operations'.
 * 0: the tokens were there (at once or after a wait); 1: the page is dead or closed. */
EXPORT int burstctl_page_reserve_and_wait(void *page, int64_t n, int eventfd, int metadata) {
    SAVE_ERRNO();
    ensure_init();
    const char *why = "";
    int64_t drawn;
    const struct lane *lane = metadata ? &LANE_META : &LANE_BYTES;
    int r = reserve_and_wait(page, lane, n, &eventfd, g_dead_after_ns, &why, &drawn);
    RESTORE_ERRNO();
    return r;
}
