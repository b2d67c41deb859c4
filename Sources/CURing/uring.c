#include "CURing.h"

#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

struct csur_ring {
    struct io_uring ring;
};

struct csur_message {
    struct msghdr header;
    struct iovec vector;
    struct sockaddr_storage address;
};

struct csur_ring *csur_create(unsigned entries, unsigned sqpoll_idle_ms, int sqpoll_cpu, unsigned *flags, int *error) {
    const unsigned plain[] = {
        IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
        IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN,
        0,
    };
    /* A kernel thread that polls the submission queue: the kernel refuses DEFER_TASKRUN beside it. */
    const unsigned polled[] = {
        IORING_SETUP_SQPOLL | IORING_SETUP_SUBMIT_ALL | IORING_SETUP_SINGLE_ISSUER,
        IORING_SETUP_SQPOLL | IORING_SETUP_SUBMIT_ALL,
        IORING_SETUP_SQPOLL,
    };
    const unsigned *tries = sqpoll_idle_ms > 0 ? polled : plain;
    struct csur_ring *ring = calloc(1, sizeof *ring);
    if (!ring) {
        *error = ENOMEM;
        return NULL;
    }
    int result = -EINVAL;
    for (unsigned index = 0; index < 3; index++) {
        struct io_uring_params params;
        memset(&params, 0, sizeof params);
        params.flags = tries[index] | IORING_SETUP_CQSIZE;
        params.cq_entries = entries * 4;
        params.sq_thread_idle = sqpoll_idle_ms;
        if (sqpoll_idle_ms > 0 && sqpoll_cpu >= 0) {
            params.flags |= IORING_SETUP_SQ_AFF;
            params.sq_thread_cpu = (unsigned)sqpoll_cpu;
        }
        result = io_uring_queue_init_params(entries, &ring->ring, &params);
        if (result == 0) {
            *flags = tries[index];
            /* Each io_uring_enter then names the ring by its registered index, without looking up its descriptor
               (liburing passes IORING_ENTER_REGISTERED_RING; Linux 5.18). Where that fails, enters look it up. */
            io_uring_register_ring_fd(&ring->ring);
            return ring;
        }
        if (result != -EINVAL) break;
    }
    free(ring);
    *error = -result;
    return NULL;
}

void csur_destroy(struct csur_ring *ring) {
    io_uring_queue_exit(&ring->ring);
    free(ring);
}

int csur_enter(struct csur_ring *ring, int wait) {
    return wait ? io_uring_submit_and_wait(&ring->ring, 1) : io_uring_submit_and_get_events(&ring->ring);
}

unsigned csur_reap(struct csur_ring *ring, uint64_t *data, int32_t *results, uint32_t *flags, unsigned max) {
    struct io_uring_cqe *cqes[64];
    if (max > 64) max = 64;
    unsigned count = io_uring_peek_batch_cqe(&ring->ring, cqes, max);
    for (unsigned index = 0; index < count; index++) {
        data[index] = cqes[index]->user_data;
        results[index] = cqes[index]->res;
        flags[index] = cqes[index]->flags;
    }
    io_uring_cq_advance(&ring->ring, count);
    return count;
}

int csur_supports(struct csur_ring *ring, const char *feature) {
    struct io_uring_probe *probe = io_uring_get_probe_ring(&ring->ring);
    if (!probe) return 0;
    int supported = 0;
    if (strcmp(feature, "send_zc") == 0) supported = io_uring_opcode_supported(probe, IORING_OP_SEND_ZC);
    else if (strcmp(feature, "recv") == 0) supported = io_uring_opcode_supported(probe, IORING_OP_RECV);
    else if (strcmp(feature, "accept") == 0) supported = io_uring_opcode_supported(probe, IORING_OP_ACCEPT);
    else if (strcmp(feature, "cqe_skip") == 0) supported = (ring->ring.features & IORING_FEAT_CQE_SKIP) != 0;
    io_uring_free_probe(probe);
    return supported;
}

static struct io_uring_sqe *entry(struct csur_ring *ring, uint64_t data) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ring->ring);
    if (!sqe) {
        if (io_uring_submit(&ring->ring) < 0) return NULL;
        sqe = io_uring_get_sqe(&ring->ring);
        if (!sqe) return NULL;
    }
    io_uring_sqe_set_data64(sqe, data);
    return sqe;
}

static void set_time(void *timespec, int64_t ns) {
    struct __kernel_timespec *time = timespec;
    if (ns < 0) ns = 0;
    time->tv_sec = ns / 1000000000;
    time->tv_nsec = ns % 1000000000;
}

int csur_prep_recv(struct csur_ring *ring, uint64_t data, int fd, void *buffer, size_t length, int flags) {
    struct io_uring_sqe *sqe = entry(ring, data);
    if (!sqe) return -EBUSY;
    io_uring_prep_recv(sqe, fd, buffer, length, flags);
    return 0;
}

int csur_prep_send(struct csur_ring *ring, uint64_t data, int fd, const void *buffer, size_t length, int flags) {
    struct io_uring_sqe *sqe = entry(ring, data);
    if (!sqe) return -EBUSY;
    io_uring_prep_send(sqe, fd, buffer, length, flags);
    return 0;
}

int csur_prep_accept(struct csur_ring *ring, uint64_t data, int fd, void *address, socklen_t *length) {
    struct io_uring_sqe *sqe = entry(ring, data);
    if (!sqe) return -EBUSY;
    io_uring_prep_accept(sqe, fd, address, length, SOCK_CLOEXEC);
    return 0;
}

int csur_prep_accept_multishot(struct csur_ring *ring, uint64_t data, int fd) {
    struct io_uring_sqe *sqe = entry(ring, data);
    if (!sqe) return -EBUSY;
    io_uring_prep_multishot_accept(sqe, fd, NULL, NULL, SOCK_CLOEXEC);
    return 0;
}

int csur_prep_connect(struct csur_ring *ring, uint64_t data, int fd, const void *address, socklen_t length,
                      int64_t timeout_ns, void *timespec, uint64_t timer_data) {
    /* Both entries or neither: a connect whose timeout could not be queued would wait without bound. */
    if (timeout_ns >= 0 && io_uring_sq_space_left(&ring->ring) < 2 && io_uring_submit(&ring->ring) < 0) return -EBUSY;
    struct io_uring_sqe *sqe = entry(ring, data);
    if (!sqe) return -EBUSY;
    io_uring_prep_connect(sqe, fd, address, length);
    if (timeout_ns < 0) return 0;
    sqe->flags |= IOSQE_IO_LINK;
    struct io_uring_sqe *timer = io_uring_get_sqe(&ring->ring);
    set_time(timespec, timeout_ns);
    io_uring_prep_link_timeout(timer, timespec, 0);
    io_uring_sqe_set_data64(timer, timer_data);
    return 0;
}

int csur_prep_sleep(struct csur_ring *ring, uint64_t data, int64_t ns, void *timespec) {
    struct io_uring_sqe *sqe = entry(ring, data);
    if (!sqe) return -EBUSY;
    set_time(timespec, ns);
    io_uring_prep_timeout(sqe, timespec, 0, 0);
    return 0;
}

int csur_prep_read(struct csur_ring *ring, uint64_t data, int fd, void *buffer, unsigned length) {
    struct io_uring_sqe *sqe = entry(ring, data);
    if (!sqe) return -EBUSY;
    io_uring_prep_read(sqe, fd, buffer, length, 0);
    return 0;
}

/* The entry queued last (not yet submitted). */
static struct io_uring_sqe *last_entry(struct csur_ring *ring) {
    struct io_uring *uring = &ring->ring;
    return &uring->sq.sqes[(uring->sq.sqe_tail - 1) & uring->sq.ring_mask];
}

void csur_link_last(struct csur_ring *ring) { last_entry(ring)->flags |= IOSQE_IO_LINK; }

int csur_reserve(struct csur_ring *ring, unsigned count) {
    if (io_uring_sq_space_left(&ring->ring) >= count) return 0;
    int submitted = io_uring_submit(&ring->ring);
    if (submitted < 0) return submitted;
    return io_uring_sq_space_left(&ring->ring) >= count ? 0 : -EBUSY;
}

void csur_poll_first_last(struct csur_ring *ring) { last_entry(ring)->ioprio |= IORING_RECVSEND_POLL_FIRST; }

void csur_skip_success_last(struct csur_ring *ring) { last_entry(ring)->flags |= IOSQE_CQE_SKIP_SUCCESS; }

int csur_prep_cancel(struct csur_ring *ring, uint64_t data, uint64_t target) {
    struct io_uring_sqe *sqe = entry(ring, data);
    if (!sqe) return -EBUSY;
    io_uring_prep_cancel64(sqe, target, 0);
    io_uring_sqe_set_data64(sqe, data);
    return 0;
}

int csur_prep_cancel_fd(struct csur_ring *ring, uint64_t data, int fd) {
    struct io_uring_sqe *sqe = entry(ring, data);
    if (!sqe) return -EBUSY;
    io_uring_prep_cancel_fd(sqe, fd, IORING_ASYNC_CANCEL_ALL);
    io_uring_sqe_set_data64(sqe, data);
    return 0;
}

struct csur_message *csur_message_create(void) { return calloc(1, sizeof(struct csur_message)); }

void csur_message_destroy(struct csur_message *message) { free(message); }

void csur_message_prepare(struct csur_message *message, void *base, size_t length, const void *address,
                          socklen_t address_length) {
    memset(&message->header, 0, sizeof message->header);
    message->vector.iov_base = base;
    message->vector.iov_len = length;
    message->header.msg_iov = &message->vector;
    message->header.msg_iovlen = 1;
    message->header.msg_name = &message->address;
    if (address && address_length <= sizeof message->address) {
        memcpy(&message->address, address, address_length);
        message->header.msg_namelen = address_length;
    } else {
        message->header.msg_namelen = sizeof message->address;
    }
}

const void *csur_message_address(const struct csur_message *message, socklen_t *length) {
    *length = message->header.msg_namelen;
    return &message->address;
}

int csur_message_truncated(const struct csur_message *message) { return (message->header.msg_flags & MSG_TRUNC) != 0; }

int csur_prep_recvmsg(struct csur_ring *ring, uint64_t data, int fd, struct csur_message *message) {
    struct io_uring_sqe *sqe = entry(ring, data);
    if (!sqe) return -EBUSY;
    io_uring_prep_recvmsg(sqe, fd, &message->header, 0);
    return 0;
}

int csur_prep_sendmsg(struct csur_ring *ring, uint64_t data, int fd, const struct csur_message *message, int flags) {
    struct io_uring_sqe *sqe = entry(ring, data);
    if (!sqe) return -EBUSY;
    io_uring_prep_sendmsg(sqe, fd, &message->header, (unsigned)flags);
    return 0;
}

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif

struct csur_segmented {
    struct msghdr header;
    struct iovec vectors[64];
    union {
        char buffer[CMSG_SPACE(sizeof(uint16_t))];
        struct cmsghdr align;
    } control;
};

struct csur_segmented *csur_segmented_create(void) { return calloc(1, sizeof(struct csur_segmented)); }

void csur_segmented_destroy(struct csur_segmented *segmented) { free(segmented); }

void csur_segmented_prepare(struct csur_segmented *segmented, const void *const *bases, const size_t *lengths,
                            unsigned count, uint16_t segment) {
    if (count > 64) count = 64;
    for (unsigned index = 0; index < count; index++) {
        segmented->vectors[index].iov_base = (void *)bases[index];
        segmented->vectors[index].iov_len = lengths[index];
    }
    memset(&segmented->header, 0, sizeof segmented->header);
    memset(&segmented->control, 0, sizeof segmented->control);
    segmented->header.msg_iov = segmented->vectors;
    segmented->header.msg_iovlen = count;
    segmented->header.msg_control = segmented->control.buffer;
    segmented->header.msg_controllen = sizeof segmented->control.buffer;
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&segmented->header);
    cmsg->cmsg_level = IPPROTO_UDP;
    cmsg->cmsg_type = UDP_SEGMENT;
    cmsg->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    memcpy(CMSG_DATA(cmsg), &segment, sizeof segment);
}

int csur_prep_send_segmented(struct csur_ring *ring, uint64_t data, int fd, struct csur_segmented *segmented) {
    struct io_uring_sqe *sqe = entry(ring, data);
    if (!sqe) return -EBUSY;
    io_uring_prep_sendmsg(sqe, fd, &segmented->header, MSG_NOSIGNAL);
    return 0;
}

struct csur_buffers {
    struct io_uring_buf_ring *ring;
    unsigned char *memory;
    unsigned count;
    size_t size;
    unsigned short group;
    struct msghdr template;
};

struct csur_buffers *csur_buffers_create(struct csur_ring *ring, unsigned short group, unsigned count, size_t size,
                                         int *error) {
    struct csur_buffers *buffers = calloc(1, sizeof *buffers);
    if (!buffers) {
        *error = ENOMEM;
        return NULL;
    }
    void *ring_memory = NULL;
    if (posix_memalign(&ring_memory, 4096, count * sizeof(struct io_uring_buf)) != 0) {
        free(buffers);
        *error = ENOMEM;
        return NULL;
    }
    memset(ring_memory, 0, count * sizeof(struct io_uring_buf));
    buffers->ring = ring_memory;
    buffers->memory = malloc(count * size);
    if (!buffers->memory) {
        free(ring_memory);
        free(buffers);
        *error = ENOMEM;
        return NULL;
    }
    buffers->count = count;
    buffers->size = size;
    buffers->group = group;
    struct io_uring_buf_reg registration;
    memset(&registration, 0, sizeof registration);
    registration.ring_addr = (unsigned long)ring_memory;
    registration.ring_entries = count;
    registration.bgid = group;
    int result = io_uring_register_buf_ring(&ring->ring, &registration, 0);
    if (result != 0) {
        free(buffers->memory);
        free(ring_memory);
        free(buffers);
        *error = -result;
        return NULL;
    }
    io_uring_buf_ring_init(buffers->ring);
    for (unsigned id = 0; id < count; id++) {
        io_uring_buf_ring_add(buffers->ring, buffers->memory + id * size, size, id, io_uring_buf_ring_mask(count), id);
    }
    io_uring_buf_ring_advance(buffers->ring, count);
    memset(&buffers->template, 0, sizeof buffers->template);
    buffers->template.msg_namelen = sizeof(struct sockaddr_storage);
    return buffers;
}

void csur_buffers_destroy(struct csur_ring *ring, struct csur_buffers *buffers) {
    io_uring_unregister_buf_ring(&ring->ring, buffers->group);
    free(buffers->memory);
    free(buffers->ring);
    free(buffers);
}

void csur_buffers_recycle(struct csur_buffers *buffers, unsigned id) {
    io_uring_buf_ring_add(buffers->ring, buffers->memory + id * buffers->size, buffers->size, id,
                          io_uring_buf_ring_mask(buffers->count), 0);
    io_uring_buf_ring_advance(buffers->ring, 1);
}

const void *csur_buffers_address(struct csur_buffers *buffers, unsigned id) {
    return buffers->memory + (size_t)id * buffers->size;
}

int csur_prep_recv_select(struct csur_ring *ring, uint64_t data, int fd, size_t length, struct csur_buffers *buffers) {
    struct io_uring_sqe *sqe = entry(ring, data);
    if (!sqe) return -EBUSY;
    io_uring_prep_recv(sqe, fd, NULL, length < buffers->size ? length : buffers->size, 0);
    sqe->flags |= IOSQE_BUFFER_SELECT;
    sqe->buf_group = buffers->group;
    return 0;
}

int csur_buffer_id(uint32_t flags) {
    return (flags & IORING_CQE_F_BUFFER) ? (int)(flags >> IORING_CQE_BUFFER_SHIFT) : -1;
}

int csur_more(uint32_t flags) { return (flags & IORING_CQE_F_MORE) != 0; }

int csur_notification(uint32_t flags) { return (flags & IORING_CQE_F_NOTIF) != 0; }

int csur_prep_send_zc(struct csur_ring *ring, uint64_t data, int fd, const void *buffer, size_t length, int flags) {
    struct io_uring_sqe *sqe = entry(ring, data);
    if (!sqe) return -EBUSY;
    io_uring_prep_send_zc(sqe, fd, buffer, length, flags, 0);
    return 0;
}

int csur_prep_recvmsg_multishot(struct csur_ring *ring, uint64_t data, int fd, struct csur_buffers *buffers) {
    struct io_uring_sqe *sqe = entry(ring, data);
    if (!sqe) return -EBUSY;
    io_uring_prep_recvmsg_multishot(sqe, fd, &buffers->template, MSG_TRUNC);
    sqe->flags |= IOSQE_BUFFER_SELECT;
    sqe->buf_group = buffers->group;
    return 0;
}

int csur_recvmsg_parse(struct csur_buffers *buffers, unsigned id, int32_t result, const void **address,
                       socklen_t *address_length, const void **payload, size_t *payload_length, int *truncated) {
    if (id >= buffers->count) return -EINVAL;
    struct io_uring_recvmsg_out *out =
        io_uring_recvmsg_validate(buffers->memory + id * buffers->size, result, &buffers->template);
    if (!out) return -EINVAL;
    *address = io_uring_recvmsg_name(out);
    *address_length = out->namelen > sizeof(struct sockaddr_storage) ? sizeof(struct sockaddr_storage) : out->namelen;
    *payload = io_uring_recvmsg_payload(out, &buffers->template);
    *payload_length = io_uring_recvmsg_payload_length(out, result, &buffers->template);
    *truncated = (out->flags & MSG_TRUNC) != 0;
    return 0;
}

/* For the probes: a socket bound to a loopback port nobody reaches (listening, when a stream), or -1. */
static int probe_socket(int stream) {
    int fd = socket(AF_INET, (stream ? SOCK_STREAM : SOCK_DGRAM) | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in address;
    memset(&address, 0, sizeof address);
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&address, sizeof address) != 0 || (stream && listen(fd, 1) != 0)) {
        close(fd);
        return -1;
    }
    return fd;
}

int csur_probe_multishot(int what) {
    struct csur_ring ring;
    if (io_uring_queue_init(4, &ring.ring, 0) != 0) return 0;
    int stream = what == 0;
    int fd = probe_socket(stream);
    int supported = 0;
    struct csur_buffers *buffers = NULL;
    struct msghdr template;
    memset(&template, 0, sizeof template);
    if (fd < 0) goto done;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ring.ring);
    if (stream) {
        io_uring_prep_multishot_accept(sqe, fd, NULL, NULL, SOCK_CLOEXEC);
    } else {
        int code = 0;
        buffers = csur_buffers_create(&ring, 1, 1, 256, &code);
        if (!buffers) goto done;
        io_uring_prep_recvmsg_multishot(sqe, fd, &template, 0);
        sqe->flags |= IOSQE_BUFFER_SELECT;
        sqe->buf_group = 1;
    }
    if (io_uring_submit(&ring.ring) != 1) goto done;
    /* A kernel without it refuses the entry at once; one with it keeps waiting for a client or a datagram. */
    struct io_uring_cqe *cqe = NULL;
    supported = io_uring_peek_cqe(&ring.ring, &cqe) != 0 || cqe->res != -EINVAL;
done:
    io_uring_queue_exit(&ring.ring);
    if (buffers) {
        free(buffers->memory);
        free(buffers->ring);
        free(buffers);
    }
    if (fd >= 0) close(fd);
    return supported;
}

int csur_probe_send_zc(void) {
    struct io_uring ring;
    if (io_uring_queue_init(2, &ring, 0) != 0) return 0;
    struct io_uring_probe *probe = io_uring_get_probe_ring(&ring);
    int supported = probe && io_uring_opcode_supported(probe, IORING_OP_SEND_ZC);
    if (probe) io_uring_free_probe(probe);
    io_uring_queue_exit(&ring);
    return supported;
}

int csur_probe_poll_first(void) {
    struct io_uring ring;
    if (io_uring_queue_init(2, &ring, 0) != 0) return 0;
    int fd = probe_socket(0);
    int supported = 0;
    char byte;
    if (fd < 0) goto done;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
    io_uring_prep_recv(sqe, fd, &byte, 1, 0);
    sqe->ioprio |= IORING_RECVSEND_POLL_FIRST;
    if (io_uring_submit(&ring) != 1) goto done;
    /* A kernel without the flag refuses the entry at once; one with it waits for a datagram nobody sends. */
    struct io_uring_cqe *cqe = NULL;
    supported = io_uring_peek_cqe(&ring, &cqe) != 0 || cqe->res != -EINVAL;
done:
    io_uring_queue_exit(&ring);
    if (fd >= 0) close(fd);
    return supported;
}
