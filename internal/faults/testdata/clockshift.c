/*
 * clockshift: an LD_PRELOAD library that moves a process's wall clock by
 * the offset stored in the file named by CLOCKSHIFT_FILE (a little-endian
 * int64 of nanoseconds, read through a shared mapping on every call, so
 * a write to the file moves the clock at once). The monotonic clocks are
 * left alone: a clock step as NTP or an operator makes it.
 *
 * libfaketime does the same, but cannot start Debian's redis-server: it
 * resolves the real functions with dlsym, which allocates, and jemalloc
 * reads the clock while it initialises (wolfcw/libfaketime#130). This
 * library calls the kernel directly and allocates nothing.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile const int64_t *shift;

__attribute__((constructor)) static void map_shift(void)
{
	const char *path = getenv("CLOCKSHIFT_FILE");
	if (path == NULL)
		return;
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return;
	void *p = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (p != MAP_FAILED)
		shift = p;
}

int clock_gettime(clockid_t id, struct timespec *ts)
{
	long r = syscall(SYS_clock_gettime, id, ts);
	if (r != 0 || shift == NULL || (id != CLOCK_REALTIME && id != CLOCK_REALTIME_COARSE))
		return (int)r;
	int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + *shift;
	ts->tv_sec = ns / 1000000000;
	ts->tv_nsec = ns % 1000000000;
	if (ts->tv_nsec < 0) {
		ts->tv_sec--;
		ts->tv_nsec += 1000000000;
	}
	return 0;
}

int gettimeofday(struct timeval *tv, void *tz)
{
	struct timespec ts;
	(void)tz;
	if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
		return -1;
	tv->tv_sec = ts.tv_sec;
	tv->tv_usec = ts.tv_nsec / 1000;
	return 0;
}

time_t time(time_t *out)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	if (out != NULL)
		*out = ts.tv_sec;
	return ts.tv_sec;
}
