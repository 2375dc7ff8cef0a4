/*
 * The read and write family (read, write, their p-, v-, v2- and _chk forms, copy_file_range
 * and sendfile), and pacing one call: attach if need be, count the request on the page, draw
 * its tokens and wait for them (a write: then claim its space on the burst buffer) before the
 * real call; settle after it.
 */
#include "preload.h"

/* A read larger than this is first bounded by what the file still holds (an fstat and, for
 * a read at the file position, an lseek): a 1 GiB buffer for a 4 KiB file must not wait for
 * 1 GiB of tokens, nor cp's copy_file_range of "everything" for ever (aio.c bounds an AIO
 * read so too). */
#define LARGE_READ (256 * 1024)

size_t clamp_read(int fd, size_t n, int64_t off) {
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

/* Paces a call of n bytes (a read on fd at off, -1: its position, is bounded first). */
struct paced pace(int kind, size_t n, int fd, int64_t off) {
    struct paced p = {NULL, 0, 0, 0};
    SAVE_ERRNO();
    struct attachment *att = live_attachment();
    if (!att) {
        RESTORE_ERRNO();
        return p;
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
    if (reserve_and_wait(page, &LANE_BYTES, bytes, &att->eventfd, g_dead_after_ns, &why,
                         &p.drawn) != 0)
        mark_dead(att, why);
    else if (kind == KIND_WRITE &&
             claim_space(page, bytes, &att->eventfd, g_dead_after_ns, &why, &p.claimed) != 0)
        mark_dead(att, why);
    else if (kind == KIND_WRITE &&
             __atomic_load_n(U32(page, OFF_FLAGS), __ATOMIC_ACQUIRE) & FLAG_STAGE)
        p.writing = enter_write(page, g_dead_after_ns);
    t_in_lib--;
    p.att = att;
    RESTORE_ERRNO();
    return p;
}

static size_t iov_bytes(const struct iovec *iov, int cnt) {
    size_t total = 0;
    for (int i = 0; iov && i < cnt; i++) {
        size_t l = iov[i].iov_len;
        total = total + l < total ? SIZE_MAX : total + l;
    }
    return total;
}

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
        struct paced pin2_ = {NULL, 0, 0}, pout2_ = {NULL, 0, 0};                                     \
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
