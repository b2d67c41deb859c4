#define _GNU_SOURCE
#include "CFloor.h"
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static int send_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0) { if (errno == EINTR) continue; return -1; }
        p += w; n -= (size_t)w;
    }
    return 0;
}

static int recv_all(int fd, char *p, size_t n) {
    while (n > 0) {
        ssize_t r = recv(fd, p, n, 0);
        if (r < 0) { if (errno == EINTR) continue; return -1; }
        if (r == 0) { errno = ECONNRESET; return -1; }
        p += r; n -= (size_t)r;
    }
    return 0;
}

/* Waits until fd or stop_fd is readable; returns 1 for fd, 0 for stop. */
static int wait_readable(int fd, int stop_fd) {
    struct pollfd p[2] = {{fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
    for (;;) {
        int n = poll(p, 2, -1);
        if (n < 0) { if (errno == EINTR) continue; return 0; }
        if (p[1].revents) return 0;
        if (p[0].revents) return 1;
    }
}

int cfloor_serve(int fd, int datagram, int stop_fd) {
    static char buffer[65536];
    if (datagram) {
        for (;;) {
            if (!wait_readable(fd, stop_fd)) return 0;
            struct sockaddr_storage from;
            socklen_t len = sizeof from;
            ssize_t n = recvfrom(fd, buffer, sizeof buffer, 0, (struct sockaddr *)&from, &len);
            if (n < 0) { if (errno == EINTR || errno == ECONNREFUSED) continue; return -1; }
            sendto(fd, buffer, (size_t)n, MSG_NOSIGNAL, (struct sockaddr *)&from, len);
        }
    }
    for (;;) {
        if (!wait_readable(fd, stop_fd)) return 0;
        int client = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
        if (client < 0) { if (errno == EINTR || errno == ECONNABORTED) continue; return -1; }
        int one = 1;
        setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        for (;;) {
            if (!wait_readable(client, stop_fd)) { close(client); return 0; }
            ssize_t n = recv(client, buffer, sizeof buffer, 0);
            if (n <= 0) { if (n < 0 && errno == EINTR) continue; break; }
            if (send_all(client, buffer, (size_t)n) != 0) break;
        }
        close(client);
    }
}

int cfloor_pingpong(int fd, int datagram, int size, int count, int warmup, uint64_t *samples_ns) {
    char *out = malloc((size_t)size), *in = malloc((size_t)size + 1);
    if (!out || !in) { free(out); free(in); errno = ENOMEM; return -1; }
    memset(out, 0x5a, (size_t)size);
    int result = 0;
    for (int i = 0; i < warmup + count; i++) {
        memcpy(out, &i, size < (int)sizeof i ? (size_t)size : sizeof i);
        uint64_t start = now_ns();
        if (datagram) {
            if (send(fd, out, (size_t)size, MSG_NOSIGNAL) < 0) { result = -1; break; }
            ssize_t n;
            do { n = recv(fd, in, (size_t)size + 1, 0); } while (n < 0 && errno == EINTR);
            if (n < 0) { result = -1; break; }
        } else {
            if (send_all(fd, out, (size_t)size) != 0 || recv_all(fd, in, (size_t)size) != 0) { result = -1; break; }
        }
        uint64_t elapsed = now_ns() - start;
        if (i >= warmup) samples_ns[i - warmup] = elapsed;
    }
    free(out);
    free(in);
    return result;
}
