/*
 * The pod sandbox's process: holds the pod's namespaces open until told to stop.
 * Blocks until SIGINT or SIGTERM (then exits 0) and, as the pod's PID 1 when the pod shares its
 * process namespace, reaps every child that exits (SIGCHLD). Built by hack/images/small.py with
 * `gcc -static -Os`; `/pause -v` prints its version.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define VERSION "gpuferry-pause 1"

static void on_stop(int sig) {
    static const char msg[] = "pause: stopping\n";
    (void)sig;
    if (write(STDERR_FILENO, msg, sizeof msg - 1) < 0) {
        /* nothing to do: we are leaving anyway */
    }
    _exit(0);
}

static void on_child(int sig) {
    int saved = errno;
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

static int handle(int sig, void (*handler)(int), int flags) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    return sigaction(sig, &sa, NULL);
}

int main(int argc, char **argv) {
    if (argc > 1 && (strcmp(argv[1], "-v") == 0 || strcmp(argv[1], "--version") == 0)) {
        printf("%s\n", VERSION);
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "usage: %s [-v]\n", argv[0]);
        return 2;
    }
    if (handle(SIGINT, on_stop, 0) < 0 || handle(SIGTERM, on_stop, 0) < 0 ||
        handle(SIGCHLD, on_child, SA_NOCLDSTOP | SA_RESTART) < 0) {
        perror("pause: sigaction");
        return 1;
    }
    if (getpid() != 1) {
        fprintf(stderr, "pause: warning: not PID 1, orphans are not reparented here\n");
    }
    on_child(SIGCHLD); /* children that ended before the handler was in place */
    for (;;) {
        pause();
    }
}
