/* A test program for the preload library (tests/integration/preload/test_library.py): each mode
 * moves a known number of bytes through one family of intercepted calls. Built by the test
 * with gcc -O2 -D_FILE_OFFSET_BITS=64 (the 64-bit forms, as dd, tar and fio are built).
 * Exit status 0 on success; anything the test checks is printed on stdout. */
#define _GNU_SOURCE
#include <aio.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define K64 65536
static char buf[4 * K64];

static void die(const char *what) {
    perror(what);
    exit(2);
}

static void write_all(int fd, size_t n) {
    while (n > 0) {
        size_t chunk = n < K64 ? n : K64;
        ssize_t r = write(fd, buf, chunk);
        if (r <= 0)
            die("write");
        n -= (size_t)r;
    }
}

static int create(const char *path) {
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0)
        die(path);
    return fd;
}

static void *paced_write(void *arg) {
    write_all(*(int *)arg, K64);
    return NULL;
}

static void *thread_main(void *arg) {
    char *path = arg;
    int fd = create(path);
    write_all(fd, 2 * 1024 * 1024);
    close(fd);
    return NULL;
}

#define MIB (1024 * 1024)
#define GROUP 4
static char slots[GROUP][MIB], expect[MIB];
static int written, done_at_return; /* AIO writes; of them, done when their submission returned */

static void fill(char *p, int block) {
    for (size_t i = 0; i < MIB; i++)
        p[i] = (char)(i * 7 + (size_t)block);
}

/* Waits for an AIO request to end, which must have moved `want` bytes. */
static void aio_done(struct aiocb *cb, ssize_t want) {
    const struct aiocb *one[1] = {cb};
    int e;
    while ((e = aio_error(cb)) == EINPROGRESS)
        aio_suspend(one, 1, NULL);
    if (e != 0 || aio_return(cb) != want) {
        errno = e;
        die("aio");
    }
}

/* Blocks of 1 MiB in groups of GROUP at once: the even groups written with aio_write, the odd
 * ones with one lio_listio(LIO_NOWAIT); then all read back with lio_listio(LIO_WAIT) and
 * checked. The write phase's seconds; `written`, `done_at_return` counted. */
static double aio_mode(const char *path, int mib) {
    int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0644);
    if (fd < 0)
        die(path);
    struct aiocb cbs[GROUP];
    struct aiocb *list[GROUP];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int opcode = LIO_WRITE;; opcode = LIO_READ) {
        for (int b = 0; b < mib; b += GROUP) {
            int n = 0;
            for (; n < GROUP && b + n < mib; n++) {
                if (opcode == LIO_WRITE)
                    fill(slots[n], b + n);
                cbs[n] = (struct aiocb){.aio_fildes = fd,
                                        .aio_buf = slots[n],
                                        .aio_nbytes = MIB,
                                        .aio_offset = (off_t)(b + n) * MIB,
                                        .aio_lio_opcode = opcode};
                list[n] = &cbs[n];
            }
            if (opcode == LIO_READ) {
                if (lio_listio(LIO_WAIT, list, n, NULL) != 0)
                    die("lio_listio wait");
            } else if (b / GROUP % 2) {
                if (lio_listio(LIO_NOWAIT, list, n, NULL) != 0)
                    die("lio_listio nowait");
            } else {
                for (int i = 0; i < n; i++)
                    if (aio_write(list[i]) != 0)
                        die("aio_write");
            }
            for (int i = 0; opcode == LIO_WRITE && i < n; i++, written++)
                done_at_return += aio_error(list[i]) != EINPROGRESS;
            for (int i = 0; i < n; i++) {
                aio_done(list[i], MIB);
                fill(expect, b + i);
                if (opcode == LIO_READ && memcmp(slots[i], expect, MIB) != 0)
                    exit(3);
            }
        }
        if (opcode == LIO_READ)
            break;
        clock_gettime(CLOCK_MONOTONIC, &t1);
    }
    close(fd);
    return (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: probe MODE ARGS...\n");
        return 2;
    }
    const char *mode = argv[1];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (char)(i * 7 + 3);

    if (!strcmp(mode, "openat")) { /* DIR: openat(dirfd of DIR, "rel.bin"): 1 MiB */
        int dfd = open(argv[2], O_RDONLY | O_DIRECTORY);
        if (dfd < 0)
            die("open dir");
        int fd = openat(dfd, "sub/../rel.bin", O_CREAT | O_WRONLY | O_TRUNC, 0644);
        if (fd < 0)
            die("openat");
        write_all(fd, 1024 * 1024);
        close(fd);
        close(dfd);
    } else if (!strcmp(mode, "chdir")) { /* DIR: chdir(DIR), open("./cwd.bin"): 1 MiB */
        if (chdir(argv[2]) != 0)
            die("chdir");
        int fd = create("./cwd.bin");
        write_all(fd, 1024 * 1024);
        close(fd);
    } else if (!strcmp(mode, "dup")) { /* FILE: 6 x 64 KiB through dup copies, then a pipe */
        int fd = create(argv[2]);
        int copies[6] = {fd, dup(fd), dup2(fd, 50), fcntl(fd, F_DUPFD, 60),
                         fcntl(fd, F_DUPFD_CLOEXEC, 70), dup3(fd, 80, O_CLOEXEC)};
        for (int i = 0; i < 6; i++) {
            if (copies[i] < 0)
                die("dup");
            write_all(copies[i], K64);
        }
        for (int i = 0; i < 6; i++)
            close(copies[i]);
        /* The pipe takes the lowest numbers, those of fd and its dup: not paced any more. */
        int p[2];
        if (pipe(p) != 0)
            die("pipe");
        printf("fd=%d dup=%d pipe=%d,%d\n", copies[0], copies[1], p[0], p[1]);
        if (write(p[1], buf, 4096) != 4096 || read(p[0], buf, 4096) != 4096)
            die("pipe io");
    } else if (!strcmp(mode, "closes")) { /* DIR: closedir and close_range forget numbers */
        int dfd = open(argv[2], O_RDONLY | O_DIRECTORY);
        DIR *d = fdopendir(dfd);
        if (dfd < 0 || !d || !readdir(d))
            die("fdopendir");
        closedir(d); /* glibc closes dfd inside */
        int p[2];
        if (pipe(p) != 0 || write(p[1], buf, 4096) != 4096 || read(p[0], buf, 4096) != 4096)
            die("pipe 1");
        close(p[0]);
        close(p[1]);
        char path[4200];
        snprintf(path, sizeof path, "%s/closes.bin", argv[2]);
        int fd = create(path);
        if (close_range((unsigned)fd, (unsigned)fd, 0) != 0) /* closes fd */
            die("close_range");
        int q[2];
        if (pipe(q) != 0 || write(q[1], buf, 4096) != 4096 || read(q[0], buf, 4096) != 4096)
            die("pipe 2");
        printf("dir=%d pipe1=%d file=%d pipe2=%d\n", dfd, p[0], fd, q[0]);
    } else if (!strcmp(mode, "closeall")) { /* DIR: close 3..63 as daemons do, then 6 files */
        char path[4200];
        snprintf(path, sizeof path, "%s/first.bin", argv[2]);
        int fd = create(path); /* attaches: the library's descriptors come after it */
        write_all(fd, 4096);
        for (int i = 3; i < 64; i++)
            close(i);
        for (int i = 0; i < 6; i++) {
            snprintf(path, sizeof path, "%s/f%d.bin", argv[2], i);
            int fds = create(path);
            printf("f%d=%d\n", i, fds);
        }
        for (int i = 0; i < 6; i++)
            write_all(3 + i, K64);
    } else if (!strcmp(mode, "chk")) { /* FILE FLAGS: the fortified forms (_FORTIFY_SOURCE) */
        int flags = atoi(argv[3]); /* not a constant: open becomes __open64_2 */
        int fd = open(argv[2], flags);
        if (fd < 0)
            die("open");
        char local[K64];
        size_t n = sizeof local - (size_t)(argc - 4); /* 64 KiB, unknown to the compiler */
        if (read(fd, local, n) != (ssize_t)n) /* __read_chk: 64 KiB */
            die("read");
        if (pread(fd, local, n, K64) != (ssize_t)n) /* __pread64_chk: 64 KiB */
            die("pread");
        FILE *f = fdopen(fd, "r");
        if (!f || fread(local, 1, n, f) != n) /* __fread_chk: 64 KiB */
            die("fread");
        if (fread_unlocked(local, 1, n, f) != n) /* __fread_unlocked_chk: 64 KiB */
            die("fread_unlocked");
        fclose(f);
    } else if (!strcmp(mode, "cancel")) { /* FILE: a thread cancelled while it waits */
        int fd = create(argv[2]);
        pthread_t t;
        pthread_create(&t, NULL, paced_write, &fd);
        char line[16];
        if (!fgets(line, sizeof line, stdin)) /* the test: "it waits" */
            return 3;
        pthread_cancel(t);
        void *res;
        pthread_join(t, &res);
        printf("%s\n", res == PTHREAD_CANCELED ? "cancelled" : "finished");
        fflush(stdout);
        if (fgets(line, sizeof line, stdin)) /* the test looked at the page: exit */
            return 0;
    } else if (!strcmp(mode, "fork")) { /* FILE: the child writes 256 KiB, then the parent */
        int fd = create(argv[2]);
        pid_t pid = fork();
        if (pid < 0)
            die("fork");
        if (pid == 0) {
            write_all(fd, 4 * K64);
            _exit(0);
        }
        int st;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            return 3;
        write_all(fd, 4 * K64);
        close(fd);
    } else if (!strcmp(mode, "forkexec")) { /* FILE FILE2: 64 KiB here, dd writes 256 KiB */
        int fd = create(argv[2]);
        write_all(fd, K64);
        close(fd);
        pid_t pid = fork();
        if (pid < 0)
            die("fork");
        if (pid == 0) {
            char of[4200];
            snprintf(of, sizeof of, "of=%s", argv[3]);
            execlp("dd", "dd", "if=/dev/zero", of, "bs=64k", "count=4", "status=none",
                   (char *)NULL);
            _exit(127);
        }
        int st;
        waitpid(pid, &st, 0);
        printf("parent=%d child=%d\n", (int)getpid(), (int)pid);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            return 3;
    } else if (!strcmp(mode, "stdio")) { /* FILE BYTES: fwrite, then fread back and compare */
        size_t n = (size_t)strtoull(argv[3], NULL, 10);
        FILE *f = fopen(argv[2], "w");
        if (!f)
            die("fopen w");
        for (size_t done = 0; done < n; done += K64) {
            size_t chunk = n - done < K64 ? n - done : K64;
            if (fwrite(buf + (done % 7), 1, chunk, f) != chunk)
                die("fwrite");
        }
        if (fclose(f) != 0)
            die("fclose");
        f = fopen(argv[2], "r");
        if (!f)
            die("fopen r");
        char in[K64];
        size_t got = 0;
        for (;;) {
            size_t r = fread(in, 1, sizeof in, f);
            if (r == 0)
                break;
            if (memcmp(in, buf + (got % 7), r) != 0)
                return 3;
            got += r;
        }
        fclose(f);
        if (got != n)
            return 4;
    } else if (!strcmp(mode, "errno")) { /* RO_FILE NEW_FILE */
        int fd = open(argv[2], O_RDONLY);
        if (fd < 0)
            die("open ro");
        errno = 0;
        ssize_t r = write(fd, buf, 1);
        printf("write=%zd errno=%d\n", r, errno);
        int w = create(argv[3]);
        errno = EDOM; /* a successful paced call leaves errno alone, waiting or not */
        r = write(w, buf, K64);
        printf("paced=%zd errno=%d\n", r, errno);
    } else if (!strcmp(mode, "many")) { /* DIR COUNT: COUNT files of 4 KiB */
        for (int i = 0; i < atoi(argv[3]); i++) {
            char path[4200];
            snprintf(path, sizeof path, "%s/many.%d", argv[2], i);
            int fd = create(path);
            write_all(fd, 4096);
            close(fd);
        }
    } else if (!strcmp(mode, "loop")) { /* FILE STOPFILE: pwrite 64 KiB at 0 until STOPFILE */
        int fd = create(argv[2]);
        while (access(argv[3], F_OK) != 0)
            if (pwrite(fd, buf, K64, 0) != K64)
                die("pwrite");
        close(fd);
    } else if (!strcmp(mode, "threads")) { /* PREFIX COUNT: COUNT threads, 2 MiB each */
        int n = atoi(argv[3]);
        pthread_t t[16];
        char paths[16][4200];
        for (int i = 0; i < n && i < 16; i++) {
            snprintf(paths[i], sizeof paths[i], "%s.%d", argv[2], i);
            pthread_create(&t[i], NULL, thread_main, paths[i]);
        }
        for (int i = 0; i < n && i < 16; i++)
            pthread_join(t[i], NULL);
    } else if (!strcmp(mode, "aio")) { /* FILE MIB [OTHER]: POSIX AIO, MIB MiB each */
        double write_s = aio_mode(argv[2], atoi(argv[3]));
        printf("write_s=%.3f done_at_return=%d/%d\n", write_s, done_at_return, written);
        if (argc > 4)
            aio_mode(argv[4], atoi(argv[3]));
    } else if (!strcmp(mode, "vec")) { /* FILE COPY: the vector, range and sendfile calls */
        int fd = open(argv[2], O_CREAT | O_RDWR | O_TRUNC, 0644);
        if (fd < 0)
            die("open");
        struct iovec two[2] = {{buf, K64 / 2}, {buf + K64 / 2, K64 / 2}};
        if (writev(fd, two, 2) != K64) /* write 64 KiB */
            die("writev");
        struct iovec one = {buf + K64, K64};
        if (pwritev(fd, &one, 1, K64) != K64) /* write 64 KiB */
            die("pwritev");
        if (pwritev2(fd, &one, 1, 2 * K64, 0) != K64) /* write 64 KiB */
            die("pwritev2");
        if (preadv(fd, &one, 1, 0) != K64) /* read 64 KiB */
            die("preadv");
        if (preadv2(fd, &one, 1, 0, 0) != K64) /* read 64 KiB */
            die("preadv2");
        if (pread(fd, buf + 2 * K64, K64, K64) != K64) /* read 64 KiB */
            die("pread");
        lseek(fd, 0, SEEK_SET);
        if (readv(fd, two, 2) != K64) /* read 64 KiB */
            die("readv");
        int out = create(argv[3]);
        off_t in_off = 0;
        ssize_t c = copy_file_range(fd, &in_off, out, NULL, 2 * K64, 0); /* read+write */
        if (c != 2 * K64)
            die("copy_file_range");
        int null = open("/dev/null", O_WRONLY);
        in_off = 0;
        if (sendfile(null, fd, &in_off, 3 * K64) != 3 * K64) /* read 192 KiB */
            die("sendfile");
        close(null);
        close(out);
        close(fd);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    return 0;
}
