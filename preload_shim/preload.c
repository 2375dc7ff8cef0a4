/*
 * The library's parts that are not yet rooms of their own: pacing a call and the
 * interposed entry points.
 */
#include "preload.h"

/* ------------------------------------------------------------------ pacing a call */

/* A read larger than this is first bounded by what the file still holds (an fstat and, for
 * a read at the file position, an lseek): a 1 GiB buffer for a 4 KiB file must not wait for
 * 1 GiB of tokens, nor cp's copy_file_range of "everything" for ever. */
#define LARGE_READ (256 * 1024)

static size_t clamp_read(int fd, size_t n, int64_t off) {
    if (n <= LARGE_READ || fd < 0)
        return n;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return n;
    if (off < 0 && (off = lseek(fd, 0, SEEK_CUR)) < 0)
        return n;
    int64_t left = (int64_t)st.st_size - off;
    if (left < 0)
        left = 0;
    return (uint64_t)left < n ? (size_t)left : n;
}

/* What a paced call drew: the attachment to count on (NULL: unpaced) and the tokens. */
struct paced {
    struct attachment *att;
    int64_t drawn;
};

/* Paces a call of n bytes (a read on fd at off, -1: its position, is bounded first). */
static struct paced pace(int kind, size_t n, int fd, int64_t off) {
    struct paced p = {NULL, 0};
    SAVE_ERRNO();
    struct attachment *att = __atomic_load_n(&g_att, __ATOMIC_ACQUIRE);
    if (UNLIKELY(!att || __atomic_load_n(&att->dead, __ATOMIC_ACQUIRE))) {
        maybe_attach();
        att = __atomic_load_n(&g_att, __ATOMIC_ACQUIRE);
        if (!att || __atomic_load_n(&att->dead, __ATOMIC_ACQUIRE)) {
            RESTORE_ERRNO();
            return p;
        }
    }
    t_in_lib++;
    if (kind == KIND_READ)
        n = clamp_read(fd, n, off);
    void *page = att->page;
    int64_t bytes = n > (size_t)INT64_MAX ? INT64_MAX : (int64_t)n;
    __atomic_fetch_add(I64(page, kind == KIND_READ ? OFF_REQ_READ : OFF_REQ_WRITE), bytes,
                       __ATOMIC_RELAXED);
    __atomic_fetch_add(I64(page, kind == KIND_READ ? OFF_CALLS_READ : OFF_CALLS_WRITE), 1,
                       __ATOMIC_RELAXED);
    const char *why = "";
    if (reserve_and_wait(page, bytes, &att->eventfd, g_dead_after_ns, &why, &p.drawn) != 0)
        mark_dead(att, why);
    t_in_lib--;
    p.att = att;
    RESTORE_ERRNO();
    return p;
}

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
}

static size_t iov_bytes(const struct iovec *iov, int cnt) {
    size_t total = 0;
    for (int i = 0; iov && i < cnt; i++) {
        size_t l = iov[i].iov_len;
        total = total + l < total ? SIZE_MAX : total + l;
    }
    return total;
}

/* ------------------------------------------------------------------ opens */

static inline int needs_mode(int flags) {
    return (flags & O_CREAT) || ((flags & O_TMPFILE) == O_TMPFILE);
}

#define OPEN_BODY(name, dirfd, path, flags, call)                                              \
    do {                                                                                        \
        NEED(name, NULL, -1);                                                                   \
        if (t_in_lib)                                                                           \
            return call;                                                                        \
        ensure_init();                                                                          \
        int fd_ = call;                                                                         \
        if (g_enabled)                                                                          \
            after_open(dirfd, path, fd_, flags);                                                \
        return fd_;                                                                             \
    } while (0)

#define MODE_ARG(flags)                                                                        \
    mode_t mode = 0;                                                                            \
    if (needs_mode(flags)) {                                                                    \
        va_list ap;                                                                             \
        va_start(ap, flags);                                                                    \
        mode = (mode_t)va_arg(ap, int);                                                         \
        va_end(ap);                                                                             \
    }

EXPORT int open(const char *path, int flags, ...) {
    MODE_ARG(flags);
    OPEN_BODY(open, AT_FDCWD, path, flags, real_open(path, flags, mode));
}

EXPORT int open64(const char *path, int flags, ...) {
    MODE_ARG(flags);
    OPEN_BODY(open64, AT_FDCWD, path, flags, real_open64(path, flags, mode));
}

EXPORT int openat(int dirfd, const char *path, int flags, ...) {
    MODE_ARG(flags);
    OPEN_BODY(openat, dirfd, path, flags, real_openat(dirfd, path, flags, mode));
}

EXPORT int openat64(int dirfd, const char *path, int flags, ...) {
    MODE_ARG(flags);
    OPEN_BODY(openat64, dirfd, path, flags, real_openat64(dirfd, path, flags, mode));
}

EXPORT int creat(const char *path, mode_t mode) {
    OPEN_BODY(creat, AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, real_creat(path, mode));
}

EXPORT int creat64(const char *path, mode_t mode) {
    OPEN_BODY(creat64, AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, real_creat64(path, mode));
}

EXPORT int __open_2(const char *path, int flags) {
    OPEN_BODY(__open_2, AT_FDCWD, path, flags, real___open_2(path, flags));
}

EXPORT int __open64_2(const char *path, int flags) {
    OPEN_BODY(__open64_2, AT_FDCWD, path, flags, real___open64_2(path, flags));
}

EXPORT int __openat_2(int dirfd, const char *path, int flags) {
    OPEN_BODY(__openat_2, dirfd, path, flags, real___openat_2(dirfd, path, flags));
}

EXPORT int __openat64_2(int dirfd, const char *path, int flags) {
    OPEN_BODY(__openat64_2, dirfd, path, flags, real___openat64_2(dirfd, path, flags));
}

/* ------------------------------------------------------------------ close, dup, fcntl */

EXPORT int close(int fd) {
    NEED(close, NULL, -1);
    if (!t_in_lib) {
        ensure_init();
        if (g_enabled && fd >= 0 && fd < g_nfds) {
            SAVE_ERRNO();
            set_state(fd, ST_UNKNOWN); /* before: a new open of the same number then wins */
            RESTORE_ERRNO();
        }
    }
    return real_close(fd);
}

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

/* Closes the library does not see one by one would leave a number's state behind for the
 * next descriptor that a call it does not intercept (socket, pipe, accept...) gets. */
static void forget_range(unsigned int first, unsigned int last) {
    if (!g_enabled)
        return;
    SAVE_ERRNO();
    for (unsigned int fd = first; fd <= last && fd < (unsigned int)g_nfds; fd++)
        if (__atomic_load_n(&g_fds[fd], __ATOMIC_RELAXED) != ST_UNKNOWN)
            set_state((int)fd, ST_UNKNOWN);
    RESTORE_ERRNO();
}

EXPORT int close_range(unsigned int first, unsigned int last, int flags) {
    NEED(close_range, NULL, -1);
    if (!t_in_lib && !(flags & CLOSE_RANGE_CLOEXEC)) {
        ensure_init();
        forget_range(first, last);
    }
    return real_close_range(first, last, flags);
}

EXPORT void closefrom(int lowfd) {
    RESOLVE(closefrom, NULL);
    if (!real_closefrom)
        return;
    if (!t_in_lib && lowfd >= 0) {
        ensure_init();
        forget_range((unsigned int)lowfd, ~0u);
    }
    real_closefrom(lowfd);
}

/* closedir closes its fd inside glibc: a directory opened with open(O_DIRECTORY) and passed to
 * fdopendir (tar, cp -r, find) would leave its state and cached path behind. */
EXPORT int closedir(DIR *dir) {
    NEED(closedir, NULL, -1);
    if (!t_in_lib) {
        ensure_init();
        if (g_enabled) {
            SAVE_ERRNO();
            int fd = dirfd(dir);
            if (fd >= 0)
                set_state(fd, ST_UNKNOWN);
            RESTORE_ERRNO();
        }
    }
    return real_closedir(dir);
}

/* Before a call that replaces fd (dup2 and dup3 onto it): the library lets go of it first. */
static void before_replace(int fd) {
    if (g_enabled && fd >= 0 && fd < g_nfds &&
        UNLIKELY(__atomic_load_n(&g_fds[fd], __ATOMIC_RELAXED) & ST_OWN)) {
        SAVE_ERRNO();
        set_state(fd, ST_UNKNOWN);
        RESTORE_ERRNO();
    }
}

static void copy_state(int oldfd, int newfd) {
    if (newfd < 0 || !g_enabled || newfd >= g_nfds)
        return;
    SAVE_ERRNO();
    int st = ST_UNKNOWN;
    if (oldfd >= 0 && oldfd < g_nfds)
        st = __atomic_load_n(&g_fds[oldfd], __ATOMIC_RELAXED) & ST_MASK;
    set_state(newfd, st);
    RESTORE_ERRNO();
}

EXPORT int dup(int oldfd) {
    NEED(dup, NULL, -1);
    if (t_in_lib)
        return real_dup(oldfd);
    ensure_init();
    int fd = real_dup(oldfd);
    copy_state(oldfd, fd);
    return fd;
}

EXPORT int dup2(int oldfd, int newfd) {
    NEED(dup2, NULL, -1);
    if (t_in_lib)
        return real_dup2(oldfd, newfd);
    ensure_init();
    if (oldfd != newfd)
        before_replace(newfd);
    int fd = real_dup2(oldfd, newfd);
    if (fd >= 0 && oldfd != newfd)
        copy_state(oldfd, fd);
    return fd;
}

EXPORT int dup3(int oldfd, int newfd, int flags) {
    NEED(dup3, NULL, -1);
    if (t_in_lib)
        return real_dup3(oldfd, newfd, flags);
    ensure_init();
    if (oldfd != newfd)
        before_replace(newfd);
    int fd = real_dup3(oldfd, newfd, flags);
    copy_state(oldfd, fd);
    return fd;
}

/* fcntl's third argument, read as the command requires. */
enum { ARG_NONE, ARG_INT, ARG_PTR };
static int fcntl_arg_kind(int cmd) {
    switch (cmd) {
    case F_GETFD:
    case F_GETFL:
    case F_GETOWN:
#ifdef F_GETSIG
    case F_GETSIG:
#endif
#ifdef F_GETLEASE
    case F_GETLEASE:
#endif
#ifdef F_GETPIPE_SZ
    case F_GETPIPE_SZ:
#endif
#ifdef F_GET_SEALS
    case F_GET_SEALS:
#endif
        return ARG_NONE;
    case F_DUPFD:
    case F_DUPFD_CLOEXEC:
    case F_SETFD:
    case F_SETFL:
    case F_SETOWN:
#ifdef F_SETSIG
    case F_SETSIG:
#endif
#ifdef F_SETLEASE
    case F_SETLEASE:
#endif
#ifdef F_NOTIFY
    case F_NOTIFY:
#endif
#ifdef F_SETPIPE_SZ
    case F_SETPIPE_SZ:
#endif
#ifdef F_ADD_SEALS
    case F_ADD_SEALS:
#endif
        return ARG_INT;
    default:
        return ARG_PTR; /* locks, owner_ex, hints, and what this build does not know */
    }
}

#define FCNTL_BODY(name)                                                                       \
    do {                                                                                        \
        NEED(name, "fcntl", -1);                                                                \
        va_list ap;                                                                             \
        va_start(ap, cmd);                                                                      \
        int kind = fcntl_arg_kind(cmd);                                                         \
        int iarg = 0;                                                                           \
        void *parg = NULL;                                                                      \
        if (kind == ARG_INT)                                                                    \
            iarg = va_arg(ap, int);                                                             \
        else if (kind == ARG_PTR)                                                               \
            parg = va_arg(ap, void *);                                                          \
        va_end(ap);                                                                             \
        if (kind == ARG_NONE)                                                                   \
            return real_##name(fd, cmd);                                                        \
        if (kind == ARG_PTR)                                                                    \
            return real_##name(fd, cmd, parg);                                                  \
        int r = real_##name(fd, cmd, iarg);                                                     \
        if (!t_in_lib && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)) {                          \
            ensure_init();                                                                      \
            copy_state(fd, r);                                                                  \
        }                                                                                       \
        return r;                                                                               \
    } while (0)

EXPORT int fcntl(int fd, int cmd, ...) {
    FCNTL_BODY(fcntl);
}

EXPORT int fcntl64(int fd, int cmd, ...) {
    FCNTL_BODY(fcntl64);
}

/* ------------------------------------------------------------------ reads and writes */

/* The body of a paced-or-not call on fd moving `n` bytes of `kind`. */
#define IO_BODY(name, fd, kind, n, off, call)                                                   \
    do {                                                                                        \
        NEED(name, NULL, -1);                                                                   \
        if (t_in_lib || LIKELY(fd_state(fd) != ST_PACED))                                       \
            return call;                                                                        \
        struct paced p_ = pace(kind, n, fd, off);                                               \
        ssize_t r_ = call;                                                                      \
        if (p_.att) {                                                                           \
            SAVE_ERRNO();                                                                       \
            settle(p_, kind, r_);                                                               \
            RESTORE_ERRNO();                                                                    \
        }                                                                                       \
        return r_;                                                                              \
    } while (0)

EXPORT ssize_t read(int fd, void *buf, size_t n) {
    IO_BODY(read, fd, KIND_READ, n, -1, real_read(fd, buf, n));
}

EXPORT ssize_t write(int fd, const void *buf, size_t n) {
    IO_BODY(write, fd, KIND_WRITE, n, -1, real_write(fd, buf, n));
}

EXPORT ssize_t pread(int fd, void *buf, size_t n, off_t off) {
    IO_BODY(pread, fd, KIND_READ, n, off, real_pread(fd, buf, n, off));
}

EXPORT ssize_t pread64(int fd, void *buf, size_t n, off64_t off) {
    IO_BODY(pread64, fd, KIND_READ, n, off, real_pread64(fd, buf, n, off));
}

EXPORT ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    IO_BODY(pwrite, fd, KIND_WRITE, n, off, real_pwrite(fd, buf, n, off));
}

EXPORT ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t off) {
    IO_BODY(pwrite64, fd, KIND_WRITE, n, off, real_pwrite64(fd, buf, n, off));
}

EXPORT ssize_t readv(int fd, const struct iovec *iov, int cnt) {
    IO_BODY(readv, fd, KIND_READ, iov_bytes(iov, cnt), -1, real_readv(fd, iov, cnt));
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    IO_BODY(writev, fd, KIND_WRITE, iov_bytes(iov, cnt), -1, real_writev(fd, iov, cnt));
}

EXPORT ssize_t preadv(int fd, const struct iovec *iov, int cnt, off_t off) {
    IO_BODY(preadv, fd, KIND_READ, iov_bytes(iov, cnt), off, real_preadv(fd, iov, cnt, off));
}

EXPORT ssize_t preadv64(int fd, const struct iovec *iov, int cnt, off64_t off) {
    IO_BODY(preadv64, fd, KIND_READ, iov_bytes(iov, cnt), off, real_preadv64(fd, iov, cnt, off));
}

EXPORT ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off) {
    IO_BODY(pwritev, fd, KIND_WRITE, iov_bytes(iov, cnt), off, real_pwritev(fd, iov, cnt, off));
}

EXPORT ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off64_t off) {
    IO_BODY(pwritev64, fd, KIND_WRITE, iov_bytes(iov, cnt), off, real_pwritev64(fd, iov, cnt, off));
}

EXPORT ssize_t preadv2(int fd, const struct iovec *iov, int cnt, off_t off, int flags) {
    IO_BODY(preadv2, fd, KIND_READ, iov_bytes(iov, cnt), off,
            real_preadv2(fd, iov, cnt, off, flags));
}

EXPORT ssize_t pwritev2(int fd, const struct iovec *iov, int cnt, off_t off, int flags) {
    IO_BODY(pwritev2, fd, KIND_WRITE, iov_bytes(iov, cnt), off,
            real_pwritev2(fd, iov, cnt, off, flags));
}

EXPORT ssize_t preadv64v2(int fd, const struct iovec *iov, int cnt, off64_t off, int flags) {
    IO_BODY(preadv64v2, fd, KIND_READ, iov_bytes(iov, cnt), off,
            real_preadv64v2(fd, iov, cnt, off, flags));
}

EXPORT ssize_t pwritev64v2(int fd, const struct iovec *iov, int cnt, off64_t off, int flags) {
    IO_BODY(pwritev64v2, fd, KIND_WRITE, iov_bytes(iov, cnt), off,
            real_pwritev64v2(fd, iov, cnt, off, flags));
}

ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen);
EXPORT ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen) {
    IO_BODY(__read_chk, fd, KIND_READ, n, -1, real___read_chk(fd, buf, n, buflen));
}

ssize_t __pread_chk(int fd, void *buf, size_t n, off_t off, size_t buflen);
EXPORT ssize_t __pread_chk(int fd, void *buf, size_t n, off_t off, size_t buflen) {
    IO_BODY(__pread_chk, fd, KIND_READ, n, off, real___pread_chk(fd, buf, n, off, buflen));
}

ssize_t __pread64_chk(int fd, void *buf, size_t n, off64_t off, size_t buflen);
EXPORT ssize_t __pread64_chk(int fd, void *buf, size_t n, off64_t off, size_t buflen) {
    IO_BODY(__pread64_chk, fd, KIND_READ, n, off, real___pread64_chk(fd, buf, n, off, buflen));
}

/* Two fds: a read paced on `in` when it is paced, a write on `out` when it is. */
#define TWO_FD_BODY(name, in, in_off_, out, n, call)                                            \
    do {                                                                                        \
        NEED(name, NULL, -1);                                                                   \
        if (t_in_lib)                                                                           \
            return call;                                                                        \
        int pin_ = fd_state(in) == ST_PACED, pout_ = fd_state(out) == ST_PACED;                 \
        if (LIKELY(!pin_ && !pout_))                                                            \
            return call;                                                                        \
        size_t n_ = n;                                                                          \
        if (in_off_ != -2) { /* bounded by what `in` still holds, when it is a file */         \
            SAVE_ERRNO();                                                                       \
            t_in_lib++;                                                                         \
            n_ = clamp_read(in, n_, in_off_);                                                   \
            t_in_lib--;                                                                         \
            RESTORE_ERRNO();                                                                    \
        }                                                                                       \
        struct paced pin2_ = {NULL, 0}, pout2_ = {NULL, 0};                                     \
        if (pin_)                                                                               \
            pin2_ = pace(KIND_READ, n_, -1, -1);                                                \
        if (pout_)                                                                              \
            pout2_ = pace(KIND_WRITE, n_, -1, -1);                                              \
        ssize_t r_ = call;                                                                      \
        SAVE_ERRNO();                                                                           \
        settle(pin2_, KIND_READ, r_);                                                           \
        settle(pout2_, KIND_WRITE, r_);                                                         \
        RESTORE_ERRNO();                                                                        \
        return r_;                                                                              \
    } while (0)

EXPORT ssize_t copy_file_range(int in, off64_t *off_in, int out, off64_t *off_out, size_t n,
                               unsigned int flags) {
    TWO_FD_BODY(copy_file_range, in, off_in ? *off_in : -1, out, n,
                real_copy_file_range(in, off_in, out, off_out, n, flags));
}

EXPORT ssize_t sendfile(int out, int in, off_t *off, size_t n) {
    TWO_FD_BODY(sendfile, in, off ? *off : -1, out, n, real_sendfile(out, in, off, n));
}

EXPORT ssize_t sendfile64(int out, int in, off64_t *off, size_t n) {
    TWO_FD_BODY(sendfile64, in, off ? *off : -1, out, n, real_sendfile64(out, in, off, n));
}

/* ------------------------------------------------------------------ stdio */

/* stdio's own reads and writes go through glibc's internal write, which no preloaded library
 * sees: fread/fwrite are paced for what the caller asks, on the stream's fd. */
static size_t mul_clamp(size_t a, size_t b) {
    if (a && b > SIZE_MAX / a)
        return SIZE_MAX;
    return a * b;
}

#define STDIO_BODY(name, stream, kind, size, nmemb, call)                                      \
    do {                                                                                        \
        NEED(name, NULL, 0);                                                                    \
        if (t_in_lib)                                                                           \
            return call;                                                                        \
        ensure_init();                                                                          \
        if (LIKELY(!g_enabled) || fd_state(fileno_unlocked(stream)) != ST_PACED)                \
            return call;                                                                        \
        struct paced p_ = pace(kind, mul_clamp(size, nmemb), -1, -1);                           \
        size_t r_ = call;                                                                       \
        SAVE_ERRNO();                                                                           \
        settle(p_, kind, (ssize_t)mul_clamp(r_, size));                                         \
        RESTORE_ERRNO();                                                                        \
        return r_;                                                                              \
    } while (0)

EXPORT size_t fread(void *ptr, size_t size, size_t nmemb, FILE *stream) {
    STDIO_BODY(fread, stream, KIND_READ, size, nmemb, real_fread(ptr, size, nmemb, stream));
}

EXPORT size_t fwrite(const void *ptr, size_t size, size_t nmemb, FILE *stream) {
    STDIO_BODY(fwrite, stream, KIND_WRITE, size, nmemb, real_fwrite(ptr, size, nmemb, stream));
}

EXPORT size_t fread_unlocked(void *ptr, size_t size, size_t nmemb, FILE *stream) {
    STDIO_BODY(fread_unlocked, stream, KIND_READ, size, nmemb,
               real_fread_unlocked(ptr, size, nmemb, stream));
}

EXPORT size_t fwrite_unlocked(const void *ptr, size_t size, size_t nmemb, FILE *stream) {
    STDIO_BODY(fwrite_unlocked, stream, KIND_WRITE, size, nmemb,
               real_fwrite_unlocked(ptr, size, nmemb, stream));
}

size_t __fread_chk(void *ptr, size_t ptrlen, size_t size, size_t nmemb, FILE *stream);
EXPORT size_t __fread_chk(void *ptr, size_t ptrlen, size_t size, size_t nmemb, FILE *stream) {
    STDIO_BODY(__fread_chk, stream, KIND_READ, size, nmemb,
               real___fread_chk(ptr, ptrlen, size, nmemb, stream));
}

size_t __fread_unlocked_chk(void *ptr, size_t ptrlen, size_t size, size_t nmemb, FILE *stream);
EXPORT size_t __fread_unlocked_chk(void *ptr, size_t ptrlen, size_t size, size_t nmemb,
                                   FILE *stream) {
    STDIO_BODY(__fread_unlocked_chk, stream, KIND_READ, size, nmemb,
               real___fread_unlocked_chk(ptr, ptrlen, size, nmemb, stream));
}

static void after_fopen(const char *path, FILE *f) {
    if (!f)
        return;
    SAVE_ERRNO();
    int fd = fileno_unlocked(f);
    RESTORE_ERRNO();
    after_open(AT_FDCWD, path, fd, 0);
}

#define FOPEN_BODY(name, call)                                                                 \
    do {                                                                                        \
        NEED(name, NULL, NULL);                                                                 \
        if (t_in_lib)                                                                           \
            return call;                                                                        \
        ensure_init();                                                                          \
        FILE *f_ = call;                                                                        \
        if (g_enabled)                                                                          \
            after_fopen(path, f_);                                                              \
        return f_;                                                                              \
    } while (0)

EXPORT FILE *fopen(const char *path, const char *mode) {
    FOPEN_BODY(fopen, real_fopen(path, mode));
}

EXPORT FILE *fopen64(const char *path, const char *mode) {
    FOPEN_BODY(fopen64, real_fopen64(path, mode));
}

EXPORT FILE *fdopen(int fd, const char *mode) {
    /* The stream is the fd's: its state is already the fd's (resolved on first use). */
    NEED(fdopen, NULL, NULL);
    return real_fdopen(fd, mode);
}

static int stream_fd_reset(FILE *stream) {
    if (!stream)
        return -1;
    SAVE_ERRNO();
    int fd = fileno_unlocked(stream);
    if (fd >= 0)
        set_state(fd, ST_UNKNOWN);
    RESTORE_ERRNO();
    return fd;
}

#define FREOPEN_BODY(name, call)                                                               \
    do {                                                                                        \
        NEED(name, NULL, NULL);                                                                 \
        if (t_in_lib)                                                                           \
            return call;                                                                        \
        ensure_init();                                                                          \
        if (!g_enabled)                                                                         \
            return call;                                                                        \
        if (path) /* a new file; a NULL path keeps the file and changes the mode */             \
            stream_fd_reset(stream);                                                            \
        FILE *f_ = call;                                                                        \
        if (path)                                                                               \
            after_fopen(path, f_);                                                              \
        return f_;                                                                              \
    } while (0)

EXPORT FILE *freopen(const char *path, const char *mode, FILE *stream) {
    FREOPEN_BODY(freopen, real_freopen(path, mode, stream));
}

EXPORT FILE *freopen64(const char *path, const char *mode, FILE *stream) {
    FREOPEN_BODY(freopen64, real_freopen64(path, mode, stream));
}

EXPORT int fclose(FILE *stream) {
    NEED(fclose, NULL, EOF);
    if (!t_in_lib && stream) {
        ensure_init();
        if (g_enabled)
            stream_fd_reset(stream);
    }
    return real_fclose(stream);
}

EXPORT int fflush(FILE *stream) {
    /* Pass-through: the bytes were counted when fwrite took them. */
    NEED(fflush, NULL, EOF);
    return real_fflush(stream);
}

/* ------------------------------------------------------------------ the working directory */

/* After a chdir or fchdir that returned r: the cached working directory follows it. */
static int cwd_changed(int r) {
    if (r == 0 && !t_in_lib) {
        ensure_init();
        if (g_enabled) {
            SAVE_ERRNO();
            refresh_cwd();
            RESTORE_ERRNO();
        }
    }
    return r;
}

EXPORT int chdir(const char *path) {
    NEED(chdir, NULL, -1);
    return cwd_changed(real_chdir(path));
}

EXPORT int fchdir(int fd) {
    NEED(fchdir, NULL, -1);
    return cwd_changed(real_fchdir(fd));
}
