#ifndef SOCKETSTYLES_CURING_H
#define SOCKETSTYLES_CURING_H
/* The uring backend's door to liburing (Debian's liburing-dev). liburing.h defines _GNU_SOURCE, which changes
 * system types (fd_set's fields) under Swift's Glibc module, so it is included only in uring.c; this header
 * shows Swift opaque handles and plain integers. Each prep call fills one submission queue entry (submitting what
 * is queued first when the queue is full) and returns 0, or -EBUSY when no entry could be had. Symbols prefixed
 * csur_. */
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

struct csur_ring;

/* Sets a ring of `entries` up, asking the kernel for one-thread submission and deferred completion work, and for
 * fewer flags each time it refuses them; with sqpoll_idle_ms > 0, a kernel thread that polls the submission queue
 * instead (IORING_SETUP_SQPOLL, on CPU sqpoll_cpu when it is >= 0). NULL with *error = errno when io_uring is unavailable; *flags gets the
 * IORING_SETUP_* flags that held. */
struct csur_ring *csur_create(unsigned entries, unsigned sqpoll_idle_ms, int sqpoll_cpu, unsigned *flags, int *error);
/* Whether this kernel keeps a multishot operation armed: 0 accept (Linux 5.19), 1 recvmsg into a provided buffer
 * ring (6.0). Tried on a throwaway ring and a loopback socket that nobody reaches. */
int csur_probe_multishot(int what);
/* Whether this kernel has IORING_OP_SEND_ZC (Linux 6.0). */
int csur_probe_send_zc(void);
/* Whether this kernel takes IORING_RECVSEND_POLL_FIRST on a receive (Linux 5.19): 1 or 0. */
int csur_probe_poll_first(void);
void csur_destroy(struct csur_ring *ring);

/* Submits what is queued; with wait, sleeps until at least one completion is there; without, collects what is
 * there. Returns io_uring_enter's result (-errno on failure). */
int csur_enter(struct csur_ring *ring, int wait);

/* Up to `max` completions (at most 64): user_data, result and flags copied out and marked seen. */
unsigned csur_reap(struct csur_ring *ring, uint64_t *data, int32_t *results, uint32_t *flags, unsigned max);

/* Whether the kernel supports an operation or feature, by name: "send_zc", "recv", "accept", "cqe_skip"
 * (IOSQE_CQE_SKIP_SUCCESS, Linux 5.17). */
int csur_supports(struct csur_ring *ring, const char *feature);

int csur_prep_recv(struct csur_ring *ring, uint64_t data, int fd, void *buffer, size_t length, int flags);
int csur_prep_send(struct csur_ring *ring, uint64_t data, int fd, const void *buffer, size_t length, int flags);
int csur_prep_accept(struct csur_ring *ring, uint64_t data, int fd, void *address, socklen_t *length);
/* A multishot accept4(2) (Linux 5.19): one completion per client, with IORING_CQE_F_MORE while it stays armed; no
 * peer address (getpeername gives it). */
int csur_prep_accept_multishot(struct csur_ring *ring, uint64_t data, int fd);
/* connect(2); with timeout_ns >= 0 a linked timeout that cancels it then (its timespec written at `timespec`,
 * 16 bytes the caller keeps until the connect completes; the timeout's own completion carries `timer_data`). */
int csur_prep_connect(struct csur_ring *ring, uint64_t data, int fd, const void *address, socklen_t length,
                      int64_t timeout_ns, void *timespec, uint64_t timer_data);
/* A completion (-ETIME) after `ns`; `timespec` as above. */
int csur_prep_sleep(struct csur_ring *ring, uint64_t data, int64_t ns, void *timespec);
int csur_prep_read(struct csur_ring *ring, uint64_t data, int fd, void *buffer, unsigned length);
/* Marks the entry queued last IOSQE_IO_LINK: the next one starts when it completed in full. */
void csur_link_last(struct csur_ring *ring);
/* Makes room for `count` entries in a row (submitting what is queued when needed), so that a linked chain is
 * submitted whole: 0, or -EBUSY. */
int csur_reserve(struct csur_ring *ring, unsigned count);
/* Marks the receive or send queued last IORING_RECVSEND_POLL_FIRST (Linux 5.19): the kernel waits for the socket
 * to be ready before the first attempt instead of trying at once (for a receive that cannot find data yet). */
void csur_poll_first_last(struct csur_ring *ring);
/* Marks the entry queued last IOSQE_CQE_SKIP_SUCCESS: it posts a completion only when it fails. */
void csur_skip_success_last(struct csur_ring *ring);
/* Cancels the operation whose user_data is `target`. */
int csur_prep_cancel(struct csur_ring *ring, uint64_t data, uint64_t target);
/* Cancels every operation on `fd`. */
int csur_prep_cancel_fd(struct csur_ring *ring, uint64_t data, int fd);

/* A message header with its iovec and room for an address, for recvmsg/sendmsg on an unconnected UDP socket. */
struct csur_message;
struct csur_message *csur_message_create(void);
void csur_message_destroy(struct csur_message *message);
/* Points it at `length` bytes at `base`; for a send, at a copy of the destination `address`. */
void csur_message_prepare(struct csur_message *message, void *base, size_t length, const void *address,
                          socklen_t address_length);
/* After a recvmsg: the sender's address and its length; whether the datagram was cut to fit. */
const void *csur_message_address(const struct csur_message *message, socklen_t *length);
int csur_message_truncated(const struct csur_message *message);
int csur_prep_recvmsg(struct csur_ring *ring, uint64_t data, int fd, struct csur_message *message);
int csur_prep_sendmsg(struct csur_ring *ring, uint64_t data, int fd, const struct csur_message *message, int flags);

/* Datagrams of one size (the last may be shorter) as one sendmsg that the kernel cuts into datagrams (UDP GSO,
 * UDP_SEGMENT), on a connected UDP socket: up to 64 of them, 65,000 bytes in all. Kept until the send completes. */
struct csur_segmented;
struct csur_segmented *csur_segmented_create(void);
void csur_segmented_destroy(struct csur_segmented *segmented);
/* Points it at `count` datagrams; `segment` is the size of each but the last. */
void csur_segmented_prepare(struct csur_segmented *segmented, const void *const *bases, const size_t *lengths,
                            unsigned count, uint16_t segment);
int csur_prep_send_segmented(struct csur_ring *ring, uint64_t data, int fd, struct csur_segmented *segmented);

/* A provided buffer ring (IORING_REGISTER_PBUF_RING): `count` buffers of `size` bytes the kernel picks from for
 * operations of buffer group `group`. NULL with *error = errno when the kernel has none (before 5.19). */
struct csur_buffers;
struct csur_buffers *csur_buffers_create(struct csur_ring *ring, unsigned short group, unsigned count, size_t size,
                                         int *error);
/* Unregisters and frees; call once no operation of the group is in flight. */
void csur_buffers_destroy(struct csur_ring *ring, struct csur_buffers *buffers);
/* Gives buffer `id` back to the kernel. */
void csur_buffers_recycle(struct csur_buffers *buffers, unsigned id);
/* Where buffer `id` of `buffers` starts. */
const void *csur_buffers_address(struct csur_buffers *buffers, unsigned id);
/* recv(2) of at most `length` bytes into a buffer the kernel picks from `buffers` once data is there
 * (IOSQE_BUFFER_SELECT): no buffer is held while the socket has nothing to read. The completion's flags carry the
 * buffer id (csur_buffer_id), which must be recycled. */
int csur_prep_recv_select(struct csur_ring *ring, uint64_t data, int fd, size_t length, struct csur_buffers *buffers);
/* The buffer id of a completion's flags (IORING_CQE_F_BUFFER), or -1. */
int csur_buffer_id(uint32_t flags);
/* Whether a completion's flags say more completions follow (IORING_CQE_F_MORE). */
int csur_more(uint32_t flags);
/* Whether a completion is a zero-copy send's notification: the kernel is done with the buffer (IORING_CQE_F_NOTIF). */
int csur_notification(uint32_t flags);
/* send(2) with zero copy (IORING_OP_SEND_ZC, Linux 6.0): the kernel reads the buffer while it transmits; a first
 * completion gives the count sent (with IORING_CQE_F_MORE when a notification follows), the notification, with the
 * same data, says the buffer may be reused. */
int csur_prep_send_zc(struct csur_ring *ring, uint64_t data, int fd, const void *buffer, size_t length, int flags);

/* Multishot recvmsg on an unconnected UDP socket (kernel 6.0+): each datagram completes with `data`, in a buffer
 * of `buffers` that holds the sender's address and the payload, until it is cancelled or runs out of buffers. */
int csur_prep_recvmsg_multishot(struct csur_ring *ring, uint64_t data, int fd, struct csur_buffers *buffers);
/* A multishot recvmsg's completion (`result` bytes in buffer `id`): where the sender's address and the payload lie,
 * and whether the datagram was cut to fit. 0, or -EINVAL when the result does not hold a header. */
int csur_recvmsg_parse(struct csur_buffers *buffers, unsigned id, int32_t result, const void **address,
                       socklen_t *address_length, const void **payload, size_t *payload_length, int *truncated);

#endif
