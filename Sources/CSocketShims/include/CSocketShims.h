#ifndef CSOCKETSHIMS_H
#define CSOCKETSHIMS_H

#include <stdint.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

/// accept4(2) with SOCK_CLOEXEC (and SOCK_NONBLOCK when nonblocking != 0). Glibc's module does not import it.
int csock_accept4(int fd, struct sockaddr *addr, socklen_t *len, int nonblocking);

/// The symbolic name of an errno value ("ECONNREFUSED"), or NULL when unknown.
const char *csock_errno_name(int code);

/// epoll, eventfd and timerfd, which the Glibc module does not import.
int csock_epoll_create(void);
int csock_epoll_ctl(int epfd, int op, int fd, uint32_t events, uint64_t data);
/// Waits; fills events[i] and datas[i] for each ready descriptor. Returns the count or -1 (errno set).
int csock_epoll_wait(int epfd, uint32_t *events, uint64_t *datas, int max, int timeout_ms);
int csock_eventfd(void);
int csock_eventfd_signal(int fd);
int csock_eventfd_drain(int fd);
/* ppoll(2) for POLLIN on one descriptor with a nanosecond time-out: 1 when readable, 0 on time-out or a signal. */
int csock_wait_readable_ns(int fd, long long seconds, long nanoseconds);

/* Waking one thread out of poll without a descriptor: a thread-directed real-time signal (SIGRTMIN + 3, with an
   empty handler installed once per process) that a waiting thread keeps blocked except inside
   csock_wake_poll's ppoll(2), so a wake-up sent while it runs stays pending and ends its next wait at once. */
/* On the thread that will wait: blocks the signal there (once per thread). Installs the handler (once). */
void csock_wake_prepare_thread(void);
/* The calling thread's id, for csock_wake_thread. */
unsigned long csock_thread_self(void);
/* Wakes `thread` (a thread that called csock_wake_prepare_thread and has not exited). 0, or an errno value. */
int csock_wake_thread(unsigned long thread);
/* ppoll(2) on `fd` (< 0: none, only a wake-up ends it) with the wake signal unblocked for the call: the revents
   (> 0) when `fd` is ready, 0 when woken, -1 with errno set on failure. */
int csock_wake_poll(int fd, short events);

extern const int csock_EPOLL_CTL_ADD;
extern const int csock_EPOLL_CTL_MOD;
extern const int csock_EPOLL_CTL_DEL;
extern const uint32_t csock_EPOLLIN;
extern const uint32_t csock_EPOLLOUT;
extern const uint32_t csock_EPOLLERR;
extern const uint32_t csock_EPOLLHUP;
extern const uint32_t csock_EPOLLRDHUP;
extern const uint32_t csock_EPOLLET;
extern const uint32_t csock_EPOLLONESHOT;


#include "CSocketShimsDiag.h"

/// getaddrinfo codes hidden behind _GNU_SOURCE.
extern const int csock_EAI_NODATA;
extern const int csock_EAI_ADDRFAMILY;

/// pthread_setname_np for the calling thread (at most 15 bytes kept).
void csock_set_thread_name(const char *name);

/// sched_setaffinity of one thread (tid) to one CPU; 0 or -1 (errno set).
int csock_pin_thread(int tid, int cpu);
/// The CPU the calling thread runs on now.
int csock_current_cpu(void);

/// Installs a handler that does nothing for `sig`, WITHOUT SA_RESTART, so that a blocking call interrupted by
/// it returns EINTR. For tests of the EINTR paths.
int csock_install_interrupting_handler(int sig);
/// Unblocks `sig` for the calling thread (threads inherit the signal mask of their creator, and the
/// concurrency runtime's worker threads block most signals).
int csock_unblock_signal(int sig);
/// The calling thread's kernel thread id.
int csock_gettid(void);
/// Sends `sig` to one thread of this process (tgkill).
int csock_signal_thread(int tid, int sig);
/// How many times the interrupting handler has run.
long csock_interruptions(void);

/// pipe2(fds, O_CLOEXEC), which Glibc's module does not import.
int csock_pipe_cloexec(int fds[2]);

/// Installs SIGINT and SIGTERM handlers that write the signal number (one byte) to `fd` (a self-pipe), so a
/// thread reading the pipe can clean up outside the signal handler.
int csock_forward_signals_to(int fd);

/// Batched UDP sends. `csock_udp_gso_state()`: 1 when this kernel segments UDP (UDP_SEGMENT, "GSO"), 0 when
/// it does not, probed once on a throwaway socket; `csock_udp_gro_state()` the same for UDP_GRO.
int csock_udp_gso_state(void);
int csock_udp_gro_state(void);

/// Sends `count` datagrams, the i-th being `lengths[i]` bytes at `bases[i]`, in order, on `fd` (connected
/// unless `addr` is given), with MSG_NOSIGNAL (and MSG_DONTWAIT when `dont_wait`). Runs of equal-sized
/// datagrams go as one segmented send (UDP GSO: at most 64 segments and 65,000 bytes per call) when `gso` is
/// non-zero and the kernel has it; the rest go by sendmmsg(2). Returns how many datagrams left (the first ones);
/// -1 with errno set when not even the first went (EAGAIN when the socket buffer is full). A failure after the
/// first datagram returns the count so far: sending the rest again reports it.
int csock_send_datagrams(
    int fd, const void *const *bases, const size_t *lengths, int count, const struct sockaddr *addr,
    socklen_t addr_len, int dont_wait, int gso);

/// Receives up to `count` datagrams (at most 64) with one recvmmsg(2): the i-th into `slot` bytes at
/// `base + i * slot`, its real length in `lengths[i]` (MSG_TRUNC: larger than `slot` when it was cut), its
/// sender in the i-th `struct sockaddr_storage` at `addrs` (`addr_lens[i]` bytes). Waits for the first datagram
/// unless `dont_wait`, never for the others. Returns how many came, or -1 with errno set (EAGAIN when none is
/// there and `dont_wait`).
int csock_recv_datagrams(
    int fd, void *base, size_t slot, int count, unsigned *lengths, void *addrs, socklen_t *addr_lens, int dont_wait);

/// sizeof(struct sockaddr_storage).
size_t csock_sockaddr_storage_size(void);

/// Bytes the C allocator (glibc malloc, every arena) has handed out and not had back: mallinfo2's uordblks + hblkhd.
unsigned long long csock_heap_in_use(void);

#endif
