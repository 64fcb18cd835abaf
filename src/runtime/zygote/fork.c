/* _codebox_zygote.so: the Python zygote's fork path, in C (docs/ZYGOTE.md argues it;
 * src/sandbox/zygote/ decides everything it does, as data; zygote.py loads it).
 *
 * zygote.py preloads, freezes its objects, configures this library once
 * (codebox_zygote_configure) and calls codebox_zygote_serve, which never returns in the
 * zygote while the spawner is there: it reads fork requests on the control socket, makes
 * each child and reaps. No Python runs in the zygote between forks, so the zygote writes
 * (and copies, now that its pages are shared with its children) nothing but this loop's
 * few pages. It returns
 *   - in each program process (C3), set up, with CHILD and the request's flags: zygote.py
 *     then runs the program there;
 *   - in the zygote, 0 when the spawner closed the socket, -1 on an error (errno).
 *
 * One child, three processes (the same shape as a cold sandbox: pid 1 an init, pid 2 the
 * program):
 *   C1  clone(CLONE_VM | CLONE_VFORK) on a stack of its own: it shares the zygote's memory
 *       while the zygote is suspended in clone(2) and runs only this file's code. It joins
 *       the child's cgroups, unshares user, mount, pid, net, ipc, uts and cgroup
 *       namespaces, maps the sandbox uid and gid onto themselves, makes C2, sends C2's
 *       pidfd to the spawner and exits, which resumes the zygote.
 *   C2  clone(CLONE_VM | CLONE_VFORK) again: pid 1 of the new pid namespace, still on the
 *       zygote's memory (C1 suspended). It mounts a fresh procfs and tmpfs, sets the
 *       hostname, forks C3, then execs codebox-zinit (init.c), which resumes C1: pid 1 then
 *       holds no copy of the zygote's memory at all.
 *   C3  fork(2) of C2: the only copy of the zygote's memory a child gets. pid 2: new
 *       session, stdio and fd 3, every other descriptor closed, rlimits, every capability
 *       dropped, no_new_privs, parent-death signal, landlock, seccomp; then it jumps back
 *       to where the zygote called clone(2) (its copy of the zygote's stack holds that
 *       frame) and returns to Python as the program.
 * A failure in C1, C2 or C3 writes a record of src/sandbox/report.rs on the errors pipe
 * and ends that process.
 *
 * In C1 and C2 (memory shared with a suspended zygote) only system calls run: no
 * allocation, no stdio, nothing that keeps state; C2's fork(2) runs the registered
 * fork handlers as an os.fork() in the zygote would. Every signal is blocked from the
 * loop's start; C3 returns with them blocked and zygote.py restores the mask once its own
 * handlers are reset.
 */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* src/sandbox/report.rs `Stage`, numbered from 1 in this order (a unit test there reads
 * this list). */
enum stage {
    ArrangeFds = 1,
    ParentDeathSignal,
    WaitForParent,
    ClearGroups,
    SetGid,
    SetUid,
    RaiseCaps,
    NotDumpable,
    Mount,
    Hostname,
    InitStdio,
    ForkProgram,
    Setsid,
    ProgramStdio,
    CloseFds,
    Rlimit,
    DropCaps,
    NoNewPrivs,
    Chdir,
    Exec,
    Landlock,
    Seccomp,
    CgroupNamespace,
    JoinCgroup,
    LoopbackUp,
    EgressListener,
    ZygoteNamespaces,
    ZygoteFork,
};

/* Landlock's structures as the kernel takes them (src/sandbox/landlock.rs plans the
 * values; the build host's headers may predate the fields). */
struct ll_ruleset_attr {
    uint64_t handled_access_fs, handled_access_net, scoped;
};
struct ll_path_beneath {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));
struct ll_net_port {
    uint64_t allowed_access, port;
};
#define LL_RULE_PATH_BENEATH 1
#define LL_RULE_NET_PORT 2
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1u << 2)
#endif

#define FAILURE_LEN 12
#define INFO_LANDLOCK 0x100

/* A fork request (src/sandbox/zygote/plan.rs `ForkRequest::to_bytes`), little-endian:
 * magic, version, flags, joins, nofile, fsize, mount count, then per mount kind, flags,
 * target length, data length, target, data. */
#define REQUEST_MAGIC 0x5a425a43u /* "CZBZ" */
#define REQUEST_VERSION 1u
#define MAX_REQUEST (64 * 1024)
#define MAX_MOUNTS 16
#define MAX_JOINS 16
/* stdout, stderr, channel, errors, status, control, reply; then the joins. */
#define FIXED_FDS 7
#define MOUNT_PROC 1u
#define MOUNT_TMPFS 2u

/* What serve returns in a program process: CHILD | request flags << 8. */
#define CHILD 1L

#define NAMESPACES                                                                         \
    (CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC |            \
     CLONE_NEWUTS | CLONE_NEWCGROUP)

#define STACK_SIZE (256 * 1024)

struct mount_req {
    uint32_t kind;
    unsigned long flags;
    char target[4096];
    char data[256];
};

struct request {
    uint32_t flags;
    uint32_t joins;
    uint64_t nofile, fsize;
    uint32_t nmounts;
    struct mount_req mounts[MAX_MOUNTS];
};

struct ll_path {
    char *path;
    uint64_t access;
};
struct ll_port {
    uint64_t port;
    uint64_t access;
};

/* The configuration, from codebox_zygote_configure (a copy: Python's buffers may go). */
static struct {
    int configured;
    struct sock_fprog seccomp; /* .len 0: none */
    int landlock;              /* 0: not enforced */
    struct ll_ruleset_attr ll_attr;
    uint32_t ll_attr_size, ll_status;
    struct ll_path *ll_paths;
    uint32_t ll_npaths;
    struct ll_port *ll_ports;
    uint32_t ll_nports;
    char hostname[65];
    uint32_t id;
    uint32_t cap_last;
    char init_path[4096];
    int trace_fd;
} cfg;

/* One fork in progress: read by C1, C2 and C3 (shared memory for C1 and C2). */
static struct {
    struct request req;
    int fds[FIXED_FDS + MAX_JOINS];
    int nfds;
    pid_t c2;
} job;

static jmp_buf back_to_python;
static char *stack1_top, *stack2_top;

/* --- small helpers, safe in a process sharing the zygote's memory ------------------- */

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        p += n;
        len -= (size_t)n;
    }
}

static void record(int errors_fd, enum stage stage, uint32_t detail, int err)
{
    unsigned char rec[FAILURE_LEN];
    put_u32(rec, (uint32_t)stage);
    put_u32(rec + 4, detail);
    put_u32(rec + 8, (uint32_t)(err ? err : EIO));
    write_all(errors_fd, rec, sizeof rec);
}

static __attribute__((noreturn)) void fail(int errors_fd, enum stage stage, uint32_t detail,
                                            int err)
{
    record(errors_fd, stage, detail, err);
    _exit(127);
}

/* "zygote trace <pid> <step> <ms>\n" on the trace descriptor, without stdio. */
static void trace(const char *step)
{
    if (cfg.trace_fd < 0)
        return;
    char line[160];
    size_t n = 0;
    const char *head = "zygote trace ";
    while (*head)
        line[n++] = *head++;
    char digits[24];
    int d = 0;
    long pid = syscall(SYS_getpid);
    do {
        digits[d++] = (char)('0' + pid % 10);
        pid /= 10;
    } while (pid > 0);
    while (d > 0)
        line[n++] = digits[--d];
    line[n++] = ' ';
    while (*step && n < 100)
        line[n++] = *step++;
    line[n++] = ' ';
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    unsigned long us = (unsigned long)t.tv_sec * 1000000ul + (unsigned long)t.tv_nsec / 1000;
    unsigned long ms = us / 1000, frac = us % 1000;
    do {
        digits[d++] = (char)('0' + ms % 10);
        ms /= 10;
    } while (ms > 0);
    while (d > 0)
        line[n++] = digits[--d];
    line[n++] = '.';
    line[n++] = (char)('0' + frac / 100);
    line[n++] = (char)('0' + frac / 10 % 10);
    line[n++] = (char)('0' + frac % 10);
    line[n++] = '\n';
    write_all(cfg.trace_fd, line, n);
}

static int write_file(const char *path, const char *data)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t want = (ssize_t)strlen(data);
    ssize_t n = write(fd, data, (size_t)want);
    int err = errno;
    close(fd);
    if (n != want) {
        errno = n < 0 ? err : EIO;
        return -1;
    }
    return 0;
}

/* "<id> <id> 1" */
static void id_map_line(char *out, uint32_t id)
{
    char digits[12];
    int d = 0;
    do {
        digits[d++] = (char)('0' + id % 10);
        id /= 10;
    } while (id > 0);
    size_t n = 0;
    for (int k = 0; k < 2; k++) {
        for (int i = d - 1; i >= 0; i--)
            out[n++] = digits[i];
        out[n++] = ' ';
    }
    out[n++] = '1';
    out[n] = '\0';
}

/* --- C3: the program process ------------------------------------------------------------ */

static int landlock(int errors)
{
    int ruleset = (int)syscall(SYS_landlock_create_ruleset, &cfg.ll_attr,
                               (size_t)cfg.ll_attr_size, 0);
    if (ruleset < 0)
        fail(errors, Landlock, 0, errno);
    for (uint32_t i = 0; i < cfg.ll_npaths; i++) {
        int fd = open(cfg.ll_paths[i].path, O_PATH | O_CLOEXEC);
        if (fd < 0) {
            if (errno == ENOENT)
                continue; /* as the Rust ruleset does: a missing path has no rule */
            fail(errors, Landlock, 10 + i, errno);
        }
        struct ll_path_beneath rule = {
            .allowed_access = cfg.ll_paths[i].access,
            .parent_fd = fd,
        };
        long r = syscall(SYS_landlock_add_rule, ruleset, LL_RULE_PATH_BENEATH, &rule, 0);
        int err = errno;
        close(fd);
        if (r < 0)
            fail(errors, Landlock, 10 + i, err);
    }
    for (uint32_t i = 0; i < cfg.ll_nports; i++) {
        struct ll_net_port rule = {
            .allowed_access = cfg.ll_ports[i].access,
            .port = cfg.ll_ports[i].port,
        };
        if (syscall(SYS_landlock_add_rule, ruleset, LL_RULE_NET_PORT, &rule, 0) < 0)
            fail(errors, Landlock, 100 + i, errno);
    }
    if (syscall(SYS_landlock_restrict_self, ruleset, 0) < 0)
        fail(errors, Landlock, 1, errno);
    close(ruleset);
    return 0;
}

/* Sets up the program process; on success jumps back into the zygote's frame (never
 * returns). */
static __attribute__((noreturn)) void c3(void)
{
    struct request *r = &job.req;
    int stdout_fd = job.fds[0], stderr_fd = job.fds[1], channel = job.fds[2];
    int errors = job.fds[3];
    /* 1. No controlling terminal, own process group. */
    if (setsid() < 0)
        fail(errors, Setsid, 0, errno);
    trace("c3 start");
    /* 2. stdout, stderr and the channel on 1, 2 and 3; the errors pipe on 4 (closed on
     *    exec) until ready. Each is first moved above every target so none is
     *    overwritten before it is placed. */
    int src[4] = {stdout_fd, stderr_fd, channel, errors};
    for (int i = 0; i < 4; i++) {
        int moved = fcntl(src[i], F_DUPFD_CLOEXEC, 16);
        if (moved < 0)
            fail(errors, ProgramStdio, (uint32_t)i, errno);
        src[i] = moved;
        if (i == 3)
            errors = moved;
    }
    for (int i = 0; i < 4; i++) {
        if (dup3(src[i], i + 1, i == 3 ? O_CLOEXEC : 0) < 0)
            fail(errors, ProgramStdio, 10 + (uint32_t)i, errno);
    }
    errors = 4;
    /* 3. Nothing else stays open (the zygote's socket, the trace descriptor, ...). */
    if (syscall(SYS_close_range, 5, ~0u, 0) < 0)
        fail(errors, CloseFds, 0, errno);
    cfg.trace_fd = -1;
    /* 4. Resource limits. */
    struct rlimit zero = {0, 0};
    struct rlimit nofile = {r->nofile, r->nofile};
    struct rlimit fsize = {r->fsize, r->fsize};
    if (setrlimit(RLIMIT_CORE, &zero) < 0)
        fail(errors, Rlimit, 0, errno);
    if (setrlimit(RLIMIT_NOFILE, &nofile) < 0)
        fail(errors, Rlimit, 1, errno);
    if (setrlimit(RLIMIT_FSIZE, &fsize) < 0)
        fail(errors, Rlimit, 2, errno);
    /* 5. Every capability: bounding set, ambient, then inheritable, effective, permitted. */
    for (uint32_t cap = 0; cap <= cfg.cap_last; cap++) {
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0)
            fail(errors, DropCaps, 0, errno);
    }
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0)
        fail(errors, DropCaps, 1, errno);
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    if (syscall(SYS_capset, &header, data) < 0)
        fail(errors, DropCaps, 4, errno);
    /* 6. Nothing it runs can gain privileges (inherited from the zygote; said again). */
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        fail(errors, NoNewPrivs, 0, errno);
    /* 7. Die with pid 1 (any other parent means it is gone already). */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
        fail(errors, ParentDeathSignal, 1, errno);
    if (getppid() != 1)
        fail(errors, ParentDeathSignal, 2, ESRCH);
    /* 8. The program's /proc/self is its own (its memory is its own copy now). */
    if (prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) < 0)
        fail(errors, NotDumpable, 2, errno);
    /* 9. Landlock, as the supervisor planned it for this kernel; its status reported. */
    if (cfg.landlock) {
        landlock(errors);
        unsigned char info[FAILURE_LEN] = {0};
        put_u32(info, INFO_LANDLOCK);
        put_u32(info + 4, cfg.ll_status);
        write_all(errors, info, sizeof info);
    }
    /* 10. Working directory. */
    if (chdir("/workspace") < 0)
        fail(errors, Chdir, 0, errno);
    /* 11. Seccomp, last. */
    if (cfg.seccomp.len > 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &cfg.seccomp, 0, 0) < 0)
        fail(errors, Seccomp, 0, errno);
    /* Back to where the zygote called clone(2), in this process's own copy. */
    longjmp(back_to_python, 1);
}

/* --- C2: pid 1, until it execs codebox-zinit ------------------------------------------- */

static int c2(void *unused)
{
    (void)unused;
    struct request *r = &job.req;
    int errors = job.fds[3], status = job.fds[4], control = job.fds[5];
    /* 1. Fresh filesystems where the program may write, and a procfs of this pid
     *    namespace; everything else is the zygote's read-only view, locked by the kernel
     *    (copied into a less privileged mount namespace). */
    for (uint32_t i = 0; i < r->nmounts; i++) {
        struct mount_req *m = &r->mounts[i];
        int rc = m->kind == MOUNT_PROC
                     ? mount("proc", m->target, "proc", m->flags, NULL)
                     : mount("tmpfs", m->target, "tmpfs", m->flags, m->data);
        if (rc < 0)
            fail(errors, Mount, i, errno);
    }
    trace("c2 mounted");
    /* 2. The hostname of the child's own UTS namespace. */
    if (sethostname(cfg.hostname, strlen(cfg.hostname)) < 0)
        fail(errors, Hostname, 1, errno);
    /* 3. The program, pid 2. */
    pid_t program = fork();
    if (program < 0)
        fail(errors, ForkProgram, 4, errno);
    if (program == 0)
        c3();
    trace("c2 forked");
    /* 4. pid 1 becomes codebox-zinit: /dev/null on 0-2, the control pipe on 3 and the
     *    status pipe on 4; the errors pipe stays (close-on-exec) for a failure of exec. */
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0)
        fail(errors, InitStdio, 1, errno);
    int moved[3] = {null, control, status};
    for (int i = 0; i < 3; i++) {
        moved[i] = fcntl(moved[i], F_DUPFD_CLOEXEC, 16);
        if (moved[i] < 0)
            fail(errors, InitStdio, 2, errno);
    }
    int err_moved = fcntl(errors, F_DUPFD_CLOEXEC, 16);
    if (err_moved < 0)
        fail(errors, InitStdio, 2, errno);
    errors = err_moved;
    int targets[5][2] = {
        {moved[0], 0}, {moved[0], 1}, {moved[0], 2}, {moved[1], 3}, {moved[2], 4}};
    for (int i = 0; i < 5; i++) {
        if (dup2(targets[i][0], targets[i][1]) < 0)
            fail(errors, InitStdio, 3, errno);
    }
    if (syscall(SYS_close_range, 5, ~0u, CLOSE_RANGE_CLOEXEC) < 0)
        fail(errors, CloseFds, 1, errno);
    char *argv[] = {"codebox-zinit", NULL};
    char *envp[] = {NULL};
    execve(cfg.init_path, argv, envp);
    fail(errors, Exec, 10, errno);
}

/* --- C1: namespaces --------------------------------------------------------------------- */

static int c1(void *unused)
{
    (void)unused;
    int errors = job.fds[3], reply = job.fds[6];
    trace("c1 start");
    /* 0. Into the execution's cgroups before anything else: this thread moves itself,
     *    writing 0 to each `tasks` file the spawner opened (checked with its rights). */
    for (uint32_t i = 0; i < job.req.joins; i++) {
        int fd = job.fds[FIXED_FDS + i];
        if (write(fd, "0", 1) != 1)
            fail(errors, JoinCgroup, i, errno);
    }
    trace("c1 joined");
    /* 1. Fresh namespaces, under a user namespace of this child's own. */
    if (unshare(NAMESPACES) < 0)
        fail(errors, ZygoteNamespaces, 0, errno);
    trace("c1 unshared");
    /* 2. Map the sandbox uid and gid onto themselves (one id each: the only mapping an
     *    unprivileged process may write for itself; setgroups denied first). The zygote
     *    is non-dumpable, which makes the files of /proc/self root's; this process must own its maps
     *    to write them. The flag belongs to the memory this process shares with the
     *    suspended zygote: it is set back before anything else. */
    if (prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) < 0)
        fail(errors, NotDumpable, 3, errno);
    char map[32];
    id_map_line(map, cfg.id);
    int bad = write_file("/proc/self/setgroups", "deny") < 0 ||
              write_file("/proc/self/uid_map", map) < 0 ||
              write_file("/proc/self/gid_map", map) < 0;
    int err = errno;
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
        fail(errors, NotDumpable, 4, errno);
    if (bad)
        fail(errors, SetUid, 1, err);
    /* 3. C2, pid 1 of the new pid namespace; this process waits until it has exec'd. */
    pid_t pid = clone(c2, stack2_top, CLONE_VM | CLONE_VFORK | SIGCHLD, NULL);
    if (pid < 0)
        fail(errors, ForkProgram, 1, errno);
    trace("c1 forked");
    /* 4. Its pidfd to the spawner (its watch); the zygote, a subreaper, reaps it. */
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0)
        fail(errors, ForkProgram, 3, errno);
    char tag = 'P';
    struct iovec iov = {&tag, 1};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr msg = {
        .msg_iov = &iov,
        .msg_iovlen = 1,
        .msg_control = control.buf,
        .msg_controllen = sizeof control.buf,
    };
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &pidfd, sizeof(int));
    if (sendmsg(reply, &msg, MSG_NOSIGNAL) < 0)
        fail(errors, ForkProgram, 3, errno);
    _exit(0);
}

/* --- the zygote ------------------------------------------------------------------------ */

static int get_u32(const unsigned char **p, const unsigned char *end, uint32_t *out)
{
    if (end - *p < 4)
        return -1;
    *out = 0;
    for (int i = 3; i >= 0; i--)
        *out = *out << 8 | (*p)[i];
    *p += 4;
    return 0;
}

static int get_u64(const unsigned char **p, const unsigned char *end, uint64_t *out)
{
    uint32_t lo, hi;
    if (get_u32(p, end, &lo) < 0 || get_u32(p, end, &hi) < 0)
        return -1;
    *out = (uint64_t)hi << 32 | lo;
    return 0;
}

/* Reads a request into job.req; -1 when it is not what the spawner sends. */
static int parse(const unsigned char *p, size_t len, int nfds)
{
    const unsigned char *end = p + len;
    struct request *r = &job.req;
    uint32_t magic, version, nmounts;
    if (get_u32(&p, end, &magic) < 0 || magic != REQUEST_MAGIC ||
        get_u32(&p, end, &version) < 0 || version != REQUEST_VERSION ||
        get_u32(&p, end, &r->flags) < 0 || get_u32(&p, end, &r->joins) < 0 ||
        r->joins > MAX_JOINS || (int)r->joins + FIXED_FDS != nfds ||
        get_u64(&p, end, &r->nofile) < 0 || get_u64(&p, end, &r->fsize) < 0 ||
        get_u32(&p, end, &nmounts) < 0 || nmounts > MAX_MOUNTS)
        return -1;
    r->nmounts = nmounts;
    for (uint32_t i = 0; i < nmounts; i++) {
        struct mount_req *m = &r->mounts[i];
        uint64_t flags;
        uint32_t tlen, dlen;
        if (get_u32(&p, end, &m->kind) < 0 || (m->kind != MOUNT_PROC && m->kind != MOUNT_TMPFS) ||
            get_u64(&p, end, &flags) < 0 || get_u32(&p, end, &tlen) < 0 ||
            get_u32(&p, end, &dlen) < 0 || tlen == 0 || tlen >= sizeof m->target ||
            dlen >= sizeof m->data || (size_t)(end - p) < (size_t)tlen + dlen)
            return -1;
        m->flags = (unsigned long)flags;
        memcpy(m->target, p, tlen);
        m->target[tlen] = '\0';
        p += tlen;
        memcpy(m->data, p, dlen);
        m->data[dlen] = '\0';
        p += dlen;
        if (m->target[0] != '/' || strlen(m->target) != tlen || strlen(m->data) != dlen)
            return -1;
    }
    return p == end ? 0 : -1;
}

/* The parser alone, for tests (tests/zygote.rs feeds it truncated and hostile requests
 * from a buffer that ends at an unreadable page): 0 when the loop would take the `len`
 * bytes at `p` with `nfds` descriptors, -1 when it would refuse them. Writes job.req
 * only, which the next request overwrites. */
int codebox_zygote_check_request(const unsigned char *p, size_t len, int nfds)
{
    return parse(p, len, nfds);
}

/* Makes one child (see the top of this file). Returns CHILD | flags << 8 in the program
 * process, 0 in the zygote. */
static long fork_one(void)
{
    int errors = job.fds[3];
    if (setjmp(back_to_python) != 0)
        return CHILD | (long)job.req.flags << 8;
    trace("request");
    pid_t pid = clone(c1, stack1_top, CLONE_VM | CLONE_VFORK | SIGCHLD, NULL);
    if (pid < 0)
        record(errors, ZygoteFork, 0, errno);
    trace("forked");
    return 0;
}

static void reap_all(void)
{
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

static char *new_stack(void)
{
    /* A guard page below each stack. */
    char *base = mmap(NULL, STACK_SIZE + 4096, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (base == MAP_FAILED)
        return NULL;
    if (mprotect(base, 4096, PROT_NONE) < 0)
        return NULL;
    return base + STACK_SIZE + 4096;
}

/* Copies the configuration (called once, before the first fork). */
int codebox_zygote_configure(const unsigned char *seccomp, uint32_t seccomp_len, int landlock,
                             uint64_t handled_fs, uint64_t handled_net, uint64_t scoped,
                             uint32_t attr_size, uint32_t status, uint32_t npaths,
                             const char *const *paths, const uint64_t *path_access,
                             uint32_t nports, const uint64_t *ports, const uint64_t *port_access,
                             const char *hostname, uint32_t id, uint32_t cap_last,
                             const char *init_path, int trace_fd)
{
    if (cfg.configured || seccomp_len % sizeof(struct sock_filter) != 0 ||
        seccomp_len / sizeof(struct sock_filter) > BPF_MAXINSNS || strlen(hostname) > 64 ||
        strlen(init_path) >= sizeof cfg.init_path || attr_size > sizeof cfg.ll_attr) {
        errno = EINVAL;
        return -1;
    }
    if (seccomp_len > 0) {
        struct sock_filter *copy = malloc(seccomp_len);
        if (!copy)
            return -1;
        memcpy(copy, seccomp, seccomp_len);
        cfg.seccomp.filter = copy;
        cfg.seccomp.len = (unsigned short)(seccomp_len / sizeof(struct sock_filter));
    }
    cfg.landlock = landlock;
    if (landlock) {
        cfg.ll_attr.handled_access_fs = handled_fs;
        cfg.ll_attr.handled_access_net = handled_net;
        cfg.ll_attr.scoped = scoped;
        cfg.ll_attr_size = attr_size;
        cfg.ll_status = status;
        cfg.ll_paths = calloc(npaths ? npaths : 1, sizeof *cfg.ll_paths);
        cfg.ll_ports = calloc(nports ? nports : 1, sizeof *cfg.ll_ports);
        if (!cfg.ll_paths || !cfg.ll_ports)
            return -1;
        for (uint32_t i = 0; i < npaths; i++) {
            cfg.ll_paths[i].path = strdup(paths[i]);
            if (!cfg.ll_paths[i].path)
                return -1;
            cfg.ll_paths[i].access = path_access[i];
        }
        for (uint32_t i = 0; i < nports; i++) {
            cfg.ll_ports[i].port = ports[i];
            cfg.ll_ports[i].access = port_access[i];
        }
        cfg.ll_npaths = npaths;
        cfg.ll_nports = nports;
    }
    strcpy(cfg.hostname, hostname);
    strcpy(cfg.init_path, init_path);
    cfg.id = id;
    cfg.cap_last = cap_last;
    cfg.trace_fd = trace_fd;
    stack1_top = new_stack();
    stack2_top = new_stack();
    if (!stack1_top || !stack2_top)
        return -1;
    cfg.configured = 1;
    return 0;
}

/* The loop (see the top of this file). */
long codebox_zygote_serve(int control)
{
    if (!cfg.configured) {
        errno = EINVAL;
        return -1;
    }
    sigset_t all, chld, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    int sfd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sfd < 0)
        goto out;
    static unsigned char buf[MAX_REQUEST];
    for (;;) {
        reap_all();
        struct pollfd pfd[2] = {{control, POLLIN, 0}, {sfd, POLLIN, 0}};
        if (poll(pfd, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            goto out;
        }
        if (pfd[1].revents) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) > 0) {
            }
        }
        if (!pfd[0].revents)
            continue;
        if (!(pfd[0].revents & POLLIN)) {
            errno = 0;
            break; /* hung up: the spawner is gone */
        }
        union {
            char buf[CMSG_SPACE(sizeof(int) * (FIXED_FDS + MAX_JOINS + 8))];
            struct cmsghdr align;
        } cbuf;
        struct iovec iov = {buf, sizeof buf};
        struct msghdr msg = {
            .msg_iov = &iov,
            .msg_iovlen = 1,
            .msg_control = cbuf.buf,
            .msg_controllen = sizeof cbuf.buf,
        };
        ssize_t n = recvmsg(control, &msg, MSG_CMSG_CLOEXEC);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            goto out;
        }
        if (n == 0) {
            errno = 0;
            break;
        }
        job.nfds = 0;
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
            if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
                continue;
            size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < count; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
                if (job.nfds < FIXED_FDS + MAX_JOINS)
                    job.fds[job.nfds++] = fd;
                else
                    close(fd);
            }
        }
        int ok = !(msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) &&
                 parse(buf, (size_t)n, job.nfds) == 0;
        if (ok) {
            long r = fork_one();
            if (r != 0)
                return r; /* the program process, set up (its descriptors are 0-4 only:
                           * this loop's, closed there, may be reused by those) */
            /* C1 made the memory it shares with this process dumpable for its id maps and
             * set it back, unless it failed in between: whatever happened there, the
             * zygote stays non-dumpable or stops. */
            if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
                goto out;
        } else if (job.nfds > 3) {
            /* Not what the spawner sends: refused on its errors pipe. */
            record(job.fds[3], ZygoteFork, 2, EINVAL);
        }
        for (int i = 0; i < job.nfds; i++)
            close(job.fds[i]);
        job.nfds = 0;
    }
    close(sfd);
    sigprocmask(SIG_SETMASK, &old, NULL);
    return 0;
out:
    {
        int err = errno;
        if (sfd >= 0)
            close(sfd);
        sigprocmask(SIG_SETMASK, &old, NULL);
        errno = err;
    }
    return -1;
}
