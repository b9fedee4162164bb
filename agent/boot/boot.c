/*
 * orchard-boot: starts the agent in a Kubernetes sandbox pod without an init container.
 *
 * The agent (a static Go binary of ~7 MB) reaches the pod as parts of at most 1 MiB each,
 * one ConfigMap per part (the API server's limit), projected read-only into the pod with
 * this loader (small enough for one ConfigMap itself: a Go loader would not be). It joins
 * the parts into a sealed memfd and execs that, so the agent is never on a path the
 * sandbox could write. An init container did this copy before: one more container to
 * create, start, wait out and delete per pod, which doubled the node's cost of a sandbox.
 *
 *   orchard-boot SIZE PREFIX OWN_DIR -- ARGV0 ARGS...
 *
 * SIZE: the agent's size in bytes (a missing or short part is an error, not a crash of a
 * half-copied binary); PREFIX: the parts are PREFIX0, PREFIX1, ... in order; OWN_DIR: the
 * agent's writable folder (an emptyDir the kubelet makes 0777), closed to 0755 here so no
 * sandbox user can plant files in it; ARGV0 ARGS...: the agent's own argv.
 * Where exec from a memfd is refused (vm.memfd_noexec = 2), the agent is written to
 * OWN_DIR/orchard-agent (root's, 0555) and run from there.
 *
 * Linux only, libc only, built static (`make agent`).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

extern char **environ;

static void die(const char *what, const char *arg) {
    fprintf(stderr, "orchard-boot: %s%s%s: %s\n", what, arg ? " " : "", arg ? arg : "",
            errno ? strerror(errno) : "failed");
    exit(126);
}

/* Appends PREFIX0, PREFIX1, ... to fd; returns the bytes written. */
static long long join(int fd, const char *prefix) {
    char path[4096];
    long long total = 0;
    for (int i = 0;; i++) {
        if (snprintf(path, sizeof path, "%s%d", prefix, i) >= (int)sizeof path) {
            errno = ENAMETOOLONG;
            die("part name", prefix);
        }
        int in = open(path, O_RDONLY | O_CLOEXEC);
        if (in < 0) {
            if (errno == ENOENT && i > 0) return total;
            die("open", path);
        }
        for (;;) {
            ssize_t n = sendfile(fd, in, NULL, 1 << 30);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) die("copy", path);
            if (n == 0) break;
            total += n;
        }
        close(in);
    }
}

static void check_size(long long got, long long want) {
    if (got != want) {
        errno = 0;
        fprintf(stderr, "orchard-boot: the agent's parts hold %lld bytes, not %lld\n", got, want);
        exit(126);
    }
}

/* The fallback: OWN_DIR/orchard-agent, written under a temporary name and renamed. */
static void run_from_dir(const char *prefix, const char *dir, long long want, char **argv) {
    char tmp[4096], dst[4096];
    snprintf(tmp, sizeof tmp, "%s/.orchard-agent.tmp", dir);
    snprintf(dst, sizeof dst, "%s/orchard-agent", dir);
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0555);
    if (fd < 0) die("create", tmp);
    check_size(join(fd, prefix), want);
    if (close(fd) < 0) die("write", tmp);
    if (rename(tmp, dst) < 0) die("rename", dst);
    execve(dst, argv, environ);
    die("exec", dst);
}

int main(int argc, char **argv) {
    if (argc < 6 || strcmp(argv[4], "--") != 0) {
        fprintf(stderr, "usage: orchard-boot SIZE PREFIX OWN_DIR -- ARGV0 ARGS...\n");
        return 2;
    }
    char *end;
    errno = 0;
    long long want = strtoll(argv[1], &end, 10);
    if (errno || *end || want <= 0) die("size", argv[1]);
    const char *prefix = argv[2], *dir = argv[3];
    char **agent_argv = argv + 5;
    if (chmod(dir, 0755) < 0) die("chmod", dir);

    int fd = memfd_create("orchard-agent", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) run_from_dir(prefix, dir, want, agent_argv);
    check_size(join(fd, prefix), want);
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0)
        die("seal", "memfd");
    syscall(SYS_execveat, fd, "", agent_argv, environ, AT_EMPTY_PATH);
    if (errno != EACCES && errno != EPERM) die("exec", "memfd");
    close(fd);
    run_from_dir(prefix, dir, want, agent_argv);
    return 126;
}
