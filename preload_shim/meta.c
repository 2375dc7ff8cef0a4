/*
 * The metadata calls on paths under the burst-buffer paths, paced as operations of the job's
 * metadata supply on the page (page.py, "Metadata operations"): unlink and unlinkat, rename,
 * renameat and renameat2, mkdir and mkdirat, rmdir, the stat family (stat, lstat, fstatat,
 * statx, their 64 forms and the __xstat forms older binaries call) and opendir; the opens are
 * paced in open.c and stdio.c through the same `pace_metadata`.
 *
 * The path is classified in this process, lexically, before anything else (`path_state`, as
 * an open's): a call on a path elsewhere goes to the real function at once, with no agent and
 * no wait. A call on an open descriptor (fstat, statx with AT_EMPTY_PATH) is not paced: it
 * names no path. A directory's listing is paced once, at its open (opendir, or the open of
 * an fdopendir's descriptor): readdir and getdents read what the open fetched, as the mount
 * paces one listing once.
 */
#include "preload.h"

/* One metadata call of the process's job: one token of the page's metadata supply (at once
 * while the job has no metadata limit: the supply is unlimited), the call counted for the
 * agent. Never fails the call: a dead page means "run unpaced", as for bytes. */
void pace_metadata(void) {
    SAVE_ERRNO();
    struct attachment *att = live_attachment();
    if (att) {
        t_in_lib++;
        __atomic_fetch_add(I64(att->page, OFF_CALLS_META), 1, __ATOMIC_RELAXED);
        const char *why = "";
        int64_t drawn;
        if (reserve_and_wait(att->page, &LANE_META, 1, &att->eventfd, g_dead_after_ns, &why,
                             &drawn) != 0)
            mark_dead(att, why);
        t_in_lib--;
    }
    RESTORE_ERRNO();
}

/* A metadata call on one path: paced when the path is under the burst-buffer paths. */
#define META_BODY(name, failure, dirfd, path, call)                                            \
    do {                                                                                        \
        NEED(name, NULL, failure);                                                              \
        if (!t_in_lib) {                                                                        \
            ensure_init();                                                                      \
            if (g_enabled)                                                                      \
                pace_metadata_at(dirfd, path);                                                  \
        }                                                                                       \
        return call;                                                                            \
    } while (0)

/* A rename: one call, paced when either name is under the burst-buffer paths. */
#define RENAME_BODY(name, olddirfd, oldpath, newdirfd, newpath, call)                          \
    do {                                                                                        \
        NEED(name, NULL, -1);                                                                   \
        if (!t_in_lib) {                                                                        \
            ensure_init();                                                                      \
            char norm_[PATH_MAX];                                                               \
            if (g_enabled && (path_state(olddirfd, oldpath, norm_, sizeof norm_) == ST_PACED || \
                              path_state(newdirfd, newpath, norm_, sizeof norm_) == ST_PACED))  \
                pace_metadata();                                                                \
        }                                                                                       \
        return call;                                                                            \
    } while (0)

EXPORT int unlink(const char *path) {
    META_BODY(unlink, -1, AT_FDCWD, path, real_unlink(path));
}

EXPORT int unlinkat(int dirfd, const char *path, int flags) {
    META_BODY(unlinkat, -1, dirfd, path, real_unlinkat(dirfd, path, flags));
}

EXPORT int rmdir(const char *path) {
    META_BODY(rmdir, -1, AT_FDCWD, path, real_rmdir(path));
}

EXPORT int mkdir(const char *path, mode_t mode) {
    META_BODY(mkdir, -1, AT_FDCWD, path, real_mkdir(path, mode));
}

EXPORT int mkdirat(int dirfd, const char *path, mode_t mode) {
    META_BODY(mkdirat, -1, dirfd, path, real_mkdirat(dirfd, path, mode));
}

EXPORT int rename(const char *oldpath, const char *newpath) {
    RENAME_BODY(rename, AT_FDCWD, oldpath, AT_FDCWD, newpath, real_rename(oldpath, newpath));
}

EXPORT int renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath) {
    RENAME_BODY(renameat, olddirfd, oldpath, newdirfd, newpath,
                real_renameat(olddirfd, oldpath, newdirfd, newpath));
}

EXPORT int renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath,
                     unsigned int flags) {
    RENAME_BODY(renameat2, olddirfd, oldpath, newdirfd, newpath,
                real_renameat2(olddirfd, oldpath, newdirfd, newpath, flags));
}

EXPORT int stat(const char *path, struct stat *buf) {
    META_BODY(stat, -1, AT_FDCWD, path, real_stat(path, buf));
}

EXPORT int stat64(const char *path, struct stat64 *buf) {
    META_BODY(stat64, -1, AT_FDCWD, path, real_stat64(path, buf));
}

EXPORT int lstat(const char *path, struct stat *buf) {
    META_BODY(lstat, -1, AT_FDCWD, path, real_lstat(path, buf));
}

EXPORT int lstat64(const char *path, struct stat64 *buf) {
    META_BODY(lstat64, -1, AT_FDCWD, path, real_lstat64(path, buf));
}

EXPORT int fstatat(int dirfd, const char *path, struct stat *buf, int flags) {
    META_BODY(fstatat, -1, dirfd, path, real_fstatat(dirfd, path, buf, flags));
}

EXPORT int fstatat64(int dirfd, const char *path, struct stat64 *buf, int flags) {
    META_BODY(fstatat64, -1, dirfd, path, real_fstatat64(dirfd, path, buf, flags));
}

EXPORT int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf) {
    META_BODY(statx, -1, dirfd, path, real_statx(dirfd, path, flags, mask, buf));
}

/* What binaries built against a glibc before 2.33 call for stat, lstat and fstatat. */
int __xstat(int ver, const char *path, struct stat *buf);
int __xstat64(int ver, const char *path, struct stat64 *buf);
int __lxstat(int ver, const char *path, struct stat *buf);
int __lxstat64(int ver, const char *path, struct stat64 *buf);
int __fxstatat(int ver, int dirfd, const char *path, struct stat *buf, int flags);
int __fxstatat64(int ver, int dirfd, const char *path, struct stat64 *buf, int flags);

EXPORT int __xstat(int ver, const char *path, struct stat *buf) {
    META_BODY(__xstat, -1, AT_FDCWD, path, real___xstat(ver, path, buf));
}

EXPORT int __xstat64(int ver, const char *path, struct stat64 *buf) {
    META_BODY(__xstat64, -1, AT_FDCWD, path, real___xstat64(ver, path, buf));
}

EXPORT int __lxstat(int ver, const char *path, struct stat *buf) {
    META_BODY(__lxstat, -1, AT_FDCWD, path, real___lxstat(ver, path, buf));
}

EXPORT int __lxstat64(int ver, const char *path, struct stat64 *buf) {
    META_BODY(__lxstat64, -1, AT_FDCWD, path, real___lxstat64(ver, path, buf));
}

EXPORT int __fxstatat(int ver, int dirfd, const char *path, struct stat *buf, int flags) {
    META_BODY(__fxstatat, -1, dirfd, path, real___fxstatat(ver, dirfd, path, buf, flags));
}

EXPORT int __fxstatat64(int ver, int dirfd, const char *path, struct stat64 *buf, int flags) {
    META_BODY(__fxstatat64, -1, dirfd, path, real___fxstatat64(ver, dirfd, path, buf, flags));
}

EXPORT DIR *opendir(const char *path) {
    META_BODY(opendir, NULL, AT_FDCWD, path, real_opendir(path));
}
