/*
 * POSIX AIO: aio_read, aio_write, lio_listio and their 64 forms. glibc's helper threads move
 * the bytes with its internal pread/pwrite, which no preloaded library sees, so a request on
 * a paced descriptor is paced at its submission instead, in the caller's thread, before glibc
 * queues it: the same `pace` as a read or write of its aio_nbytes (counted, its tokens drawn
 * and waited for, a write's space claimed; io.c). A list is paced as one read of its read
 * entries' bytes and one write of its write entries', on paced descriptors.
 *
 * It is settled once submitted, as if every byte it was given moved (the submitter does not
 * see the completion; the application may reuse or free its aiocb as soon as aio_error says
 * done). Where the submitter knows the outcome it settles on it: a list of mode LIO_WAIT or
 * one that failed, whose entries the caller's call still owns; and a write counted in flight
 * for the agent's stage-out (enter_write), which the submitter waits for (aio_suspend) before
 * it returns, so that the agent's hold on the job's writes never misses one (page.c).
 *
 * aio_error, aio_return, aio_suspend, aio_cancel and aio_fsync are not interposed: they move
 * nothing. What this means for the application: docs/preload.md, "POSIX AIO".
 */
#include "preload.h"

/* The 64 forms are the same calls on the same layout on every 64-bit ABI (glibc aliases
 * them there), so one body serves both. */
_Static_assert(sizeof(struct aiocb) == sizeof(struct aiocb64) &&
                   sizeof(off_t) == sizeof(off64_t),
               "struct aiocb64 is struct aiocb");

static ssize_t as_ssize(size_t n) {
    return n > SSIZE_MAX ? SSIZE_MAX : (ssize_t)n;
}

/* What an entry moves on a paced descriptor: 1 with its kind and bytes (a read bounded by
 * what the file holds past its offset, as `pace` bounds a read), 0 when it is not paced. */
static int paced_entry(const struct aiocb *cb, int opcode, int *kind, size_t *n) {
    if (opcode != LIO_READ && opcode != LIO_WRITE)
        return 0;
    if (fd_state(cb->aio_fildes) != ST_PACED)
        return 0;
    *kind = opcode == LIO_READ ? KIND_READ : KIND_WRITE;
    *n = cb->aio_nbytes;
    if (*kind == KIND_READ) {
        SAVE_ERRNO();
        t_in_lib++;
        *n = clamp_read(cb->aio_fildes, *n, cb->aio_offset);
        t_in_lib--;
        RESTORE_ERRNO();
    }
    return 1;
}

/* The bytes a submitted entry moved: its result once done (glibc's aio_return only reads
 * it), what it was given while in progress, 0 when it failed or was never queued. `wait`:
 * first waits until it is done (a signal cuts aio_suspend short: look again). */
static ssize_t outcome(struct aiocb *cb, size_t n, int wait) {
    const struct aiocb *one[1] = {cb};
    int e;
    while ((e = aio_error(cb)) == EINPROGRESS && wait)
        aio_suspend(one, 1, NULL);
    if (e == EINPROGRESS)
        return as_ssize(n);
    return e == 0 ? aio_return(cb) : 0;
}

static int submit_one(struct aiocb *cb, int opcode, int (*submit)(struct aiocb *)) {
    int kind;
    size_t n;
    if (t_in_lib || LIKELY(!paced_entry(cb, opcode, &kind, &n)))
        return submit(cb);
    struct paced p = pace(kind, n, -1, -1);
    int r = submit(cb);
    if (p.att) {
        SAVE_ERRNO();
        ssize_t moved = r != 0 ? -1 : p.writing ? outcome(cb, n, 1) : as_ssize(n);
        settle(p, kind, moved);
        RESTORE_ERRNO();
    }
    return r;
}

static int submit_list(int mode, struct aiocb *const list[], int nent, struct sigevent *sig,
                       int (*submit)(int, struct aiocb *const[], int, struct sigevent *)) {
    if (t_in_lib)
        return submit(mode, list, nent, sig);
    size_t want[2] = {0, 0};
    int any = 0, kind;
    size_t n;
    for (int i = 0; i < nent; i++)
        if (list[i] && paced_entry(list[i], list[i]->aio_lio_opcode, &kind, &n)) {
            want[kind] = want[kind] + n < want[kind] ? SIZE_MAX : want[kind] + n;
            any = 1;
        }
    if (LIKELY(!any))
        return submit(mode, list, nent, sig);
    struct paced p[2] = {{NULL, 0, 0, 0}, {NULL, 0, 0, 0}};
    for (kind = KIND_READ; kind <= KIND_WRITE; kind++)
        if (want[kind] > 0)
            p[kind] = pace(kind, want[kind], -1, -1);
    int r = submit(mode, list, nent, sig);
    SAVE_ERRNO();
    /* What the entries given moved where this call learns it: a LIO_WAIT list's or a failed
     * one's (the call still owns them), the writes it waits for while the agent stages out;
     * else what they were given (queued, their outcome is the application's to see). */
    ssize_t moved[2] = {as_ssize(want[KIND_READ]), as_ssize(want[KIND_WRITE])};
    if (mode == LIO_WAIT || r != 0 || p[KIND_WRITE].writing) {
        moved[KIND_READ] = moved[KIND_WRITE] = 0;
        for (int i = 0; i < nent; i++) {
            if (!list[i] || !paced_entry(list[i], list[i]->aio_lio_opcode, &kind, &n))
                continue;
            ssize_t m = outcome(list[i], n, kind == KIND_WRITE && p[kind].writing);
            moved[kind] = m > SSIZE_MAX - moved[kind] ? SSIZE_MAX : moved[kind] + m;
        }
    }
    for (kind = KIND_READ; kind <= KIND_WRITE; kind++)
        settle(p[kind], kind, moved[kind]);
    RESTORE_ERRNO();
    return r;
}

EXPORT int aio_read(struct aiocb *cb) {
    NEED(aio_read, NULL, -1);
    return submit_one(cb, LIO_READ, real_aio_read);
}

EXPORT int aio_write(struct aiocb *cb) {
    NEED(aio_write, NULL, -1);
    return submit_one(cb, LIO_WRITE, real_aio_write);
}

EXPORT int aio_read64(struct aiocb64 *cb) {
    NEED(aio_read64, "aio_read", -1);
    return submit_one((struct aiocb *)cb, LIO_READ, (int (*)(struct aiocb *))real_aio_read64);
}

EXPORT int aio_write64(struct aiocb64 *cb) {
    NEED(aio_write64, "aio_write", -1);
    return submit_one((struct aiocb *)cb, LIO_WRITE, (int (*)(struct aiocb *))real_aio_write64);
}

EXPORT int lio_listio(int mode, struct aiocb *const list[], int nent, struct sigevent *sig) {
    NEED(lio_listio, NULL, -1);
    return submit_list(mode, list, nent, sig, real_lio_listio);
}

EXPORT int lio_listio64(int mode, struct aiocb64 *const list[], int nent, struct sigevent *sig) {
    NEED(lio_listio64, "lio_listio", -1);
    return submit_list(mode, (struct aiocb *const *)list, nent, sig,
                       (int (*)(int, struct aiocb *const[], int, struct sigevent *))
                           real_lio_listio64);
}
