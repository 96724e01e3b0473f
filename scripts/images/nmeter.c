/*
 * The subset of busybox's `nmeter` applet the node e2e suite runs in its busybox image
 * (Debian's busybox has no nmeter): `nmeter [-dMSEC] FORMAT`, where FORMAT is literal text
 * and `%[N]t` (the time of day, HH:MM:SS with N digits of fractions, UTC as in a container
 * without a zone file). Prints one line every MSEC milliseconds (default 1000; 0: at once)
 * until its output is closed, as `nmeter -d0 '%3t' | head -n1` expects. Any other `%`
 * conversion is refused, so a test that needs more fails instead of reading a wrong value.
 * Built with `gcc -static -O2` by build_push.py.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int format_line(const char *fmt, char *out, size_t cap)
{
	struct timeval tv;
	struct tm tm;
	size_t n = 0;

	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	for (const char *p = fmt; *p; p++) {
		int w;
		if (*p != '%') {
			if (n + 1 >= cap)
				return -1;
			out[n++] = *p;
			continue;
		}
		p++;
		int digits = 0;
		if (*p >= '0' && *p <= '6')
			digits = *p++ - '0';
		if (*p != 't')
			return -1;
		w = snprintf(out + n, cap - n, "%02d:%02d:%02d", tm.tm_hour, tm.tm_min, tm.tm_sec);
		if (w < 0 || (size_t)w >= cap - n)
			return -1;
		n += (size_t)w;
		if (digits > 0) {
			long frac = tv.tv_usec;
			for (int i = digits; i < 6; i++)
				frac /= 10;
			w = snprintf(out + n, cap - n, ".%0*ld", digits, frac);
			if (w < 0 || (size_t)w >= cap - n)
				return -1;
			n += (size_t)w;
		}
	}
	if (n + 2 > cap)
		return -1;
	out[n++] = '\n';
	out[n] = '\0';
	return (int)n;
}

int main(int argc, char **argv)
{
	long delay_ms = 1000;
	const char *fmt = NULL;
	char line[4096];

	for (int i = 1; i < argc; i++) {
		if (strncmp(argv[i], "-d", 2) == 0) {
			const char *v = argv[i][2] ? argv[i] + 2 : (i + 1 < argc ? argv[++i] : "");
			char *end;
			delay_ms = strtol(v, &end, 10);
			if (*v == '\0' || *end != '\0' || delay_ms < 0) {
				fprintf(stderr, "nmeter: bad -d value\n");
				return 1;
			}
		} else if (fmt == NULL) {
			fmt = argv[i];
		} else {
			fprintf(stderr, "usage: nmeter [-dMSEC] FORMAT\n");
			return 1;
		}
	}
	if (fmt == NULL) {
		fprintf(stderr, "usage: nmeter [-dMSEC] FORMAT\n");
		return 1;
	}
	for (;;) {
		int n = format_line(fmt, line, sizeof line);
		if (n < 0) {
			fprintf(stderr, "nmeter: only literal text and %%[N]t are supported\n");
			return 1;
		}
		if (write(STDOUT_FILENO, line, (size_t)n) != n)
			return 0;
		if (delay_ms > 0)
			usleep((useconds_t)(delay_ms * 1000));
	}
}
