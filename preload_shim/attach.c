/*
 * Attaching to the node agent: at the first paced open (and again at most once a second after
 * a failure, or once the page died), one thread connects to the agent's socket, sends
 * "ATTACH 1" and maps the page it is given; the process's other threads wait for that attach.
 * Also the library's own descriptors (the connection and the eventfd), which the application
 * may close or replace, and the death of an attachment (a closed or stale page); the
 * connections and messages to the agent that the stage-out's (stage.c) share with the attach.
 */
#include "preload.h"

#define ATTACH_TIMEOUT_S 5    /* SO_RCVTIMEO on the agent's answer */
#define RETRY_NS 1000000000LL /* attach at most once per second after a failure or a death */

static struct attachment *g_atts;
struct attachment *g_att;     /* current attachment (acquire/release) */
int g_attaching;              /* one thread attaches at a time; the others run unpaced */
static int64_t g_last_try_ns; /* when the last attach was tried (0: never) */
static int g_warned_attach;
static int g_warned_dead;

static void warn_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void warn_line(const char *fmt, ...) {
    char buf[512];
    int n = snprintf(buf, sizeof buf, "burstctl-preload[%d]: ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof buf)
        n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof buf - 1)
        n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    if (real_write)
        (void)!real_write(2, buf, (size_t)n);
}

/* The application closes or replaces one of the library's own descriptors: the library
 * stops using that number at once (never writing its eventfd's 8 bytes into a file that
 * reuses it). Its connection then ends: the agent drops this process; the page stays. */
void own_fd_lost(int fd) {
    for (struct attachment *a = __atomic_load_n(&g_atts, __ATOMIC_ACQUIRE); a; a = a->next) {
        int expect = fd;
        __atomic_compare_exchange_n(&a->eventfd, &expect, -1, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_RELAXED);
        expect = fd;
        __atomic_compare_exchange_n(&a->conn, &expect, -1, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_RELAXED);
    }
}

static void mark_own(int fd) {
    if (fd >= 0 && fd < g_nfds)
        __atomic_store_n(&g_fds[fd], (unsigned char)(ST_UNPACED | ST_OWN), __ATOMIC_RELAXED);
}

/* A new connection to the agent's socket, or -1 (errno set). */
int agent_conn(void) {
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -1;
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    memcpy(addr.sun_path, g_socket, strlen(g_socket) + 1);
    if (connect(s, (struct sockaddr *)&addr, sizeof addr) != 0) {
        SAVE_ERRNO();
        real_close(s);
        RESTORE_ERRNO();
        return -1;
    }
    return s;
}

/* One message on s (NUL-terminated in buf) and the descriptors it carried: the first `max`
 * in fds (*nfds counts them all; the others are closed), *truncated when the kernel dropped
 * some. Its length, or -1 (errno set). */
ssize_t recv_message(int s, char *buf, size_t cap, int *fds, int max, int *nfds, int *truncated) {
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(8 * sizeof(int))];
    } ctl;
    struct iovec iov = {.iov_base = buf, .iov_len = cap - 1};
    struct msghdr mh = {0};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof ctl.buf;
    *nfds = 0;
    ssize_t n = recvmsg(s, &mh, MSG_CMSG_CLOEXEC);
    if (n < 0)
        return -1;
    buf[n] = '\0';
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        int *got = (int *)CMSG_DATA(c);
        for (int i = 0; i < k; i++) {
            if (*nfds < max)
                fds[*nfds] = got[i];
            else
                real_close(got[i]);
            (*nfds)++;
        }
    }
    *truncated = (mh.msg_flags & MSG_CTRUNC) != 0;
    return n;
}

static struct attachment *attach_now(char *why, size_t why_cap) {
    int s = agent_conn();
    if (s < 0) {
        snprintf(why, why_cap, "connect %s: %s", g_socket, strerror(errno));
        return NULL;
    }
    struct timeval tv = {.tv_sec = ATTACH_TIMEOUT_S, .tv_usec = 0};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int fds[2] = {-1, -1};
    struct attachment *att = NULL;
    void *page = MAP_FAILED;
    static const char req[] = "ATTACH 1";
    if (send(s, req, sizeof req - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof req - 1)) {
        snprintf(why, why_cap, "send: %s", strerror(errno));
        goto fail;
    }
    char msg[512];
    int nfds = 0, truncated = 0;
    ssize_t n = recv_message(s, msg, sizeof msg, fds, 2, &nfds, &truncated);
    if (n < 0) {
        snprintf(why, why_cap, "no answer from %s: %s", g_socket, strerror(errno));
        goto fail;
    }
    if (strncmp(msg, "OK 1 ", 5) != 0) {
        snprintf(why, why_cap, "the agent said: %.200s", msg);
        goto fail;
    }
    if (nfds != 2 || truncated) {
        snprintf(why, why_cap, "the agent's answer carried %d descriptors, not 2", nfds);
        goto fail;
    }
    /* A page shorter than PAGE_BYTES, or one that may shrink later, would SIGBUS the
     * application on a load: the agent's pages are sealed against it (page.py). */
    struct stat st;
    int seals = real_fcntl(fds[0], F_GET_SEALS);
    if (fstat(fds[0], &st) != 0 || st.st_size < PAGE_BYTES || seals < 0 ||
        !(seals & F_SEAL_SHRINK)) {
        snprintf(why, why_cap, "the page is not a sealed memfd of %d bytes", PAGE_BYTES);
        goto fail;
    }
    page = mmap(NULL, PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    if (page == MAP_FAILED) {
        snprintf(why, why_cap, "mmap of the page: %s", strerror(errno));
        goto fail;
    }
    if (__atomic_load_n(U32(page, OFF_MAGIC), __ATOMIC_ACQUIRE) != PAGE_MAGIC ||
        __atomic_load_n(U32(page, OFF_VERSION), __ATOMIC_ACQUIRE) != PAGE_VERSION) {
        snprintf(why, why_cap, "the page's magic or version is not %#x/%u", PAGE_MAGIC,
                 PAGE_VERSION);
        goto fail;
    }
    att = calloc(1, sizeof *att);
    if (!att) {
        snprintf(why, why_cap, "out of memory");
        goto fail;
    }
    real_close(fds[0]);
    att->page = page;
    att->eventfd = fds[1];
    att->conn = s;
    return att;
fail:
    if (page != MAP_FAILED)
        munmap(page, PAGE_BYTES);
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0)
            real_close(fds[i]);
    real_close(s);
    return NULL;
}

/* Waits (no lock held) until the attach another thread makes is over, bounded by the time
 * its answer may take: the threads of a process then start paced together. */
static void wait_for_attach(void) {
    int64_t deadline = mono_ns() + (ATTACH_TIMEOUT_S + 1) * 1000000000LL;
    struct timespec ms = {.tv_sec = 0, .tv_nsec = 1000000};
    while (__atomic_load_n(&g_attaching, __ATOMIC_ACQUIRE) && mono_ns() < deadline)
        nanosleep(&ms, NULL);
}

/* Attaches when there is no live attachment and the last try is a second old or more. */
/* The live attachment to pace on, attaching first if there is none (NULL: none, run unpaced;
 * errno may change). */
struct attachment *live_attachment(void) {
    struct attachment *att = __atomic_load_n(&g_att, __ATOMIC_ACQUIRE);
    if (LIKELY(att && !__atomic_load_n(&att->dead, __ATOMIC_ACQUIRE)))
        return att;
    maybe_attach();
    att = __atomic_load_n(&g_att, __ATOMIC_ACQUIRE);
    return att && !__atomic_load_n(&att->dead, __ATOMIC_ACQUIRE) ? att : NULL;
}

void maybe_attach(void) {
    struct attachment *cur = __atomic_load_n(&g_att, __ATOMIC_ACQUIRE);
    if (cur && !__atomic_load_n(&cur->dead, __ATOMIC_ACQUIRE))
        return;
    SAVE_ERRNO();
    if (__atomic_load_n(&g_attaching, __ATOMIC_ACQUIRE)) {
        wait_for_attach();
        RESTORE_ERRNO();
        return;
    }
    int64_t now = mono_ns();
    int64_t last = __atomic_load_n(&g_last_try_ns, __ATOMIC_RELAXED);
    int expect = 0;
    /* Set before the attach is claimed: a signal handler that does paced I/O in this thread
     * meanwhile passes straight through instead of waiting for this very attach. */
    t_in_lib++;
    if (last != 0 && now - last < RETRY_NS) {
        /* tried less than a second ago: run unpaced */
    } else if (!__atomic_compare_exchange_n(&g_attaching, &expect, 1, 0, __ATOMIC_ACQUIRE,
                                            __ATOMIC_RELAXED)) {
        wait_for_attach();
    } else {
        __atomic_store_n(&g_last_try_ns, now, __ATOMIC_RELAXED);
        char why[300];
        struct attachment *att = attach_now(why, sizeof why);
        if (att) {
            mark_own(att->conn);
            mark_own(att->eventfd);
            att->next = __atomic_load_n(&g_atts, __ATOMIC_RELAXED);
            __atomic_store_n(&g_atts, att, __ATOMIC_RELEASE);
            __atomic_store_n(&g_att, att, __ATOMIC_RELEASE);
        } else if (!__atomic_exchange_n(&g_warned_attach, 1, __ATOMIC_RELAXED)) {
            warn_line("cannot attach to the burstctl agent (%s): running unpaced", why);
        }
        __atomic_store_n(&g_attaching, 0, __ATOMIC_RELEASE);
    }
    t_in_lib--;
    RESTORE_ERRNO();
}

void mark_dead(struct attachment *att, const char *why) {
    int expect = 0;
    if (!__atomic_compare_exchange_n(&att->dead, &expect, 1, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_RELAXED))
        return;
    /* The agent sees EOF: this process image is done with that page. The eventfd stays open
     * (a thread may be about to write to it; its number must not be reused under it). */
    int conn = __atomic_exchange_n(&att->conn, -1, __ATOMIC_ACQ_REL);
    if (conn >= 0) {
        if (conn < g_nfds)
            __atomic_store_n(&g_fds[conn], (unsigned char)ST_UNKNOWN, __ATOMIC_RELAXED);
        real_close(conn);
    }
    __atomic_store_n(&g_last_try_ns, mono_ns(), __ATOMIC_RELAXED);
    if (!__atomic_exchange_n(&g_warned_dead, 1, __ATOMIC_RELAXED))
        warn_line("the burstctl agent's page is %s: running unpaced until it answers again", why);
}
