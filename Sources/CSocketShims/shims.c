#define _GNU_SOURCE
#include "CSocketShims.h"
#include <errno.h>
#include <string.h>
#include <unistd.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <netdb.h>
#include <pthread.h>
#include <sched.h>
#include <malloc.h>
#include <signal.h>
#include <sys/syscall.h>
#include <stdatomic.h>

int csock_accept4(int fd, struct sockaddr *addr, socklen_t *len, int nonblocking) {
    return accept4(fd, addr, len, SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0));
}

const char *csock_errno_name(int code) { return strerrorname_np(code); }

int csock_epoll_create(void) { return epoll_create1(EPOLL_CLOEXEC); }

int csock_epoll_ctl(int epfd, int op, int fd, uint32_t events, uint64_t data) {
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = events;
    ev.data.u64 = data;
    return epoll_ctl(epfd, op, fd, &ev);
}

int csock_epoll_wait(int epfd, uint32_t *events, uint64_t *datas, int max, int timeout_ms) {
    struct epoll_event evs[256];
    if (max > 256) max = 256;
    int n = epoll_wait(epfd, evs, max, timeout_ms);
    for (int i = 0; i < n; i++) {
        events[i] = evs[i].events;
        datas[i] = evs[i].data.u64;
    }
    return n;
}

int csock_eventfd(void) { return eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK); }

int csock_eventfd_signal(int fd) {
    uint64_t one = 1;
    ssize_t n;
    do { n = write(fd, &one, sizeof one); } while (n < 0 && errno == EINTR);
    return n == sizeof one || (n < 0 && errno == EAGAIN) ? 0 : -1;
}

int csock_eventfd_drain(int fd) {
    uint64_t value;
    ssize_t n;
    do { n = read(fd, &value, sizeof value); } while (n < 0 && errno == EINTR);
    return n == sizeof value || (n < 0 && errno == EAGAIN) ? 0 : -1;
}

int csock_wait_readable_ns(int fd, long long seconds, long nanoseconds) {
    struct pollfd watched = {.fd = fd, .events = POLLIN, .revents = 0};
    struct timespec timeout = {.tv_sec = (time_t)seconds, .tv_nsec = nanoseconds};
    int n = ppoll(&watched, 1, &timeout, NULL);
    return n > 0 && watched.revents != 0 ? 1 : 0;
}

static void csock_wake_handler(int signal) { (void)signal; }
static pthread_once_t csock_wake_once = PTHREAD_ONCE_INIT;
static int csock_wake_signal;
/* The calling thread's signal mask with the wake signal taken out: what ppoll(2) waits with. */
static __thread sigset_t csock_wake_wait_mask;
static __thread int csock_wake_prepared;

static void csock_wake_install(void) {
    csock_wake_signal = SIGRTMIN + 3;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = csock_wake_handler;
    sigemptyset(&action.sa_mask);
    sigaction(csock_wake_signal, &action, NULL);
}

void csock_wake_prepare_thread(void) {
    if (csock_wake_prepared) return;
    pthread_once(&csock_wake_once, csock_wake_install);
    sigset_t blocked;
    sigemptyset(&blocked);
    sigaddset(&blocked, csock_wake_signal);
    sigset_t before;
    pthread_sigmask(SIG_BLOCK, &blocked, &before);
    sigdelset(&before, csock_wake_signal);
    csock_wake_wait_mask = before;
    csock_wake_prepared = 1;
}

unsigned long csock_thread_self(void) { return (unsigned long)pthread_self(); }

int csock_wake_thread(unsigned long thread) {
    pthread_once(&csock_wake_once, csock_wake_install);
    return pthread_kill((pthread_t)thread, csock_wake_signal);
}

int csock_wake_poll(int fd, short events) {
    csock_wake_prepare_thread();
    struct pollfd watched = {.fd = fd, .events = events, .revents = 0};
    int n = ppoll(&watched, 1, NULL, &csock_wake_wait_mask);
    if (n < 0) return errno == EINTR ? 0 : -1;
    return n == 0 ? 0 : watched.revents;
}

const int csock_EPOLL_CTL_ADD = EPOLL_CTL_ADD;
const int csock_EPOLL_CTL_MOD = EPOLL_CTL_MOD;
const int csock_EPOLL_CTL_DEL = EPOLL_CTL_DEL;
const uint32_t csock_EPOLLIN = EPOLLIN;
const uint32_t csock_EPOLLOUT = EPOLLOUT;
const uint32_t csock_EPOLLERR = EPOLLERR;
const uint32_t csock_EPOLLHUP = EPOLLHUP;
const uint32_t csock_EPOLLRDHUP = EPOLLRDHUP;
const uint32_t csock_EPOLLET = EPOLLET;
const uint32_t csock_EPOLLONESHOT = EPOLLONESHOT;

const int csock_EAI_NODATA = EAI_NODATA;
const int csock_EAI_ADDRFAMILY = EAI_ADDRFAMILY;

void csock_set_thread_name(const char *name) {
    char buffer[16];
    strncpy(buffer, name, 15);
    buffer[15] = 0;
    pthread_setname_np(pthread_self(), buffer);
}

int csock_pin_thread(int tid, int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return sched_setaffinity(tid, sizeof set, &set);
}

int csock_current_cpu(void) { return sched_getcpu(); }

static atomic_long interruptions;

static void csock_noop_handler(int sig) {
    (void)sig;
    atomic_fetch_add(&interruptions, 1);
}

int csock_install_interrupting_handler(int sig) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = csock_noop_handler;
    sigemptyset(&action.sa_mask);
    action.sa_flags = 0; /* no SA_RESTART: interrupted calls fail with EINTR */
    return sigaction(sig, &action, NULL);
}

int csock_gettid(void) { return (int)syscall(SYS_gettid); }

int csock_signal_thread(int tid, int sig) { return (int)syscall(SYS_tgkill, getpid(), tid, sig); }

long csock_interruptions(void) { return atomic_load(&interruptions); }

int csock_unblock_signal(int sig) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    return pthread_sigmask(SIG_UNBLOCK, &set, NULL);
}

#include <fcntl.h>
int csock_pipe_cloexec(int fds[2]) { return pipe2(fds, O_CLOEXEC); }

static volatile int forward_fd = -1;

static void csock_forward_signal(int sig) {
    unsigned char byte = (unsigned char)sig;
    if (forward_fd >= 0) { ssize_t ignored = write(forward_fd, &byte, 1); (void)ignored; }
}

int csock_forward_signals_to(int fd) {
    forward_fd = fd;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = csock_forward_signal;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGINT, &action, NULL) != 0) return -1;
    return sigaction(SIGTERM, &action, NULL);
}

#include <netinet/udp.h>
#include <sys/uio.h>
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

static atomic_int gso_state = -1;  // -1 not probed yet, 0 absent, 1 present
static atomic_int gro_state = -1;

static int probe_udp_option(int option) {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    int value = option == UDP_SEGMENT ? 1400 : 1;
    int ok = setsockopt(fd, IPPROTO_UDP, option, &value, sizeof value) == 0;
    close(fd);
    return ok;
}

/// The probe's answer for `option`, found once and kept in `state`.
static int cached_probe(atomic_int *state, int option) {
    int value = atomic_load(state);
    if (value < 0) {
        value = probe_udp_option(option);
        atomic_store(state, value);
    }
    return value;
}

int csock_udp_gso_state(void) { return cached_probe(&gso_state, UDP_SEGMENT); }

int csock_udp_gro_state(void) { return cached_probe(&gro_state, UDP_GRO); }

enum { batch_limit = 64, gso_bytes_limit = 65000 };

/// One segmented sendmsg of datagrams [first, first + n): all `lengths[first]` bytes but the last (which may
/// be shorter). Returns 0 or -1 (errno set).
static int send_segmented(
    int fd, const void *const *bases, const size_t *lengths, int first, int n, const struct sockaddr *addr,
    socklen_t addr_len, int flags) {
    struct iovec iov[batch_limit];
    for (int i = 0; i < n; i++) {
        iov[i].iov_base = (void *)bases[first + i];
        iov[i].iov_len = lengths[first + i];
    }
    union {
        char buffer[CMSG_SPACE(sizeof(uint16_t))];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr message;
    memset(&message, 0, sizeof message);
    message.msg_name = (void *)addr;
    message.msg_namelen = addr ? addr_len : 0;
    message.msg_iov = iov;
    message.msg_iovlen = (size_t)n;
    message.msg_control = control.buffer;
    message.msg_controllen = sizeof control.buffer;
    struct cmsghdr *header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = IPPROTO_UDP;
    header->cmsg_type = UDP_SEGMENT;
    header->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    uint16_t segment = (uint16_t)lengths[first];
    memcpy(CMSG_DATA(header), &segment, sizeof segment);
    ssize_t sent;
    do { sent = sendmsg(fd, &message, flags); } while (sent < 0 && errno == EINTR);
    return sent < 0 ? -1 : 0;
}

/// sendmmsg of datagrams [first, first + n), n <= batch_limit. Returns how many went, or -1 (errno set).
static int send_each(
    int fd, const void *const *bases, const size_t *lengths, int first, int n, const struct sockaddr *addr,
    socklen_t addr_len, int flags) {
    struct iovec iov[batch_limit];
    struct mmsghdr messages[batch_limit];
    memset(messages, 0, sizeof(struct mmsghdr) * (size_t)n);
    for (int i = 0; i < n; i++) {
        iov[i].iov_base = (void *)bases[first + i];
        iov[i].iov_len = lengths[first + i];
        messages[i].msg_hdr.msg_iov = &iov[i];
        messages[i].msg_hdr.msg_iovlen = 1;
        messages[i].msg_hdr.msg_name = (void *)addr;
        messages[i].msg_hdr.msg_namelen = addr ? addr_len : 0;
    }
    int sent;
    do { sent = sendmmsg(fd, messages, (unsigned)n, flags); } while (sent < 0 && errno == EINTR);
    return sent;
}

int csock_send_datagrams(
    int fd, const void *const *bases, const size_t *lengths, int count, const struct sockaddr *addr,
    socklen_t addr_len, int dont_wait, int gso) {
    int flags = MSG_NOSIGNAL | (dont_wait ? MSG_DONTWAIT : 0);
    int done = 0;
    while (done < count) {
        // The run of datagrams that can go as one segmented send: equal sizes, the last may be shorter.
        int run = 1;
        if (gso && csock_udp_gso_state() == 1 && lengths[done] > 0) {
            size_t size = lengths[done], total = size;
            // An empty datagram cannot be a segment (it would add no bytes): it ends the run.
            while (done + run < count && run < batch_limit && lengths[done + run] > 0 && lengths[done + run] <= size
                   && total + lengths[done + run] <= gso_bytes_limit) {
                total += lengths[done + run];
                run++;
                if (lengths[done + run - 1] < size) break;
            }
        }
        int result;
        if (run > 1) {
            result = send_segmented(fd, bases, lengths, done, run, addr, addr_len, flags);
            if (result < 0 && (errno == EIO || errno == EINVAL || errno == ENOPROTOOPT || errno == EOPNOTSUPP)) {
                // This socket's route cannot segment (no checksum offload, say): send these one by one.
                result = send_each(fd, bases, lengths, done, run, addr, addr_len, flags);
                if (result >= 0) { done += result; if (result < run) return done; continue; }
            } else if (result == 0) {
                done += run;
                continue;
            }
        } else {
            int n = count - done < batch_limit ? count - done : batch_limit;
            if (gso && csock_udp_gso_state() == 1) n = 1;  // the next datagram starts a run of its own
            result = send_each(fd, bases, lengths, done, n, addr, addr_len, flags);
            if (result >= 0) { done += result; if (result < n) return done; continue; }
        }
        return done > 0 ? done : -1;
    }
    return done;
}

size_t csock_sockaddr_storage_size(void) { return sizeof(struct sockaddr_storage); }

int csock_recv_datagrams(
    int fd, void *base, size_t slot, int count, unsigned *lengths, void *addrs, socklen_t *addr_lens, int dont_wait) {
    enum { receive_limit = 64 };
    if (count > receive_limit) count = receive_limit;
    struct iovec iov[receive_limit];
    struct mmsghdr messages[receive_limit];
    memset(messages, 0, sizeof(struct mmsghdr) * (size_t)count);
    for (int i = 0; i < count; i++) {
        iov[i].iov_base = (char *)base + (size_t)i * slot;
        iov[i].iov_len = slot;
        messages[i].msg_hdr.msg_iov = &iov[i];
        messages[i].msg_hdr.msg_iovlen = 1;
        messages[i].msg_hdr.msg_name = (struct sockaddr_storage *)addrs + i;
        messages[i].msg_hdr.msg_namelen = sizeof(struct sockaddr_storage);
    }
    // MSG_TRUNC: each msg_len is the datagram's real length, so a cut one shows.
    int flags = MSG_TRUNC | (dont_wait ? MSG_DONTWAIT : MSG_WAITFORONE);
    int received;
    do { received = recvmmsg(fd, messages, (unsigned)count, flags, NULL); } while (received < 0 && errno == EINTR);
    for (int i = 0; i < received; i++) {
        lengths[i] = messages[i].msg_len;
        addr_lens[i] = messages[i].msg_hdr.msg_namelen;
    }
    return received;
}

unsigned long long csock_heap_in_use(void) {
    struct mallinfo2 info = mallinfo2();
    return (unsigned long long)info.uordblks + (unsigned long long)info.hblkhd;
}
