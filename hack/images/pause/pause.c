/*
 * pause: the infrastructure ("sandbox") container process for the local
 * gpu-share test cluster.  It holds the pod's namespaces open and does
 * nothing else.  Being PID 1 of the pod, it
 *   - reaps every child that is re-parented to it (SIGCHLD -> waitpid loop),
 *   - exits 0 on SIGINT / SIGTERM (PID 1 has no default signal actions).
 * Build: gcc -static -Os -o pause pause.c
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stop_signal;

static void on_stop(int sig) { stop_signal = sig; }

static void on_child(int sig) {
	int saved = errno;
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
	errno = saved;
}

static int install(int sig, void (*fn)(int)) {
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = fn;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = (sig == SIGCHLD) ? (SA_NOCLDSTOP | SA_RESTART) : 0;
	return sigaction(sig, &sa, NULL);
}

int main(int argc, char **argv) {
	if (argc > 1 && (strcmp(argv[1], "-v") == 0 || strcmp(argv[1], "--version") == 0)) {
		printf("gpu-share pause 1.0\n");
		return 0;
	}
	if (getpid() != 1) {
		fprintf(stderr, "pause: warning: not running as PID 1\n");
	}
	if (install(SIGINT, on_stop) < 0 || install(SIGTERM, on_stop) < 0 ||
	    install(SIGCHLD, on_child) < 0) {
		perror("pause: sigaction");
		return 1;
	}
	while (!stop_signal) {
		pause();
	}
	fprintf(stderr, "pause: exiting on signal %d\n", (int)stop_signal);
	return 0;
}
