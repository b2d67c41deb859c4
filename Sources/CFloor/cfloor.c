#define _GNU_SOURCE
#include "CFloor.h"
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
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

enum { STOPPED = -2 };

/* The next datagram on fd (its sender in *from), STOPPED when stop_fd becomes readable, or -1 with errno. */
static ssize_t next_datagram(int fd, int stop_fd, void *buffer, size_t size, struct sockaddr_storage *from,
                             socklen_t *len) {
    for (;;) {
        if (!wait_readable(fd, stop_fd)) return STOPPED;
        *len = sizeof *from;
        ssize_t n = recvfrom(fd, buffer, size, 0, (struct sockaddr *)from, len);
        if (n >= 0) return n;
        if (errno != EINTR && errno != ECONNREFUSED) return -1;
    }
}

/* The next client of listening fd, STOPPED when stop_fd becomes readable, or -1 with errno. */
static int next_client(int fd, int stop_fd) {
    for (;;) {
        if (!wait_readable(fd, stop_fd)) return STOPPED;
        int client = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
        if (client >= 0) return client;
        if (errno != EINTR && errno != ECONNABORTED) return -1;
    }
}

int cfloor_serve(int fd, int datagram, int stop_fd) {
    static char buffer[65536];
    if (datagram) {
        for (;;) {
            struct sockaddr_storage from;
            socklen_t len;
            ssize_t n = next_datagram(fd, stop_fd, buffer, sizeof buffer, &from, &len);
            if (n < 0) return n == STOPPED ? 0 : -1;
            sendto(fd, buffer, (size_t)n, MSG_NOSIGNAL, (struct sockaddr *)&from, len);
        }
    }
    for (;;) {
        int client = next_client(fd, stop_fd);
        if (client < 0) return client == STOPPED ? 0 : -1;
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

static void put_be64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (56 - 8 * i));
}

static uint64_t get_be64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | p[i];
    return v;
}

static const unsigned char stats_request[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};

int cfloor_sink(int fd, int datagram, int stop_fd) {
    static unsigned char buffer[65536];
    if (datagram) {
        /* Counts are per sender (each pump connects a socket of its own): a new sender starts from zero. */
        uint64_t received = 0, reordered = 0, bytes = 0, highest = 0, first_ns = 0, last_ns = 0;
        struct sockaddr_storage sender;
        socklen_t sender_len = 0;
        for (;;) {
            struct sockaddr_storage from;
            socklen_t len;
            ssize_t n = next_datagram(fd, stop_fd, buffer, sizeof buffer, &from, &len);
            if (n < 0) return n == STOPPED ? 0 : -1;
            if (n < 8) continue;
            if (len != sender_len || memcmp(&from, &sender, len) != 0) {
                memcpy(&sender, &from, len);
                sender_len = len;
                received = reordered = bytes = highest = first_ns = last_ns = 0;
            }
            if (memcmp(buffer, stats_request, 8) == 0) {
                unsigned char answer[32];
                put_be64(answer, received);
                put_be64(answer + 8, reordered);
                put_be64(answer + 16, bytes);
                put_be64(answer + 24, last_ns - first_ns);
                sendto(fd, answer, sizeof answer, MSG_NOSIGNAL, (struct sockaddr *)&from, len);
                continue;
            }
            uint64_t sequence = get_be64(buffer);
            last_ns = now_ns();
            if (received == 0) first_ns = last_ns;
            received++;
            bytes += (uint64_t)n;
            if (sequence < highest) reordered++; else highest = sequence;
        }
    }
    for (;;) {
        int client = next_client(fd, stop_fd);
        if (client < 0) return client == STOPPED ? 0 : -1;
        uint64_t bytes = 0;
        for (;;) {
            if (!wait_readable(client, stop_fd)) { close(client); return 0; }
            ssize_t n = recv(client, buffer, sizeof buffer, 0);
            if (n < 0) { if (errno == EINTR) continue; break; }
            if (n == 0) {
                unsigned char answer[8];
                put_be64(answer, bytes);
                send_all(client, (const char *)answer, sizeof answer);
                break;
            }
            bytes += (uint64_t)n;
        }
        close(client);
    }
}

int cfloor_pump(int fd, int datagram, int size, uint64_t total_bytes, cfloor_pump_result *result) {
    memset(result, 0, sizeof *result);
    if (size < 8) size = 8;
    char *chunk = malloc((size_t)size);
    if (!chunk) { errno = ENOMEM; return -1; }
    memset(chunk, 0xa5, (size_t)size);
    uint64_t writes = total_bytes / (uint64_t)size;
    if (writes == 0) writes = 1;
    int status = 0;
    uint64_t start = now_ns();
    if (!datagram) {
        for (uint64_t i = 0; i < writes; i++) {
            if (send_all(fd, chunk, (size_t)size) != 0) { status = -1; goto done; }
        }
        result->sent = writes;
        if (shutdown(fd, SHUT_WR) != 0) { status = -1; goto done; }
        unsigned char answer[8];
        if (recv_all(fd, (char *)answer, sizeof answer) != 0) { status = -1; goto done; }
        result->send_ns = now_ns() - start;
        result->delivered = get_be64(answer);
        goto done;
    }
    for (uint64_t i = 0; i < writes; i++) {
        put_be64((unsigned char *)chunk, i);
        if (send(fd, chunk, (size_t)size, MSG_NOSIGNAL) < 0) {
            if (errno == EINTR) { i--; continue; }
            result->send_errors++;
            continue;
        }
        result->sent++;
    }
    result->send_ns = now_ns() - start;
    /* Ask for the counts; ask again when the request or the answer is lost. */
    for (int attempt = 0; attempt < 20; attempt++) {
        send(fd, stats_request, sizeof stats_request, MSG_NOSIGNAL);
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 200) <= 0) continue;
        unsigned char answer[64];
        ssize_t n = recv(fd, answer, sizeof answer, 0);
        if (n >= 24) {
            result->delivered = get_be64(answer);
            result->reordered = get_be64(answer + 8);
            if (n >= 32) result->receive_ns = get_be64(answer + 24);
            goto done;
        }
    }
    errno = ETIMEDOUT;
    status = -1;
done:
    free(chunk);
    return status;
}

/* The open-loop client's receiving side: a thread of its own, as the Swift runner's receiver is a task of its
 * own. It records when each echo came back, by the sequence number in its first four bytes. */
typedef struct {
    int fd, datagram, size, total;
    uint64_t *received_ns;
    volatile uint64_t give_up_ns; /* 0 while the sender runs; then the time after which echoes are lost */
    int received, failed, error;
} rate_receiver;

static void *receive_echoes(void *context) {
    rate_receiver *r = context;
    size_t size = (size_t)r->size;
    char *buffer = malloc(size * 64 + 1);
    size_t held = 0; /* TCP: bytes of an incomplete message at the start of buffer */
    if (!buffer) { r->failed = 1; r->error = ENOMEM; return NULL; }
    while (r->received < r->total) {
        uint64_t give_up = __atomic_load_n(&r->give_up_ns, __ATOMIC_ACQUIRE);
        if (give_up && now_ns() >= give_up) break;
        /* Block in recv as the blocking client does; wake at least every 50 ms to see whether to give up. */
        struct pollfd p = {r->fd, POLLIN, 0};
        int n = poll(&p, 1, 50);
        if (n < 0 && errno != EINTR) { r->failed = 1; r->error = errno; break; }
        if (n <= 0) continue;
        ssize_t got = r->datagram ? recv(r->fd, buffer, size + 1, 0) : recv(r->fd, buffer + held, size * 64 - held, 0);
        uint64_t now = now_ns();
        if (got < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == ECONNREFUSED) continue;
            r->failed = 1; r->error = errno; break;
        }
        if (got == 0 && !r->datagram) { r->failed = 1; r->error = ECONNRESET; break; }
        size_t available = r->datagram ? (size_t)got : held + (size_t)got;
        size_t offset = 0;
        while (available - offset >= size) {
            uint32_t sequence;
            memcpy(&sequence, buffer + offset, sizeof sequence);
            if (sequence < (uint32_t)r->total && r->received_ns[sequence] == 0) {
                r->received_ns[sequence] = now;
                r->received++;
            }
            offset += size;
            if (r->datagram) break;
        }
        if (!r->datagram) {
            held = available - offset;
            memmove(buffer, buffer + offset, held);
        }
    }
    free(buffer);
    return NULL;
}

static uint64_t thread_cpu_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

int cfloor_rate(int fd, int datagram, int size, int total, uint64_t interval_ns, int spin, uint64_t *intended_ns,
                uint64_t *actual_ns, uint64_t *received_ns, int *received, uint64_t *waiting_cpu_ns) {
    if (size < (int)sizeof(uint32_t)) size = (int)sizeof(uint32_t);
    char *out = malloc((size_t)size);
    if (!out) { errno = ENOMEM; return -1; }
    memset(out, 0x5a, (size_t)size);
    memset(received_ns, 0, sizeof *received_ns * (size_t)total);
    rate_receiver r = {fd, datagram, size, total, received_ns, 0, 0, 0, 0};
    pthread_t thread;
    int status = pthread_create(&thread, NULL, receive_echoes, &r);
    if (status != 0) { free(out); errno = status; return -1; }
    int result = 0;
    uint64_t waited = 0;
    uint64_t start = now_ns() + 1000000;
    for (int i = 0; i < total; i++) {
        uint64_t intended = start + (uint64_t)((double)i * (double)interval_ns);
        /* Wait as the Swift pacer does; lateness shows in the corrected time. */
        uint64_t cpu_before = thread_cpu_ns();
        if (spin) {
            while (now_ns() < intended) sched_yield();
        } else {
            struct timespec until = {(time_t)(intended / 1000000000ull), (long)(intended % 1000000000ull)};
            while (now_ns() < intended && clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) == EINTR) {}
        }
        waited += thread_cpu_ns() - cpu_before; /* before the actual send time: not in the uncorrected latency */
        uint64_t actual = now_ns();
        intended_ns[i] = intended;
        actual_ns[i] = actual;
        uint32_t sequence = (uint32_t)i;
        memcpy(out, &sequence, sizeof sequence);
        int sent = datagram ? (send(fd, out, (size_t)size, MSG_NOSIGNAL) < 0 ? -1 : 0) : send_all(fd, out, (size_t)size);
        if (sent != 0 && !(datagram && (errno == ECONNREFUSED || errno == ENOBUFS))) { result = -1; break; }
    }
    int code = errno;
    /* Echoes still in flight get half a second, as in the Swift runner. */
    __atomic_store_n(&r.give_up_ns, now_ns() + 500000000ull, __ATOMIC_RELEASE);
    pthread_join(thread, NULL);
    free(out);
    *received = r.received;
    *waiting_cpu_ns = waited;
    if (result != 0) { errno = code; return -1; }
    if (r.failed) { errno = r.error; return -1; }
    return 0;
}
