#ifndef CFLOOR_H
#define CFLOOR_H
#include <stdint.h>

/* The C floor: the least a round trip can cost on this machine. Plain blocking sockets, no allocation, no
 * threads beyond the caller's. sockbench compare runs it beside every backend so "ratio to the floor" is
 * always a column. */

/* Echo server on a bound socket: TCP (listening) serves one client at a time until it closes; UDP echoes
 * every datagram to its sender. Returns when stop_fd becomes readable (or on error): -1 with errno set. */
int cfloor_serve(int fd, int datagram, int stop_fd);

/* Closed-loop ping-pong on a connected blocking socket: `warmup` then `count` round trips of `size` bytes;
 * samples_ns[i] receives each measured round trip (CLOCK_MONOTONIC). Returns 0, or -1 with errno set. */
int cfloor_pingpong(int fd, int datagram, int size, int count, int warmup, uint64_t *samples_ns);
#endif
