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
    /// 1 when the kernel sent its tcp_info: not for a socket it keeps only as a timewait entry (TIME-WAIT, and an
    /// orphaned FIN-WAIT-2 after the program closed it), whose other fields are then 0.
    uint8_t has_info;
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
    /// Congestion control: slow-start threshold (segments), the state (0 open, 1 disorder, 2 CWR, 3 recovery,
    /// 4 loss), the sender's segment size.
    uint32_t snd_ssthresh;
    uint8_t ca_state;
    uint8_t reserved2[3];
    uint32_t snd_mss;
    /// RTT variance and the lowest RTT seen, microseconds.
    uint32_t rttvar_us;
    uint32_t min_rtt_us;
    /// Bytes a second: the rate TCP paces its sends at, and the last measured delivery rate.
    uint64_t pacing_rate;
    uint64_t delivery_rate;
    /// Bytes over the connection's life: sent (retransmissions included), acknowledged, retransmitted.
    uint64_t bytes_sent;
    uint64_t bytes_acked;
    uint64_t bytes_retrans;
    /// The congestion-control algorithm's name ("cubic", "bbr"), NUL-terminated; empty when not given.
    char congestion[16];
};
/// `local_address` and `remote_address`: 4 (AF_INET) or 16 (AF_INET6) bytes in network order. Returns 0 when
/// found, 1 when no such connection, -1 on an error (errno).
int csock_tcp_view(int family, const void *local_address, uint16_t local_port, const void *remote_address,
                   uint16_t remote_port, struct csock_tcp_view *out);
/// The same query on a NETLINK_SOCK_DIAG socket the caller keeps open (`csock_tcp_diag_open`), for sampling one
/// connection many times a second without a socket per query.
int csock_tcp_view_on(int netlink, int family, const void *local_address, uint16_t local_port,
                      const void *remote_address, uint16_t remote_port, struct csock_tcp_view *out);
/// A NETLINK_SOCK_DIAG socket (close it with close(2)), or -1 (errno).
int csock_tcp_diag_open(void);

#endif
