/*
 * burstctl's LD_PRELOAD library: paces an application's reads and writes on files under the
 * burst-buffer paths (BURSTCTL_PRELOAD_PATHS), and its metadata calls on paths under them,
 * from inside the process, by drawing tokens from its job's shared pacing page, which the node
 * agent hands it over a Unix socket.
 *
 * The page layout and the protocol are the contract of preload_shim/page.py (its docstring);
 * what is caught and what is not: docs/preload.md, "What the library catches".
 *
 * The library's parts, one translation unit each, linked into one shared object:
 *  - real.c:    the real libc functions behind the interposed ones, the in-library flag;
 *  - page.c:    the pacing page: the agent's ctypes helpers, drawing tokens and waiting;
 *  - fdstate.c: which descriptors are paced: configuration, paths, the per-fd table;
 *  - attach.c:  attaching to the node agent, the library's own descriptors;
 *  - io.c:      pacing a call; the read and write family;
 *  - aio.c:     POSIX AIO, paced at submission;
 *  - open.c:    the open, close, dup, fcntl and chdir family;
 *  - stdio.c:   the stdio family;
 *  - stage.c:   telling the agent's stage-out of opens and closes, evicted files;
 *  - meta.c:    the metadata calls (unlink, rename, mkdir, rmdir, the stat family, opendir)
 *               and pacing a metadata call (an open's too).
 * This private header is what they share. Every part includes it first, so that all see the
 * same feature macros; what it declares is hidden: only the functions a part marks EXPORT
 * leave the library.
 *
 * Rules every part keeps:
 *  - never fail the application's I/O because of the library: any failure of ours means
 *    "run unpaced" (one warning line on stderr), and errno is preserved around our work;
 *  - an unpaced descriptor costs one load of the per-fd table and the real call;
 *  - no lock is held across a real I/O call or a sleep (the two mutexes guard the cached cwd
 *    and the cache of directory paths, and are held only to copy strings);
 *  - initialisation is lazy (the first intercepted call), and calls made while the library
 *    itself runs (a thread-local flag) go straight to the real functions.
 */
#ifndef BURSTCTL_PRELOAD_H
#define BURSTCTL_PRELOAD_H

#undef _FORTIFY_SOURCE
#undef _FILE_OFFSET_BITS
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <aio.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* glibc may define these as macros (bits/stdio.h, when optimising): the symbols are ours. */
#undef fread_unlocked
#undef fwrite_unlocked

#define EXPORT __attribute__((visibility("default")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

#define SAVE_ERRNO() int saved_errno_ = errno
#define RESTORE_ERRNO() (errno = saved_errno_)

/* Declared hidden here (not only defined hidden by -fvisibility), so that every part reaches
 * the shared state and functions directly, as one translation unit would, not through the GOT. */
#pragma GCC visibility push(hidden)

/* ------------------------------------------------------------------ real.c: the real functions */

/* Every libc function the library interposes: X(return type, name, parameters, the name
 * resolved instead when `name` is missing). Its real function is real_<name>. */
#define REAL_FUNCTIONS(X)                                                                       \
    X(int, open, (const char *, int, ...), NULL)                                                \
    X(int, open64, (const char *, int, ...), "open")                                            \
    X(int, openat, (int, const char *, int, ...), NULL)                                         \
    X(int, openat64, (int, const char *, int, ...), "openat")                                   \
    X(int, creat, (const char *, mode_t), NULL)                                                 \
    X(int, creat64, (const char *, mode_t), "creat")                                            \
    X(int, __open_2, (const char *, int), NULL)                                                 \
    X(int, __open64_2, (const char *, int), "__open_2")                                         \
    X(int, __openat_2, (int, const char *, int), NULL)                                          \
    X(int, __openat64_2, (int, const char *, int), "__openat_2")                                \
    X(int, close, (int), NULL)                                                                  \
    X(int, close_range, (unsigned int, unsigned int, int), NULL)                                \
    X(void, closefrom, (int), NULL)                                                             \
    X(int, closedir, (DIR *), NULL)                                                             \
    X(int, dup, (int), NULL)                                                                    \
    X(int, dup2, (int, int), NULL)                                                              \
    X(int, dup3, (int, int, int), NULL)                                                         \
    X(int, fcntl, (int, int, ...), NULL)                                                        \
    X(int, fcntl64, (int, int, ...), "fcntl")                                                   \
    X(ssize_t, read, (int, void *, size_t), NULL)                                               \
    X(ssize_t, write, (int, const void *, size_t), NULL)                                        \
    X(ssize_t, pread, (int, void *, size_t, off_t), NULL)                                       \
    X(ssize_t, pread64, (int, void *, size_t, off64_t), "pread")                                \
    X(ssize_t, pwrite, (int, const void *, size_t, off_t), NULL)                                \
    X(ssize_t, pwrite64, (int, const void *, size_t, off64_t), "pwrite")                        \
    X(ssize_t, readv, (int, const struct iovec *, int), NULL)                                   \
    X(ssize_t, writev, (int, const struct iovec *, int), NULL)                                  \
    X(ssize_t, preadv, (int, const struct iovec *, int, off_t), NULL)                           \
    X(ssize_t, preadv64, (int, const struct iovec *, int, off64_t), "preadv")                   \
    X(ssize_t, pwritev, (int, const struct iovec *, int, off_t), NULL)                          \
    X(ssize_t, pwritev64, (int, const struct iovec *, int, off64_t), "pwritev")                 \
    X(ssize_t, preadv2, (int, const struct iovec *, int, off_t, int), NULL)                     \
    X(ssize_t, pwritev2, (int, const struct iovec *, int, off_t, int), NULL)                    \
    X(ssize_t, preadv64v2, (int, const struct iovec *, int, off64_t, int), "preadv2")           \
    X(ssize_t, pwritev64v2, (int, const struct iovec *, int, off64_t, int), "pwritev2")         \
    X(ssize_t, __read_chk, (int, void *, size_t, size_t), NULL)                                 \
    X(ssize_t, __pread_chk, (int, void *, size_t, off_t, size_t), NULL)                         \
    X(ssize_t, __pread64_chk, (int, void *, size_t, off64_t, size_t), "__pread_chk")            \
    X(ssize_t, copy_file_range, (int, off64_t *, int, off64_t *, size_t, unsigned int), NULL)   \
    X(ssize_t, sendfile, (int, int, off_t *, size_t), NULL)                                     \
    X(ssize_t, sendfile64, (int, int, off64_t *, size_t), "sendfile")                           \
    X(int, aio_read, (struct aiocb *), NULL)                                                    \
    X(int, aio_write, (struct aiocb *), NULL)                                                   \
    X(int, aio_read64, (struct aiocb64 *), "aio_read")                                          \
    X(int, aio_write64, (struct aiocb64 *), "aio_write")                                        \
    X(int, lio_listio, (int, struct aiocb *const *, int, struct sigevent *), NULL)              \
    X(int, lio_listio64, (int, struct aiocb64 *const *, int, struct sigevent *), "lio_listio")  \
    X(FILE *, fopen, (const char *, const char *), NULL)                                        \
    X(FILE *, fopen64, (const char *, const char *), "fopen")                                   \
    X(FILE *, fdopen, (int, const char *), NULL)                                                \
    X(FILE *, freopen, (const char *, const char *, FILE *), NULL)                              \
    X(FILE *, freopen64, (const char *, const char *, FILE *), "freopen")                       \
    X(size_t, fread, (void *, size_t, size_t, FILE *), NULL)                                    \
    X(size_t, fwrite, (const void *, size_t, size_t, FILE *), NULL)                             \
    X(size_t, fread_unlocked, (void *, size_t, size_t, FILE *), NULL)                           \
    X(size_t, fwrite_unlocked, (const void *, size_t, size_t, FILE *), NULL)                    \
    X(size_t, __fread_chk, (void *, size_t, size_t, size_t, FILE *), NULL)                      \
    X(size_t, __fread_unlocked_chk, (void *, size_t, size_t, size_t, FILE *), NULL)             \
    X(int, fclose, (FILE *), NULL)                                                              \
    X(int, fflush, (FILE *), NULL)                                                              \
    X(int, chdir, (const char *), NULL)                                                         \
    X(int, fchdir, (int), NULL)                                                                 \
    X(int, unlink, (const char *), NULL)                                                        \
    X(int, unlinkat, (int, const char *, int), NULL)                                            \
    X(int, rename, (const char *, const char *), NULL)                                          \
    X(int, renameat, (int, const char *, int, const char *), NULL)                              \
    X(int, renameat2, (int, const char *, int, const char *, unsigned int), NULL)               \
    X(int, mkdir, (const char *, mode_t), NULL)                                                 \
    X(int, mkdirat, (int, const char *, mode_t), NULL)                                          \
    X(int, rmdir, (const char *), NULL)                                                         \
    X(int, stat, (const char *, struct stat *), NULL)                                           \
    X(int, stat64, (const char *, struct stat64 *), "stat")                                     \
    X(int, lstat, (const char *, struct stat *), NULL)                                          \
    X(int, lstat64, (const char *, struct stat64 *), "lstat")                                   \
    X(int, fstatat, (int, const char *, struct stat *, int), NULL)                              \
    X(int, fstatat64, (int, const char *, struct stat64 *, int), "fstatat")                     \
    X(int, statx, (int, const char *, int, unsigned int, struct statx *), NULL)                 \
    X(int, __xstat, (int, const char *, struct stat *), NULL)                                   \
    X(int, __xstat64, (int, const char *, struct stat64 *), "__xstat")                          \
    X(int, __lxstat, (int, const char *, struct stat *), NULL)                                  \
    X(int, __lxstat64, (int, const char *, struct stat64 *), "__lxstat")                        \
    X(int, __fxstatat, (int, int, const char *, struct stat *, int), NULL)                      \
    X(int, __fxstatat64, (int, int, const char *, struct stat64 *, int), "__fxstatat")          \
    X(DIR *, opendir, (const char *), NULL)

#define DECLARE_REAL(ret, name, args, fallback) extern ret(*real_##name) args;
REAL_FUNCTIONS(DECLARE_REAL)
#undef DECLARE_REAL

/* A thread-local "in the library" flag: intercepted calls made while it is set (by dlsym, by
 * the attach, by our warning) go straight to the real functions. Initial-exec: a preloaded
 * library has static TLS, and reading it never allocates. */
extern __thread int t_in_lib __attribute__((tls_model("initial-exec")));

void *resolve(const char *name, const char *fallback);

#define RESOLVE(name, fallback)                                                                 \
    do {                                                                                        \
        if (UNLIKELY(!real_##name))                                                             \
            __atomic_store_n((void **)&real_##name, resolve(#name, fallback), __ATOMIC_RELAXED); \
    } while (0)

/* A call that arrives before its real function could be found (only while dlsym itself runs,
 * in practice never): fail it as unsupported rather than recurse. */
#define NEED(name, fallback, failure)                                                           \
    do {                                                                                        \
        RESOLVE(name, fallback);                                                                \
        if (UNLIKELY(!real_##name)) {                                                           \
            errno = ENOSYS;                                                                     \
            return failure;                                                                     \
        }                                                                                       \
    } while (0)

/* ------------------------------------------------------------------ page.c: the pacing page */

#define PAGE_BYTES 4096
#define PAGE_MAGIC 0x31504342u /* "BCP1" */
#define PAGE_VERSION 4u
#define FLAG_CLOSED 1u
#define FLAG_STAGE 2u

#define OFF_MAGIC 0
#define OFF_VERSION 4
#define OFF_SEQ 8
#define OFF_T0 16
#define OFF_FILLED0 24
#define OFF_RATE 32
#define OFF_BURST 40
#define OFF_HEARTBEAT 48
#define OFF_FLAGS 56
#define OFF_TAKEN 64
#define OFF_REQ_READ 128
#define OFF_REQ_WRITE 136
#define OFF_MOVED_READ 144
#define OFF_MOVED_WRITE 152
#define OFF_CALLS_READ 160
#define OFF_CALLS_WRITE 168
#define OFF_WAITERS 192
#define OFF_WAIT_NS 200
#define OFF_WAITS 208
#define OFF_WAIT_BEAT 216
#define OFF_SPACE_LIMIT 256
#define OFF_SPACE_CLAIMED 264
#define OFF_SPACE_LANDED 272
#define OFF_SPACE_WANT 280
#define OFF_WRITING 288
#define OFF_HOLD 296
#define OFF_META_SEQ 320
#define OFF_META_TAKEN 360
#define OFF_CALLS_META 368
#define SPACE_UNLIMITED INT64_MAX

#define I64(p, off) ((int64_t *)((char *)(p) + (off)))
#define U32(p, off) ((uint32_t *)((char *)(p) + (off)))

enum { KIND_READ = 0, KIND_WRITE = 1 };

static inline int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* A token supply of the page and what draws from it (page.c): the offsets of its seqlock word
 * (its t0, filled0, rate and burst follow) and of its `taken`, and whether its waiters count
 * on the page (the bytes': they tell the agent the job waits for bandwidth). */
struct lane {
    int seq;
    int taken;
    int waiters;
};
extern const struct lane LANE_BYTES, LANE_META;

int reserve_and_wait(void *page, const struct lane *lane, int64_t n, int *eventfd,
                     int64_t dead_after_ns, const char **why, int64_t *drawn);
int page_alive(void *page, int64_t now, int64_t dead_after_ns, const char **why);
int claim_space(void *page, int64_t n, int *eventfd, int64_t dead_after_ns, const char **why,
                int64_t *claimed);
int enter_write(void *page, int64_t dead_after_ns);

/* ------------------------------------------------------------------ fdstate.c: the fd table */

/* A state byte: the state in the low bits; ST_DIRCACHED: the directory's path is cached;
 * ST_OWN: the library's own descriptor (the agent connection or the eventfd); ST_TOLD: the
 * agent's stage-out was told of this open (stage.c), and is told of its close. */
enum {
    ST_UNKNOWN = 0,
    ST_UNPACED = 1,
    ST_PACED = 2,
    ST_MASK = 3,
    ST_DIRCACHED = 4,
    ST_OWN = 8,
    ST_TOLD = 16
};

extern pthread_once_t g_once;
extern int g_ready;
extern int g_enabled;
extern unsigned char *g_fds;
extern int g_nfds;
extern char g_socket[sizeof(((struct sockaddr_un *)0)->sun_path)];
extern int64_t g_dead_after_ns;

void init_once(void);
void refresh_cwd(void);
void set_state(int fd, int st);
int resolve_unknown(int fd);
int path_state(int dirfd, const char *path, char *norm, size_t cap);
int after_open(int fd, int flags, int st, const char *norm);

static inline void ensure_init(void) {
    if (UNLIKELY(!__atomic_load_n(&g_ready, __ATOMIC_ACQUIRE))) {
        SAVE_ERRNO();
        pthread_once(&g_once, init_once);
        RESTORE_ERRNO();
    }
}

/* The fd's state: ST_UNPACED or ST_PACED. */
static inline int fd_state(int fd) {
    ensure_init();
    if (!g_enabled)
        return ST_UNPACED;
    if (LIKELY(fd >= 0 && fd < g_nfds)) {
        int st = __atomic_load_n(&g_fds[fd], __ATOMIC_RELAXED) & ST_MASK;
        if (LIKELY(st != ST_UNKNOWN))
            return st;
    } else if (fd < 0) {
        return ST_UNPACED;
    }
    return resolve_unknown(fd);
}

/* ------------------------------------------------------------------ attach.c: the agent */

/* One attachment to the agent: the mapped page, its eventfd, the connection. A dead one is
 * never unmapped (another thread may still be reading it): a page's worth per re-attach. */
struct attachment {
    void *page;
    int eventfd; /* -1 once the application closed or replaced that number */
    int conn;    /* -1 once hung up, or closed or replaced by the application */
    int dead;
    struct attachment *next; /* every attachment this image made, newest first */
};

extern struct attachment *g_att;
extern int g_attaching;

void own_fd_lost(int fd);
int agent_conn(void);
ssize_t recv_message(int s, char *buf, size_t cap, int *fds, int max, int *nfds, int *truncated);
void maybe_attach(void);
struct attachment *live_attachment(void);
void mark_dead(struct attachment *att, const char *why);

/* ------------------------------------------------------------------ io.c: pacing a call */

/* What a paced call drew: the attachment to count on (NULL: unpaced), the tokens, and for
 * a write the space it claimed on the burst buffer. */
struct paced {
    struct attachment *att;
    int64_t drawn;
    int64_t claimed;
    int writing; /* counted in the page's writes in flight (enter_write) */
};

struct paced pace(int kind, size_t n, int fd, int64_t off);
size_t clamp_read(int fd, size_t n, int64_t off);

/* After the real call: the bytes it moved are counted, and the tokens it drew and did not
 * use (a short read at the end of a file, a failed call) go back. */
static inline void settle(struct paced p, int kind, ssize_t r) {
    if (!p.att)
        return;
    int64_t used = r > 0 ? (int64_t)r : 0;
    if (used > 0)
        __atomic_fetch_add(I64(p.att->page, kind == KIND_READ ? OFF_MOVED_READ : OFF_MOVED_WRITE),
                           used, __ATOMIC_RELAXED);
    if (p.drawn > used)
        __atomic_fetch_sub(I64(p.att->page, OFF_TAKEN), p.drawn - used, __ATOMIC_RELAXED);
    /* Landed: on the buffer now (or never written), after the call, never before it. */
    if (p.claimed > 0)
        __atomic_fetch_add(I64(p.att->page, OFF_SPACE_LANDED), p.claimed, __ATOMIC_RELEASE);
    if (p.writing)
        __atomic_fetch_sub(I64(p.att->page, OFF_WRITING), 1, __ATOMIC_SEQ_CST);
}

/* ------------------------------------------------------------------ stage.c: the stage-out */

int stage_opened(int fd, int flags);
void stage_closing(int fd);
int stage_take_told(int fd);
void stage_tell_close(int fd);
int stage_open_flags(const char *mode);

/* ------------------------------------------------------------------ meta.c: metadata calls */

void pace_metadata(void);

/* Paces a metadata call on `path` (relative to `dirfd`) when it lies under the burst-buffer
 * paths: lexically, in this process, so that a call elsewhere costs no agent and no wait. */
static inline void pace_metadata_at(int dirfd, const char *path) {
    char norm[PATH_MAX];
    if (path_state(dirfd, path, norm, sizeof norm) == ST_PACED)
        pace_metadata();
}

#pragma GCC visibility pop

#endif
