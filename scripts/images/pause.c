/*
 * The pod sandbox "pause" process for the remora test bed images, built with
 * `gcc -static -O2` by build_push.py. Like Kubernetes' pause: it holds the pod's
 * namespaces, sleeps in pause(), exits 0 on SIGINT/SIGTERM and, as PID 1 of a
 * shared PID namespace, reaps orphaned children on SIGCHLD.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig)
{
	(void)sig;
	_exit(0);
}

static void on_chld(int sig)
{
	int saved = errno;
	(void)sig;
	/* Several children may exit for one delivered SIGCHLD: reap them all. */
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
	errno = saved;
}

static void set_handler(int sig, void (*fn)(int), int flags)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = fn;
	sa.sa_flags = flags;
	sigemptyset(&sa.sa_mask);
	if (sigaction(sig, &sa, NULL) < 0) {
		perror("sigaction");
		exit(1);
	}
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "-v") == 0) {
		puts("pause (remora test bed)");
		return 0;
	}
	if (getpid() != 1)
		fputs("Warning: pause should be the first process\n", stderr);
	set_handler(SIGINT, on_term, 0);
	set_handler(SIGTERM, on_term, 0);
	set_handler(SIGCHLD, on_chld, SA_NOCLDSTOP | SA_RESTART);
	for (;;)
		pause();
}
