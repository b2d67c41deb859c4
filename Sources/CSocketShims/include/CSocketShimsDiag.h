#ifndef CSOCKETSHIMS_DIAG_H
#define CSOCKETSHIMS_DIAG_H
// Apart from CSocketShims.h: tcpdiag.c includes <linux/tcp.h>, which clashes with the <netinet/tcp.h> there.
#include <stdint.h>

/// The kernel's view of a TCP connection found by its addresses (NETLINK_SOCK_DIAG), from any process of this
/// network namespace: the socket's state and queues, and tcp_info's fields the lessons draw.
struct csock_tcp_view {
    uint8_t state;
    uint8_t retransmits;
    uint8_t backoff;
    uint8_t reserved;
    uint32_t receive_queue;
    uint32_t send_queue;
    uint32_t ato_us;
    uint32_t unacked;
    uint32_t lost;
    uint32_t retrans;
    uint32_t rtt_us;
    uint32_t snd_cwnd;
    uint32_t total_retrans;
    uint32_t notsent_bytes;
};
/// `local_address` and `remote_address`: 4 (AF_INET) or 16 (AF_INET6) bytes in network order. Returns 0 when
/// found, 1 when no such connection, -1 on an error (errno).
int csock_tcp_view(int family, const void *local_address, uint16_t local_port, const void *remote_address,
                   uint16_t remote_port, struct csock_tcp_view *out);

#endif
