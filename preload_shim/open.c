/*
 * The open, close, dup and fcntl family, and chdir and fchdir: the calls that make, copy and
 * end descriptors, and so set, copy and forget their states in the per-fd table (fdstate.c),
 * and the two that move the working directory against which relative paths are classified.
 * An open of a path under the burst-buffer paths is one metadata call, paced before it
 * (meta.c); it attaches the process to the agent (attach.c). The others are not paced.
 */
#include "preload.h"

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
        if (!g_enabled)                                                                         \
            return call;                                                                        \
        char norm_[PATH_MAX];                                                                   \
        int st_ = path_state(dirfd, path, norm_, sizeof norm_);                                 \
        if (st_ == ST_PACED)                                                                    \
            pace_metadata();                                                                    \
        int fd_ = call;                                                                         \
        if (after_open(fd_, flags, st_, norm_) != 0) {                                          \
            set_state(fd_, ST_UNKNOWN);                                                         \
            real_close(fd_);                                                                    \
            errno = EIO; /* an evicted file the agent could not bring back: stage.c */          \
            return -1;                                                                          \
        }                                                                                       \
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
            stage_closing(fd);
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
        UNLIKELY(__atomic_load_n(&g_fds[fd], __ATOMIC_RELAXED) & ST_TOLD)) {
        SAVE_ERRNO();
        stage_closing(fd);
        RESTORE_ERRNO();
    }
    if (g_enabled && fd >= 0 && fd < g_nfds &&
        UNLIKELY(__atomic_load_n(&g_fds[fd], __ATOMIC_RELAXED) & ST_OWN)) {
        SAVE_ERRNO();
        set_state(fd, ST_UNKNOWN);
        RESTORE_ERRNO();
    }
}

/* A copy of a descriptor (dup, dup2, dup3, F_DUPFD) is paced as the original. A copy of one
 * the agent's stage-out was told of is told too, as one more open of the file: each copy's
 * close is told, and the file is not closed for the stage-out (copied, evicted) while a copy
 * is still open (dd reopens its output as stdout with open, dup2 and close). */
static void copy_state(int oldfd, int newfd) {
    if (newfd < 0 || !g_enabled || newfd >= g_nfds)
        return;
    SAVE_ERRNO();
    int st = ST_UNKNOWN, told = 0;
    if (oldfd >= 0 && oldfd < g_nfds) {
        int old = __atomic_load_n(&g_fds[oldfd], __ATOMIC_RELAXED);
        st = old & ST_MASK;
        told = old & ST_TOLD;
    }
    set_state(newfd, st);
    if (told) {
        RESOLVE(fcntl, NULL);
        int flags = real_fcntl ? real_fcntl(newfd, F_GETFL) : -1;
        if (flags >= 0) {
            t_in_lib++;
            (void)stage_opened(newfd, flags & ~(O_CREAT | O_EXCL | O_TRUNC));
            t_in_lib--;
        }
    }
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
