/*
 * The agent's stage-out (docs/preload.md, "Capacity and stage-out"): the library tells the
 * agent of each paced regular file a process opens and of its close, so that the agent tags
 * the file as the job's, counts it on the buffer, and queues it for its copy to the PFS at its
 * last close, as the mount does for the files written through it. An evicted file (its data
 * only on the PFS) opened for reading is served from its PFS copy; opened to change it, it is
 * first brought back by the agent.
 *
 * Each message goes on a connection of its own (no answer of one thread or of a forked child
 * can reach another), with the descriptor itself (SCM_RIGHTS), from which the agent reads the
 * file, its access mode and its path:
 *  - "OPEN <flags>" + fd, after the real open: the agent answers "OK" (told: the close is
 *    told too), "SKIP" (nothing to tell: not a regular file, not on a stage-out), "PFS" + the
 *    PFS copy's descriptor (an evicted file opened for reading: it replaces the application's
 *    descriptor), or "EIO <reason>" (an evicted file that cannot be brought back: the open
 *    fails with EIO rather than let the application change the empty stub); any other
 *    answer (an agent that does not know the request) leaves the open untold;
 *  - "CLOSE" + fd, before the real close of a told descriptor: no answer.
 * An agent that cannot be reached, or a page that dies while an answer is awaited, leaves the
 * open as it is (untold). An agent with no stage-out (FLAG_STAGE unset) is told only of opens
 * for writing, and only while its job's space is limited: nothing would use the others.
 */
#include "preload.h"

#define ANSWER_SLICE_MS 100 /* how often a wait for the agent's answer checks the page */

/* Descriptors told, in this process image (a fork's child forgets them: forget_told). */
static int g_told;

static int send_with_fd(int s, const char *msg, int fd) {
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec iov = {.iov_base = (void *)msg, .iov_len = strlen(msg)};
    struct msghdr mh = {0};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof ctl.buf;
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    return sendmsg(s, &mh, MSG_NOSIGNAL) == (ssize_t)iov.iov_len ? 0 : -1;
}

/* The agent's answer (NUL-terminated in buf) and the descriptor it carried (-1: none); -1 when
 * none comes: the connection ended, or the page died meanwhile. A restore may take long (it is
 * paced): the wait has no bound of its own but the agent's life; a signal ends the process as
 * the application's handlers say (the default ends it at once). */
static ssize_t recv_answer(int s, struct attachment *att, char *buf, size_t cap, int *fd_out) {
    *fd_out = -1;
    for (;;) {
        struct pollfd pfd = {.fd = s, .events = POLLIN};
        int ready = poll(&pfd, 1, ANSWER_SLICE_MS);
        if (ready < 0 && errno != EINTR)
            return -1;
        if (ready > 0)
            break;
        const char *why = "";
        if (__atomic_load_n(&att->dead, __ATOMIC_ACQUIRE) ||
            !page_alive(att->page, mono_ns(), g_dead_after_ns, &why))
            return -1;
    }
    int nfds = 0, truncated = 0;
    ssize_t n = recv_message(s, buf, cap, fd_out, 1, &nfds, &truncated);
    if (n <= 0 || nfds == 0) {
        if (n <= 0 && nfds > 0)
            real_close(*fd_out);
        *fd_out = -1;
    }
    return n <= 0 ? -1 : n;
}

/* After a paced open that returned fd (its state set): tells the agent. 0: go on; -1: the
 * open must fail with EIO (an evicted file the agent could not bring back). Runs with
 * t_in_lib set by the caller. */
int stage_opened(int fd, int flags) {
    if (fd < 0 || fd >= g_nfds || (flags & (O_DIRECTORY | O_PATH)))
        return 0;
    struct attachment *att = __atomic_load_n(&g_att, __ATOMIC_ACQUIRE);
    if (!att || __atomic_load_n(&att->dead, __ATOMIC_ACQUIRE))
        return 0;
    /* Without a stage-out, only the job's resident bytes need the opens, and only those for
     * writing, and only while the job's space is limited (a capacity at the controller):
     * the others are spared the round trip. */
    if (!(__atomic_load_n(U32(att->page, OFF_FLAGS), __ATOMIC_ACQUIRE) & FLAG_STAGE) &&
        ((flags & O_ACCMODE) == O_RDONLY ||
         __atomic_load_n(I64(att->page, OFF_SPACE_LIMIT), __ATOMIC_ACQUIRE) == SPACE_UNLIMITED))
        return 0;
    int s = agent_conn();
    if (s < 0)
        return 0;
    char msg[64], answer[256];
    snprintf(msg, sizeof msg, "OPEN %d", flags);
    int got = -1;
    ssize_t n = -1;
    if (send_with_fd(s, msg, fd) == 0)
        n = recv_answer(s, att, answer, sizeof answer, &got);
    real_close(s);
    if (n < 0)
        return 0;
    if (strcmp(answer, "OK") == 0) {
        __atomic_fetch_or(&g_fds[fd], (unsigned char)ST_TOLD, __ATOMIC_RELAXED);
        __atomic_fetch_add(&g_told, 1, __ATOMIC_RELAXED);
    } else if (strcmp(answer, "PFS") == 0 && got >= 0) {
        /* The application's number now reads the PFS copy (offset 0, as a new open). */
        int cloexec = real_fcntl(fd, F_GETFD) & FD_CLOEXEC;
        RESOLVE(dup3, NULL);
        if (!real_dup3 || real_dup3(got, fd, cloexec ? O_CLOEXEC : 0) < 0) {
            real_close(got);
            return -1;
        }
    } else if (strncmp(answer, "EIO", 3) == 0) {
        if (got >= 0)
            real_close(got);
        return -1;
    }
    if (got >= 0)
        real_close(got);
    return 0;
}

/* 1 when fd was told (and is no longer): its close is to be told. */
int stage_take_told(int fd) {
    if (fd < 0 || fd >= g_nfds ||
        !(__atomic_fetch_and(&g_fds[fd], (unsigned char)~ST_TOLD, __ATOMIC_RELAXED) & ST_TOLD))
        return 0;
    __atomic_fetch_sub(&g_told, 1, __ATOMIC_RELAXED);
    return 1;
}

/* Tells the agent of the close of a told file, open as fd (no answer awaited). */
void stage_tell_close(int fd) {
    SAVE_ERRNO();
    t_in_lib++;
    int s = agent_conn();
    if (s >= 0) {
        (void)send_with_fd(s, "CLOSE", fd);
        real_close(s);
    }
    t_in_lib--;
    RESTORE_ERRNO();
}

/* Before fd is closed or replaced: a told descriptor's close is told. */
void stage_closing(int fd) {
    if (stage_take_told(fd))
        stage_tell_close(fd);
}

/* The open(2) flags of an fopen mode ("w", "a+", "rb"...): the agent must know a truncation. */
int stage_open_flags(const char *mode) {
    if (!mode)
        return 0;
    int plus = strchr(mode, '+') != NULL;
    switch (mode[0]) {
    case 'w':
        return (plus ? O_RDWR : O_WRONLY) | O_CREAT | O_TRUNC;
    case 'a':
        return (plus ? O_RDWR : O_WRONLY) | O_CREAT | O_APPEND;
    default:
        return plus ? O_RDWR : O_RDONLY;
    }
}

/* A fork's child shares its parent's open files: the opener (the parent) tells their closes,
 * or its end does (the agent releases a process's opens when it ends). */
static void forget_told(void) {
    if (!__atomic_load_n(&g_told, __ATOMIC_RELAXED) || !g_fds)
        return;
    for (int fd = 0; fd < g_nfds; fd++)
        if (g_fds[fd] & ST_TOLD)
            g_fds[fd] &= (unsigned char)~ST_TOLD;
    g_told = 0;
}

__attribute__((constructor)) static void stage_init(void) {
    pthread_atfork(NULL, NULL, forget_told);
}
