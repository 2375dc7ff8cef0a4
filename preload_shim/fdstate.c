/*
 * Which descriptors are paced: the library's configuration (read from the environment once, at
 * the first intercepted call), the lexical classification of a path against the burst-buffer
 * paths, the cached working directory, the per-fd state table and its cache of directory paths
 * (for openat), and the state an open gives its new descriptor (a paced one attaches the
 * process to the agent).
 */
#include "preload.h"

#define MAX_FDS (1 << 20)
#define MAX_ROOTS 32
#define DIRCACHE_SLOTS 256

pthread_once_t g_once = PTHREAD_ONCE_INIT;
int g_ready;          /* init done (acquire/release) */
int g_enabled;        /* BURSTCTL_PRELOAD_PATHS names at least one directory */
unsigned char *g_fds; /* per-fd state bytes, anonymous mmap */
int g_nfds;
static char *g_roots[MAX_ROOTS];
static size_t g_root_len[MAX_ROOTS];
static int g_nroots;
char g_socket[sizeof(((struct sockaddr_un *)0)->sun_path)];
int64_t g_dead_after_ns = 2000000000LL;

static pthread_mutex_t g_cwd_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_cwd[PATH_MAX];
static int g_cwd_ok;

static pthread_mutex_t g_dir_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int fd;
    char *path;
} g_dirs[DIRCACHE_SLOTS];

/* Lexical normalisation of an absolute path: `//`, `/./` and `/../` go, no symlink is read.
 * Returns 0, or -1 when `in` is not absolute or does not fit. */
static int normalize(const char *in, char *out, size_t cap) {
    if (in[0] != '/' || cap < 2)
        return -1;
    size_t len = 0;
    const char *p = in;
    while (*p) {
        while (*p == '/')
            p++;
        if (!*p)
            break;
        const char *end = p;
        while (*end && *end != '/')
            end++;
        size_t n = (size_t)(end - p);
        if (n == 1 && p[0] == '.') {
            /* nothing */
        } else if (n == 2 && p[0] == '.' && p[1] == '.') {
            while (len > 0 && out[len - 1] != '/')
                len--;
            if (len > 0)
                len--; /* the slash before the dropped component */
        } else {
            if (len + 1 + n + 1 > cap)
                return -1;
            out[len++] = '/';
            memcpy(out + len, p, n);
            len += n;
        }
        p = end;
    }
    if (len == 0)
        out[len++] = '/';
    out[len] = '\0';
    return 0;
}

/* `rel` joined to the absolute directory `base`, normalised. */
static int join(const char *base, const char *rel, char *out, size_t cap) {
    if (rel[0] == '/')
        return normalize(rel, out, cap);
    char buf[2 * PATH_MAX + 2];
    size_t b = strlen(base), r = strlen(rel);
    if (b + 1 + r + 1 > sizeof buf)
        return -1;
    memcpy(buf, base, b);
    buf[b] = '/';
    memcpy(buf + b + 1, rel, r + 1);
    return normalize(buf, out, cap);
}

static int under_roots(const char *norm) {
    for (int i = 0; i < g_nroots; i++) {
        size_t n = g_root_len[i];
        if (n == 1) /* "/" */
            return 1;
        if (strncmp(norm, g_roots[i], n) == 0 && (norm[n] == '\0' || norm[n] == '/'))
            return 1;
    }
    return 0;
}

static int fd_path(int fd, char *out, size_t cap) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, out, cap - 1);
    if (n <= 0 || out[0] != '/')
        return -1;
    out[n] = '\0';
    return 0;
}

void refresh_cwd(void) {
    char buf[PATH_MAX];
    int ok = getcwd(buf, sizeof buf) != NULL && buf[0] == '/';
    pthread_mutex_lock(&g_cwd_mu);
    g_cwd_ok = ok;
    if (ok)
        memcpy(g_cwd, buf, strlen(buf) + 1);
    pthread_mutex_unlock(&g_cwd_mu);
}

static int cwd_copy(char *out, size_t cap) {
    pthread_mutex_lock(&g_cwd_mu);
    int ok = g_cwd_ok && strlen(g_cwd) < cap;
    if (ok)
        memcpy(out, g_cwd, strlen(g_cwd) + 1);
    pthread_mutex_unlock(&g_cwd_mu);
    return ok ? 0 : -1;
}

static void atfork_prepare(void) {
    pthread_mutex_lock(&g_cwd_mu);
    pthread_mutex_lock(&g_dir_mu);
}

static void atfork_parent(void) {
    pthread_mutex_unlock(&g_dir_mu);
    pthread_mutex_unlock(&g_cwd_mu);
}

static void atfork_child(void) {
    pthread_mutex_unlock(&g_dir_mu);
    pthread_mutex_unlock(&g_cwd_mu);
    /* An attach under way in another thread of the parent does not exist here. The child
     * keeps the parent's page and connection: its I/O stays on its job. */
    __atomic_store_n(&g_attaching, 0, __ATOMIC_RELEASE);
}

void init_once(void) {
    t_in_lib++;
    const char *paths = getenv("BURSTCTL_PRELOAD_PATHS");
    if (paths && *paths) {
        char *copy = strdup(paths);
        for (char *save = NULL, *tok = copy ? strtok_r(copy, ":", &save) : NULL;
             tok && g_nroots < MAX_ROOTS; tok = strtok_r(NULL, ":", &save)) {
            char norm[PATH_MAX];
            if (normalize(tok, norm, sizeof norm) != 0)
                continue; /* relative or too long: ignored */
            char *root = strdup(norm);
            if (!root)
                continue;
            g_roots[g_nroots] = root;
            g_root_len[g_nroots] = strlen(root);
            g_nroots++;
        }
        free(copy);
    }
    const char *sock = getenv("BURSTCTL_AGENT_SOCKET");
    snprintf(g_socket, sizeof g_socket, "%s", sock && *sock ? sock : "/run/burstctl/agent.sock");
    const char *dead = getenv("BURSTCTL_PRELOAD_DEAD_AFTER");
    if (dead && *dead) {
        char *end;
        double s = strtod(dead, &end);
        if (end != dead && s > 0 && s < 1e6)
            g_dead_after_ns = (int64_t)(s * 1e9);
    }
    if (g_nroots > 0) {
        struct rlimit rl;
        long n = 65536;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
            rlim_t m = rl.rlim_max > rl.rlim_cur ? rl.rlim_max : rl.rlim_cur;
            n = m == RLIM_INFINITY || m > MAX_FDS ? MAX_FDS : (long)m;
            if (n < 1024)
                n = 1024;
        }
        void *table = mmap(NULL, (size_t)n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                           -1, 0);
        if (table != MAP_FAILED) {
            g_fds = table;
            g_nfds = (int)n;
            refresh_cwd();
            pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
            g_enabled = 1;
        }
    }
    __atomic_store_n(&g_ready, 1, __ATOMIC_RELEASE);
    t_in_lib--;
}

static void dircache_drop(int fd) {
    pthread_mutex_lock(&g_dir_mu);
    char *old = NULL;
    for (int i = 0; i < DIRCACHE_SLOTS; i++) {
        if (g_dirs[i].path && g_dirs[i].fd == fd) {
            old = g_dirs[i].path;
            g_dirs[i].path = NULL;
            break;
        }
    }
    pthread_mutex_unlock(&g_dir_mu);
    free(old);
}

static int dircache_add(int fd, const char *path) {
    char *copy = strdup(path);
    if (!copy)
        return -1;
    int slot = -1;
    pthread_mutex_lock(&g_dir_mu);
    for (int i = 0; i < DIRCACHE_SLOTS; i++) {
        if (!g_dirs[i].path) {
            slot = i;
            g_dirs[i].fd = fd;
            g_dirs[i].path = copy;
            break;
        }
    }
    pthread_mutex_unlock(&g_dir_mu);
    if (slot < 0) {
        free(copy);
        return -1;
    }
    return 0;
}

static int dircache_get(int fd, char *out, size_t cap) {
    int found = -1;
    pthread_mutex_lock(&g_dir_mu);
    for (int i = 0; i < DIRCACHE_SLOTS; i++) {
        if (g_dirs[i].path && g_dirs[i].fd == fd && strlen(g_dirs[i].path) < cap) {
            memcpy(out, g_dirs[i].path, strlen(g_dirs[i].path) + 1);
            found = 0;
            break;
        }
    }
    pthread_mutex_unlock(&g_dir_mu);
    return found;
}

/* Sets fd's state, dropping a cached directory path it had. */
void set_state(int fd, int st) {
    if (fd < 0 || fd >= g_nfds)
        return;
    unsigned char old = __atomic_exchange_n(&g_fds[fd], (unsigned char)st, __ATOMIC_RELAXED);
    if (UNLIKELY(old & ST_DIRCACHED))
        dircache_drop(fd);
    if (UNLIKELY(old & ST_OWN))
        own_fd_lost(fd);
}

static int classify_norm(const char *norm) {
    return under_roots(norm) ? ST_PACED : ST_UNPACED;
}

/* An fd the library never saw open: once, by its /proc/self/fd link. */
int resolve_unknown(int fd) {
    SAVE_ERRNO();
    t_in_lib++;
    char path[PATH_MAX], norm[PATH_MAX];
    int st = ST_UNPACED;
    if (fd_path(fd, path, sizeof path) == 0 && normalize(path, norm, sizeof norm) == 0)
        st = classify_norm(norm);
    if (fd >= 0 && fd < g_nfds) {
        unsigned char expect = ST_UNKNOWN;
        /* an open in another thread may have set it meanwhile: that one wins */
        __atomic_compare_exchange_n(&g_fds[fd], &expect, (unsigned char)st, 0, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED);
    }
    t_in_lib--;
    RESTORE_ERRNO();
    return st;
}

/* The state of `path` (relative to `dirfd`) from the path alone, lexically: ST_PACED or
 * ST_UNPACED, its normalised form in `norm`; -1 when it has no usable base (its directory is
 * unknown). An empty path (a call on `dirfd` itself, AT_EMPTY_PATH) is ST_UNPACED. */
int path_state(int dirfd, const char *path, char *norm, size_t cap) {
    if (!g_enabled || !path || !*path)
        return ST_UNPACED;
    SAVE_ERRNO();
    t_in_lib++;
    char base[PATH_MAX];
    int ok = -1;
    if (path[0] == '/') {
        ok = normalize(path, norm, cap);
    } else {
        int have_base = -1;
        if (dirfd == AT_FDCWD)
            have_base = cwd_copy(base, sizeof base);
        else if (dirfd >= 0 && dirfd < g_nfds &&
                 (__atomic_load_n(&g_fds[dirfd], __ATOMIC_RELAXED) & ST_DIRCACHED))
            have_base = dircache_get(dirfd, base, sizeof base);
        if (have_base != 0 && dirfd != AT_FDCWD)
            have_base = fd_path(dirfd, base, sizeof base);
        if (have_base == 0)
            ok = join(base, path, norm, cap);
    }
    t_in_lib--;
    RESTORE_ERRNO();
    return ok == 0 ? classify_norm(norm) : -1;
}

/* After an open that returned fd, its path's state `st` and normalised form `norm` from
 * `path_state` before the call (-1: the kernel is asked where the new fd is); a paced one
 * attaches and is told to the agent's stage-out. -1: the open must fail (stage.c), errno is
 * EIO. */
int after_open(int fd, int flags, int st, const char *norm) {
    if (fd < 0)
        return 0;
    SAVE_ERRNO();
    t_in_lib++;
    char link[PATH_MAX], found[PATH_MAX];
    if (st < 0) { /* no usable base: ask the kernel where the new fd is */
        st = ST_UNPACED;
        norm = NULL;
        if (fd_path(fd, link, sizeof link) == 0 && normalize(link, found, sizeof found) == 0) {
            norm = found;
            st = classify_norm(found);
        }
    }
    set_state(fd, st);
    int is_dir = (flags & (O_DIRECTORY | O_PATH)) && (flags & O_TMPFILE) != O_TMPFILE;
    if (norm && is_dir && fd < g_nfds && dircache_add(fd, norm) == 0)
        __atomic_fetch_or(&g_fds[fd], (unsigned char)ST_DIRCACHED, __ATOMIC_RELAXED);
    t_in_lib--;
    int rc = 0;
    if (st == ST_PACED) {
        maybe_attach();
        t_in_lib++;
        rc = stage_opened(fd, flags);
        t_in_lib--;
    }
    RESTORE_ERRNO();
    if (rc != 0)
        errno = EIO;
    return rc;
}
