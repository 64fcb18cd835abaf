/* codebox-zinit: pid 1 of a sandbox forked from the Python zygote (docs/ZYGOTE.md).
 *
 * The zygote's child C2 execs this program right after it forked the program (pid 2), so
 * pid 1 holds no copy of the zygote's memory: it is this file, a few pages, and nothing
 * else. It does what a cold sandbox's init does once the program runs
 * (src/sandbox/lifeline.rs, src/sandbox/init.rs):
 *   - reaps every process of the namespace (orphans are re-parented to it);
 *   - ends the program at its deadline: fd 3 is the control pipe, on which the spawner
 *     writes "you have T ms from now" as 8-byte little-endian numbers (the last whole one
 *     counts); without one, an hour;
 *   - reports the program's status on fd 4 (8 bytes: kind 1 = exited with a code, 2 =
 *     killed by a signal; then the code or signal, little-endian), then exits, which ends
 *     the pid namespace and everything left in it.
 *
 * Freestanding: no C library (no start-up code, which on this kind of host costs a CPUID
 * storm), raw system calls only. Built by `cargo xtask rootfs` (rootfs/recipe.toml,
 * [[native]]) with -nostdlib -static.
 */

typedef long i64;
typedef unsigned long u64;
typedef int i32;
typedef unsigned int u32;

#define SYS_read 0
#define SYS_write 1
#define SYS_close 3
#define SYS_rt_sigprocmask 14
#define SYS_kill 62
#define SYS_wait4 61
#define SYS_prctl 157
#define SYS_clock_gettime 228
#define SYS_exit_group 231
#define SYS_ppoll 271
#define SYS_signalfd4 289

#define PR_SET_DUMPABLE 4
#define SIGKILL 9
#define SIGCHLD 17
#define WNOHANG 1
#define EINTR 4
#define CLOCK_MONOTONIC 1
#define POLLIN 1
#define SFD_NONBLOCK 04000
#define SFD_CLOEXEC 02000000

#define CONTROL_FD 3
#define STATUS_FD 4
#define PROGRAM_PID 2
/* As `lifeline::IDLE_LIFETIME`: a sandbox never armed ends after an hour. */
#define IDLE_LIFETIME_MS (60L * 60 * 1000)

static inline i64 sys6(i64 n, i64 a, i64 b, i64 c, i64 d, i64 e, i64 f)
{
    i64 r;
    register i64 r10 __asm__("r10") = d;
    register i64 r8 __asm__("r8") = e;
    register i64 r9 __asm__("r9") = f;
    __asm__ volatile("syscall"
                     : "=a"(r)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return r;
}
#define sys(n, a, b, c) sys6(n, (i64)(a), (i64)(b), (i64)(c), 0, 0, 0)

struct pollfd {
    i32 fd;
    short events, revents;
};
struct timespec {
    i64 sec, nsec;
};

static i64 now_ms(void)
{
    struct timespec t = {0, 0};
    sys(SYS_clock_gettime, CLOCK_MONOTONIC, &t, 0);
    return t.sec * 1000 + t.nsec / 1000000;
}

static __attribute__((noreturn)) void finish(i32 kind, i32 value)
{
    /* Little-endian u32 kind, i32 value: `report::decode_status`. */
    unsigned char rec[8];
    for (int i = 0; i < 4; i++) {
        rec[i] = (unsigned char)((u32)kind >> (8 * i));
        rec[4 + i] = (unsigned char)((u32)value >> (8 * i));
    }
    sys(SYS_write, STATUS_FD, rec, 8);
    for (;;)
        sys(SYS_exit_group, 0, 0, 0);
}

/* pid 1 could not set itself up: the program must not run without it (its death ends
 * the namespace anyway; the program is killed first so the status says so). */
static __attribute__((noreturn)) void give_up(void)
{
    sys(SYS_kill, PROGRAM_PID, SIGKILL, 0);
    finish(2, SIGKILL);
}

void zinit_main(void)
{
    /* The program (same uid) must not trace this process or read its memory. */
    if (sys6(SYS_prctl, PR_SET_DUMPABLE, 0, 0, 0, 0, 0) != 0)
        give_up();
    /* SIGCHLD through a signalfd: the mask came blocked from the zygote; say so anyway. */
    u64 chld = 1UL << (SIGCHLD - 1);
    if (sys6(SYS_rt_sigprocmask, 0 /* SIG_BLOCK */, (i64)&chld, 0, 8, 0, 0) != 0)
        give_up();
    i32 sfd = (i32)sys6(SYS_signalfd4, -1, (i64)&chld, 8, SFD_NONBLOCK | SFD_CLOEXEC, 0, 0);
    if (sfd < 0)
        give_up();
    i32 control = CONTROL_FD;
    i64 deadline = now_ms() + IDLE_LIFETIME_MS;
    for (;;) {
        i32 status = 0;
        i64 pid;
        while ((pid = sys6(SYS_wait4, -1, (i64)&status, WNOHANG, 0, 0, 0)) > 0) {
            if (pid == PROGRAM_PID) {
                if ((status & 0x7f) == 0)
                    finish(1, (status >> 8) & 0xff);
                finish(2, status & 0x7f);
            }
        }
        if (pid < 0 && pid != -EINTR)
            finish(2, SIGKILL); /* no child left at all: the program is gone */
        i64 left = deadline - now_ms();
        if (left <= 0) {
            sys(SYS_kill, PROGRAM_PID, SIGKILL, 0);
            finish(2, SIGKILL);
        }
        struct timespec wait = {left / 1000, (left % 1000) * 1000000};
        struct pollfd fds[2] = {{sfd, POLLIN, 0}, {control, POLLIN, 0}};
        sys6(SYS_ppoll, (i64)fds, 2, (i64)&wait, 0, 8, 0);
        unsigned char buf[128];
        while (sys(SYS_read, sfd, buf, sizeof buf) > 0) {
        }
        if (control >= 0 && fds[1].revents) {
            i64 n = sys(SYS_read, control, buf, 64);
            if (n == 0 || (n < 0 && n != -EINTR)) {
                /* The spawner's end is gone; the deadline stands. */
                sys(SYS_close, control, 0, 0);
                control = -1;
            } else if (n >= 8) {
                i64 whole = n / 8 * 8;
                u64 ms = 0;
                for (int i = 7; i >= 0; i--)
                    ms = ms << 8 | buf[whole - 8 + i];
                if (ms < 1)
                    ms = 1;
                if (ms > (u64)IDLE_LIFETIME_MS * 24 * 366)
                    ms = (u64)IDLE_LIFETIME_MS * 24 * 366;
                deadline = now_ms() + (i64)ms;
            }
        }
    }
}

__asm__(".text\n"
        ".global _start\n"
        "_start:\n"
        "  xor %rbp, %rbp\n"
        "  and $-16, %rsp\n"
        "  call zinit_main\n"
        "  hlt\n");
