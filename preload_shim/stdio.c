/*
 * The stdio family: fopen and freopen (and their 64 forms), fdopen and fclose set or forget
 * the state of a stream's descriptor; fread and fwrite (and their unlocked and _chk forms) are
 * paced on it; fflush passes through.
 */
#include "preload.h"

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

/* The state of the path a stream is about to open (`path_state`); a paced one is one
 * metadata call, paced now (meta.c). */
static int before_fopen(const char *path, char *norm) {
    int st = path_state(AT_FDCWD, path, norm, PATH_MAX);
    if (st == ST_PACED)
        pace_metadata();
    return st;
}

/* The stream, or NULL (errno EIO) when the agent could not bring back the evicted file it
 * opened for writing (stage.c): then it is closed. `st` and `norm`: from `before_fopen`. */
static FILE *after_fopen(int st, const char *norm, const char *mode, FILE *f) {
    if (!f)
        return f;
    SAVE_ERRNO();
    int fd = fileno_unlocked(f);
    RESTORE_ERRNO();
    if (after_open(fd, stage_open_flags(mode), st, norm) == 0)
        return f;
    set_state(fd, ST_UNKNOWN);
    real_fclose(f);
    errno = EIO;
    return NULL;
}

#define FOPEN_BODY(name, call)                                                                 \
    do {                                                                                        \
        NEED(name, NULL, NULL);                                                                 \
        if (t_in_lib)                                                                           \
            return call;                                                                        \
        ensure_init();                                                                          \
        if (!g_enabled)                                                                         \
            return call;                                                                        \
        char norm_[PATH_MAX];                                                                   \
        int st_ = before_fopen(path, norm_);                                                    \
        FILE *f_ = call;                                                                        \
        return after_fopen(st_, norm_, mode, f_);                                               \
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
    if (fd >= 0) {
        stage_closing(fd);
        set_state(fd, ST_UNKNOWN);
    }
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
        if (!path) /* a NULL path keeps the file and changes the mode */                        \
            return call;                                                                        \
        stream_fd_reset(stream); /* a new file */                                               \
        char norm_[PATH_MAX];                                                                   \
        int st_ = before_fopen(path, norm_);                                                    \
        FILE *f_ = call;                                                                        \
        return after_fopen(st_, norm_, mode, f_);                                               \
    } while (0)

EXPORT FILE *freopen(const char *path, const char *mode, FILE *stream) {
    FREOPEN_BODY(freopen, real_freopen(path, mode, stream));
}

EXPORT FILE *freopen64(const char *path, const char *mode, FILE *stream) {
    FREOPEN_BODY(freopen64, real_freopen64(path, mode, stream));
}

EXPORT int fclose(FILE *stream) {
    NEED(fclose, NULL, EOF);
    int told = -1; /* a copy of a told file's descriptor: its close is told once flushed */
    if (!t_in_lib && stream) {
        ensure_init();
        if (g_enabled) {
            SAVE_ERRNO();
            int fd = fileno_unlocked(stream);
            if (stage_take_told(fd))
                told = real_fcntl(fd, F_DUPFD_CLOEXEC, 0);
            RESTORE_ERRNO();
            stream_fd_reset(stream);
        }
    }
    int r = real_fclose(stream);
    if (told >= 0) {
        SAVE_ERRNO();
        stage_tell_close(told);
        real_close(told);
        RESTORE_ERRNO();
    }
    return r;
}

EXPORT int fflush(FILE *stream) {
    /* Pass-through: the bytes were counted when fwrite took them. */
    NEED(fflush, NULL, EOF);
    return real_fflush(stream);
}
