#ifndef CFLOOR_H
#define CFLOOR_H
#include <stdint.h>

/* The C floor: the least a round trip can cost on this machine. Plain blocking sockets, no allocation in
 * the measured loops, no threads beyond the caller's (the open-loop client adds one receiver, as its Swift twin has). sockbench compare runs it beside every backend so "ratio to the floor" is
 * always a column. */

/* Echo server on a bound socket: TCP (listening) serves one client at a time until it closes; UDP echoes
 * every datagram to its sender. Returns when stop_fd becomes readable (or on error): -1 with errno set. */
int cfloor_serve(int fd, int datagram, int stop_fd);

/* Closed-loop ping-pong on a connected blocking socket: `warmup` then `count` round trips of `size` bytes;
 * samples_ns[i] receives each measured round trip (CLOCK_MONOTONIC). Returns 0, or -1 with errno set. */
int cfloor_pingpong(int fd, int datagram, int size, int count, int warmup, uint64_t *samples_ns);

/* The sink for a pump (the protocol of sockbench's PumpSink): TCP counts bytes until the sender half-closes,
 * answers with the count (8 bytes, big endian) and closes, one client at a time; UDP counts datagrams (each
 * starts with an 8-byte big-endian sequence number) and answers a datagram of eight 0xFF bytes with received,
 * reordered, bytes, and the nanoseconds from the first datagram received to the last (4 x 8 bytes). Returns when stop_fd becomes readable (or on error): -1 with errno set. */
int cfloor_sink(int fd, int datagram, int stop_fd);

/* What a pump reported. */
typedef struct {
    uint64_t sent;        /* writes (TCP) or datagrams (UDP) handed to the kernel */
    uint64_t send_errors; /* UDP datagrams the kernel refused (ENOBUFS and the like) */
    uint64_t delivered;   /* TCP: bytes the sink counted; UDP: datagrams it received */
    uint64_t reordered;   /* UDP: datagrams that came after a later one */
    uint64_t send_ns;     /* from the first write to the last (UDP) or to the sink's answer (TCP) */
    uint64_t receive_ns;  /* UDP: from the first datagram the sink received to the last, by the sink's clock */
} cfloor_pump_result;

/* One-way bulk on a connected blocking socket to a cfloor_sink: total_bytes in writes of `size` bytes (UDP:
 * total_bytes / size datagrams), then the sink's count. Returns 0, or -1 with errno set. */
int cfloor_pump(int fd, int datagram, int size, uint64_t total_bytes, cfloor_pump_result *result);

/* Open-loop load on a connected blocking socket, as sockbench's rate runner does it: `total` messages of `size`
 * bytes (the first four carry the sequence number), message i meant to leave at start + i x interval_ns, and a
 * second thread receives the echoes. The sender waits for each send time as sockbench's pacer does: with `spin`,
 * it checks the clock and yields the CPU to any other runnable thread between checks (sched_yield), so the CPU
 * never idles and a thread woken on it (the server, the receiver) runs at once; without, it sleeps
 * (clock_nanosleep), and the message pays the timer's lateness and the wake-up of an idle CPU. Fills
 * intended_ns[i] and actual_ns[i] (when each was meant to go and went) and received_ns[i] (when its echo came
 * back; 0 when it never did within half a second of the last send), *received, and *waiting_cpu_ns (the
 * sender's CPU time spent waiting for send times). Returns 0, or -1 with errno set. */
int cfloor_rate(int fd, int datagram, int size, int total, uint64_t interval_ns, int spin, uint64_t *intended_ns,
                uint64_t *actual_ns, uint64_t *received_ns, int *received, uint64_t *waiting_cpu_ns);
#endif
