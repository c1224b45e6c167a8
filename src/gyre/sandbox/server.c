/* gyre-sandbox-server: pid 1 of a long-lived bubblewrap sandbox; it runs the commands its driver asks for.
 *
 * The driver (gyre.sandbox.commandserver) starts it once per sandbox, inside every isolation a per-command bubblewrap
 * had (namespaces, seccomp, rlimits, cgroups, the sandbox's own uid), and sends it commands over descriptor 0, a
 * unix stream socket. Frames both ways: u32 payload length, u32 command id, u8 type, payload (little endian).
 *
 *   driver -> server  RUN    u64 output limit, u8 has stdin, u32 argc, u32 envc, then NUL-terminated strings:
 *                            cwd, argv..., env ("K=V")...
 *                     STDIN  bytes for the command's stdin; an empty payload closes it
 *                     KILL   kill the command and everything it started
 *   server -> driver  HELLO  (id 0) the protocol's name, once, first
 *                     OUT    / ERR: the command's stdout / stderr, at most the output limit of each in all
 *                     EXIT   i32 exit code (128+N for death by signal N), u64 stdout bytes, u64 stderr bytes
 *
 * Each command runs under a keeper, a child of this server that is a subreaper: whatever the command leaves
 * behind (daemons, double forks) is reparented to the keeper, which kills it all once the command exits, so a
 * background process lives as long as the command that started it. A keeper the command kills leaves its
 * orphans to this server, which kills every child that is not a live keeper. The server cannot be signalled,
 * traced or read from inside: it is the namespace's pid 1 with no signal handlers (the kernel drops SIGKILL and
 * SIGSTOP sent to it from its own namespace) and not dumpable (no ptrace, no /proc/1/mem or /proc/1/fd). When no
 * command runs, it empties /dev/shm and removes SysV IPC objects, which per-command namespaces used to drop.
 * End of file on descriptor 0 kills everything in the namespace and exits.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/prctl.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

enum { RUN = 1, STDIN = 2, KILL = 3, HELLO = 64, OUT = 65, ERR = 66, EXIT = 67 };
#define HEADER 9
#define MAX_FRAME (64u << 20)
#define HELLO_TEXT "gyre-sandbox-server 1"

extern char **environ;

struct cmd {
    uint32_t id;
    pid_t keeper;       /* 0 once reaped */
    int status;         /* the keeper's exit code, once reaped */
    int fd[3];          /* stdin (our write end), stdout, stderr (our read ends); -1 once closed */
    char *in;           /* stdin not yet written */
    size_t in_len, in_off;
    int in_eof;         /* the driver closed stdin: close our end once `in` is written */
    uint64_t limit, sent[2], total[2];
};

static struct cmd **cmds;
static size_t ncmds, cap_cmds;
static int sock = 0, sigfd = -1;

static void die(const char *what) {
    dprintf(2, "gyre-sandbox-server: %s: %s\n", what, strerror(errno));
    _exit(70);
}

static void write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) {
                struct pollfd w = {fd, POLLOUT, 0};
                poll(&w, 1, -1);
                continue;
            }
            _exit(0); /* the driver is gone */
        }
        p += n;
        len -= (size_t)n;
    }
}

static void send_frame(uint32_t id, uint8_t type, const void *payload, uint32_t len) {
    unsigned char head[HEADER];
    memcpy(head, &len, 4);
    memcpy(head + 4, &id, 4);
    head[8] = type;
    write_all(sock, head, HEADER);
    if (len) write_all(sock, payload, len);
}

static struct cmd *find(uint32_t id) {
    for (size_t i = 0; i < ncmds; i++)
        if (cmds[i]->id == id) return cmds[i];
    return NULL;
}

static int is_live_keeper(pid_t pid) {
    for (size_t i = 0; i < ncmds; i++)
        if (cmds[i]->keeper == pid) return 1;
    return 0;
}

/* The children of this process (/proc/self/task/TID/children), up to `max`. */
static size_t children(pid_t *out, size_t max) {
    char path[64], buf[8192];
    snprintf(path, sizeof path, "/proc/self/task/%d/children", (int)syscall(SYS_gettid));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    size_t count = 0;
    for (char *p = buf; *p && count < max;) {
        char *end;
        long pid = strtol(p, &end, 10);
        if (end == p) break;
        out[count++] = (pid_t)pid;
        p = end;
    }
    return count;
}

/* Kill every child but live keepers (the orphans a killed keeper left) until none is left. */
static void sweep(void) {
    pid_t kids[512];
    for (int rounds = 0; rounds < 10000; rounds++) {
        size_t n = children(kids, 512), strays = 0;
        for (size_t i = 0; i < n; i++) {
            if (is_live_keeper(kids[i])) continue;
            kill(kids[i], SIGKILL);
            strays++;
        }
        if (!strays) return;
        for (size_t i = 0; i < n; i++)
            if (!is_live_keeper(kids[i])) waitpid(kids[i], NULL, __WALL);
    }
}

/* Remove `dir`'s contents (what a command left in /dev/shm). */
static void empty_dir(int dir) {
    DIR *d = fdopendir(dir);
    if (!d) { close(dir); return; }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0) continue;
        int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub >= 0) empty_dir(sub);
        unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR);
    }
    closedir(d);
}

static void remove_ipc(const char *table, int kind) {
    FILE *f = fopen(table, "re");
    if (!f) return;
    char line[512];
    if (!fgets(line, sizeof line, f)) { fclose(f); return; } /* the header */
    while (fgets(line, sizeof line, f)) {
        long key, id;
        if (sscanf(line, "%ld %ld", &key, &id) != 2) continue;
        if (kind == 0) shmctl((int)id, IPC_RMID, NULL);
        else if (kind == 1) semctl((int)id, 0, IPC_RMID);
        else msgctl((int)id, IPC_RMID, NULL);
    }
    fclose(f);
}

static void clean_idle(void) {
    int shm = open("/dev/shm", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (shm >= 0) empty_dir(shm);
    remove_ipc("/proc/sysvipc/shm", 0);
    remove_ipc("/proc/sysvipc/sem", 1);
    remove_ipc("/proc/sysvipc/msg", 2);
}

static void close_fd(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

/* The keeper: run the command as a child, reap everything reparented meanwhile, then kill and reap whatever
 * is left; exit with the command's code (128+N for its death by signal N). */
static void keep(char *cwd, char **argv, char **env) {
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    pid_t pid = fork();
    if (pid < 0) {
        dprintf(2, "gyre: cannot start the command: %s\n", strerror(errno));
        _exit(126);
    }
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        setsid();
        if (chdir(cwd) != 0) {
            dprintf(2, "gyre: cannot change directory to %s: %s\n", cwd, strerror(errno));
            _exit(1);
        }
        environ = env;
        execvp(argv[0], argv);
        int err = errno;
        dprintf(2, "gyre: cannot run %s: %s\n", argv[0], strerror(err));
        _exit(err == ENOENT ? 127 : 126);
    }
    int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    for (int fd = 0; fd < 3; fd++) dup2(devnull, fd); /* the pipes are the command's alone */
    int code = 1, st;
    for (;;) {
        pid_t got = waitpid(-1, &st, __WALL);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) break;
        if (got == pid) {
            code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            break;
        }
    }
    pid_t kids[512];
    for (;;) { /* until no child is left; each round, those reparented here since the last one */
        size_t n = children(kids, 512);
        for (size_t i = 0; i < n; i++) kill(kids[i], SIGKILL);
        pid_t got = waitpid(-1, NULL, __WALL | (n ? 0 : WNOHANG));
        if (got < 0 && errno == ECHILD) break;
        if (got == 0) usleep(1000); /* children /proc did not list: look again */
    }
    _exit(code);
}

static void start(uint32_t id, const unsigned char *p, uint32_t len) {
    if (find(id) || len < 17) goto bad;
    uint64_t limit;
    uint32_t argc, envc;
    memcpy(&limit, p, 8);
    int has_stdin = p[8];
    memcpy(&argc, p + 9, 4);
    memcpy(&envc, p + 13, 4);
    if (argc == 0 || argc > len || envc > len) goto bad;
    char **strs = calloc((size_t)argc + envc + 3, sizeof(char *));
    if (!strs) die("calloc");
    const char *s = (const char *)p + 17, *end = (const char *)p + len;
    for (uint32_t i = 0; i < 1 + argc + envc; i++) {
        const char *nul = memchr(s, 0, (size_t)(end - s));
        if (!nul) { free(strs); goto bad; }
        strs[i < 1 + argc ? i : i + 1] = (char *)s;
        s = nul + 1;
    }
    /* strs: cwd, argv..., NULL, env..., NULL */
    int out[2], err[2], in[2] = {-1, -1};
    if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) || (has_stdin && pipe2(in, O_CLOEXEC))) {
        int e = errno;
        char msg[160];
        int n = snprintf(msg, sizeof msg, "gyre: cannot start the command: %s\n", strerror(e));
        send_frame(id, ERR, msg, (uint32_t)n);
        int32_t code = 126;
        unsigned char exit_msg[20] = {0};
        memcpy(exit_msg, &code, 4);
        send_frame(id, EXIT, exit_msg, 20);
        free(strs);
        return;
    }
    if (!has_stdin) {
        in[0] = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    pid_t keeper = fork();
    if (keeper < 0) die("fork");
    if (keeper == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        dup2(err[1], 2);
        syscall(SYS_close_range, 3, ~0U, 0);
        keep(strs[0], strs + 1, strs + 2 + argc);
    }
    free(strs);
    close(out[1]);
    close(err[1]);
    close(in[0]);
    struct cmd *c = calloc(1, sizeof *c);
    if (!c) die("calloc");
    c->id = id;
    c->keeper = keeper;
    c->fd[0] = in[1];
    c->fd[1] = out[0];
    c->fd[2] = err[0];
    c->limit = limit;
    if (c->fd[0] >= 0) fcntl(c->fd[0], F_SETFL, O_NONBLOCK);
    if (ncmds == cap_cmds) {
        cap_cmds = cap_cmds ? cap_cmds * 2 : 16;
        cmds = realloc(cmds, cap_cmds * sizeof *cmds);
        if (!cmds) die("realloc");
    }
    cmds[ncmds++] = c;
    return;
bad:
    dprintf(2, "gyre-sandbox-server: malformed RUN frame\n");
    _exit(65);
}

static void feed(struct cmd *c, const unsigned char *p, uint32_t len) {
    if (c->fd[0] < 0) return; /* closed, or the command is gone: its stdin is dropped */
    if (len == 0) {
        c->in_eof = 1;
        if (c->in_off == c->in_len) close_fd(&c->fd[0]);
        return;
    }
    char *grown = realloc(c->in, c->in_len + len);
    if (!grown) die("realloc");
    c->in = grown;
    memcpy(c->in + c->in_len, p, len);
    c->in_len += len;
}

static void drive_stdin(struct cmd *c) {
    while (c->fd[0] >= 0 && c->in_off < c->in_len) {
        ssize_t n = write(c->fd[0], c->in + c->in_off, c->in_len - c->in_off);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN) close_fd(&c->fd[0]); /* EPIPE: the command stopped reading */
            return;
        }
        c->in_off += (size_t)n;
    }
    if (c->in_off == c->in_len) {
        free(c->in);
        c->in = NULL;
        c->in_len = c->in_off = 0;
        if (c->in_eof) close_fd(&c->fd[0]);
    }
}

static void drain(struct cmd *c, int stream) {
    char buf[65536];
    ssize_t n = read(c->fd[stream], buf, sizeof buf);
    if (n < 0 && errno == EINTR) return;
    if (n <= 0) {
        close_fd(&c->fd[stream]);
        return;
    }
    uint64_t room = c->limit > c->sent[stream - 1] ? c->limit - c->sent[stream - 1] : 0;
    uint32_t forward = (uint64_t)n < room ? (uint32_t)n : (uint32_t)room;
    if (forward) send_frame(c->id, stream == 1 ? OUT : ERR, buf, forward);
    c->sent[stream - 1] += forward;
    c->total[stream - 1] += (uint64_t)n;
}

static void reap(void) {
    struct signalfd_siginfo info;
    while (read(sigfd, &info, sizeof info) > 0) {}
    int st, killed = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG | __WALL)) > 0) {
        for (size_t i = 0; i < ncmds; i++) {
            if (cmds[i]->keeper != pid) continue;
            cmds[i]->keeper = 0;
            cmds[i]->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            killed |= WIFSIGNALED(st);
            close_fd(&cmds[i]->fd[0]);
        }
    }
    if (killed) sweep();
}

/* Report and forget every command whose keeper is reaped and whose output is read to its end. */
static void finish(void) {
    for (size_t i = 0; i < ncmds;) {
        struct cmd *c = cmds[i];
        if (c->keeper || c->fd[1] >= 0 || c->fd[2] >= 0) {
            i++;
            continue;
        }
        unsigned char msg[20];
        int32_t code = c->status;
        memcpy(msg, &code, 4);
        memcpy(msg + 4, &c->total[0], 8);
        memcpy(msg + 12, &c->total[1], 8);
        send_frame(c->id, EXIT, msg, 20);
        free(c->in);
        free(c);
        cmds[i] = cmds[--ncmds];
        if (ncmds == 0) clean_idle();
    }
}

static unsigned char *inbuf;
static size_t in_used, in_cap;

/* Read what the driver sent and act on every whole frame; returns 0 at end of file. */
static int from_driver(void) {
    if (in_cap - in_used < 65536) {
        in_cap = in_cap ? in_cap * 2 : 131072;
        inbuf = realloc(inbuf, in_cap);
        if (!inbuf) die("realloc");
    }
    ssize_t n = read(sock, inbuf + in_used, in_cap - in_used);
    if (n < 0) return errno == EINTR || errno == EAGAIN;
    if (n == 0) return 0;
    in_used += (size_t)n;
    size_t off = 0;
    while (in_used - off >= HEADER) {
        uint32_t len, id;
        memcpy(&len, inbuf + off, 4);
        memcpy(&id, inbuf + off + 4, 4);
        uint8_t type = inbuf[off + 8];
        if (len > MAX_FRAME) {
            dprintf(2, "gyre-sandbox-server: frame of %u bytes\n", len);
            _exit(65);
        }
        if (in_used - off - HEADER < len) {
            if (in_cap < HEADER + (size_t)len) { /* grow to hold the whole frame */
                memmove(inbuf, inbuf + off, in_used - off);
                in_used -= off;
                off = 0;
                in_cap = HEADER + (size_t)len;
                inbuf = realloc(inbuf, in_cap);
                if (!inbuf) die("realloc");
            }
            break;
        }
        const unsigned char *payload = inbuf + off + HEADER;
        struct cmd *c = find(id);
        if (type == RUN) start(id, payload, len);
        else if (type == STDIN && c) feed(c, payload, len);
        else if (type == KILL && c && c->keeper) kill(c->keeper, SIGKILL);
        off += HEADER + len;
    }
    memmove(inbuf, inbuf + off, in_used - off);
    in_used -= off;
    return 1;
}

int main(void) {
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    sigfd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sigfd < 0) die("signalfd");
    signal(SIGPIPE, SIG_IGN);
    prctl(PR_SET_DUMPABLE, 0);
    fcntl(sock, F_SETFD, FD_CLOEXEC);
    int devnull = open("/dev/null", O_RDWR);
    dup2(devnull, 1);
    dup2(devnull, 2); /* until here, errors reached the driver through the socket */
    if (devnull > 2) close(devnull);
    send_frame(0, HELLO, HELLO_TEXT, sizeof HELLO_TEXT - 1);
    struct pollfd *fds = NULL;
    struct cmd **owner = NULL;
    int *which = NULL;
    size_t cap = 0;
    for (;;) {
        size_t need = 2 + 3 * ncmds, n = 0;
        if (need > cap) {
            cap = need * 2;
            fds = realloc(fds, cap * sizeof *fds);
            owner = realloc(owner, cap * sizeof *owner);
            which = realloc(which, cap * sizeof *which);
            if (!fds || !owner || !which) die("realloc");
        }
        fds[n++] = (struct pollfd){sock, POLLIN, 0};
        fds[n++] = (struct pollfd){sigfd, POLLIN, 0};
        for (size_t i = 0; i < ncmds; i++) {
            struct cmd *c = cmds[i];
            for (int s = 0; s < 3; s++) {
                if (c->fd[s] < 0 || (s == 0 && c->in_off == c->in_len)) continue;
                owner[n] = c;
                which[n] = s;
                fds[n++] = (struct pollfd){c->fd[s], (short)(s == 0 ? POLLOUT : POLLIN), 0};
            }
        }
        if (poll(fds, n, -1) < 0) {
            if (errno == EINTR) continue;
            die("poll");
        }
        for (size_t i = 2; i < n; i++) {
            if (!fds[i].revents) continue;
            if (which[i] == 0) drive_stdin(owner[i]);
            else drain(owner[i], which[i]);
        }
        if (fds[1].revents) reap();
        if (fds[0].revents && !from_driver()) break;
        for (size_t i = 0; i < ncmds; i++) drive_stdin(cmds[i]); /* stdin that arrived just now */
        finish();
    }
    /* the driver is gone: nothing here outlives it */
    if (getpid() == 1) kill(-1, SIGKILL);
    else
        for (size_t i = 0; i < ncmds; i++)
            if (cmds[i]->keeper) kill(cmds[i]->keeper, SIGKILL);
    return 0;
}
