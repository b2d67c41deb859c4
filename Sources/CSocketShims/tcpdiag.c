// The kernel's view of any TCP connection on this host (this network namespace), found by its addresses through
// NETLINK_INET_DIAG (sock_diag(7)), as ss(8) reads it: no descriptor of the socket needed, so a lesson can sample
// the connections of every backend, its own or another process's. Kept apart from shims.c because it needs
// <linux/tcp.h>'s full struct tcp_info (tcpi_notsent_bytes and later), which glibc's <netinet/tcp.h> lacks.
#include "CSocketShimsDiag.h"
#include <errno.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/inet_diag.h>
#include <linux/tcp.h>

int csock_tcp_diag_open(void) { return socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG); }

int csock_tcp_view(int family, const void *local_address, uint16_t local_port, const void *remote_address,
                   uint16_t remote_port, struct csock_tcp_view *out) {
    int fd = csock_tcp_diag_open();
    if (fd < 0) return -1;
    int result = csock_tcp_view_on(fd, family, local_address, local_port, remote_address, remote_port, out);
    int saved = errno;
    close(fd);
    errno = saved;
    return result;
}

int csock_tcp_view_on(int fd, int family, const void *local_address, uint16_t local_port,
                      const void *remote_address, uint16_t remote_port, struct csock_tcp_view *out) {
    struct {
        struct nlmsghdr header;
        struct inet_diag_req_v2 request;
    } message;
    memset(&message, 0, sizeof message);
    message.header.nlmsg_len = sizeof message;
    message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    message.header.nlmsg_flags = NLM_F_REQUEST;
    message.request.sdiag_family = (uint8_t)family;
    message.request.sdiag_protocol = IPPROTO_TCP;
    message.request.idiag_ext = (1 << (INET_DIAG_INFO - 1)) | (1 << (INET_DIAG_CONG - 1));
    message.request.idiag_states = ~0u;
    message.request.id.idiag_sport = htons(local_port);
    message.request.id.idiag_dport = htons(remote_port);
    size_t length = family == AF_INET6 ? 16 : 4;
    memcpy(message.request.id.idiag_src, local_address, length);
    memcpy(message.request.id.idiag_dst, remote_address, length);
    message.request.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
    message.request.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
    if (sendto(fd, &message, sizeof message, 0, (struct sockaddr *)&kernel, sizeof kernel) < 0) return -1;
    char buffer[8192];
    ssize_t received = recv(fd, buffer, sizeof buffer, 0);
    if (received < 0) return -1;
    memset(out, 0, sizeof *out);
    for (struct nlmsghdr *header = (struct nlmsghdr *)buffer; NLMSG_OK(header, (unsigned)received);
         header = NLMSG_NEXT(header, received)) {
        if (header->nlmsg_type == NLMSG_ERROR) {
            struct nlmsgerr *error = NLMSG_DATA(header);
            errno = error->error < 0 ? -error->error : ENOENT;
            return errno == ENOENT ? 1 : -1;
        }
        if (header->nlmsg_type != SOCK_DIAG_BY_FAMILY) continue;
        struct inet_diag_msg *diag = NLMSG_DATA(header);
        out->state = diag->idiag_state;
        out->receive_queue = diag->idiag_rqueue;
        out->send_queue = diag->idiag_wqueue;
        int attributes = (int)(header->nlmsg_len - NLMSG_LENGTH(sizeof *diag));
        for (struct rtattr *attribute = (struct rtattr *)(diag + 1); RTA_OK(attribute, attributes);
             attribute = RTA_NEXT(attribute, attributes)) {
            if (attribute->rta_type == INET_DIAG_CONG) {
                size_t size = RTA_PAYLOAD(attribute) < sizeof out->congestion - 1 ? RTA_PAYLOAD(attribute)
                                                                                 : sizeof out->congestion - 1;
                memcpy(out->congestion, RTA_DATA(attribute), size);
                out->congestion[size] = 0;
                continue;
            }
            if (attribute->rta_type != INET_DIAG_INFO) continue;
            struct tcp_info info;
            memset(&info, 0, sizeof info);
            size_t size = RTA_PAYLOAD(attribute) < sizeof info ? RTA_PAYLOAD(attribute) : sizeof info;
            memcpy(&info, RTA_DATA(attribute), size);
            out->has_info = 1;
            out->retransmits = info.tcpi_retransmits;
            out->backoff = info.tcpi_backoff;
            out->ato_us = info.tcpi_ato;
            out->unacked = info.tcpi_unacked;
            out->lost = info.tcpi_lost;
            out->retrans = info.tcpi_retrans;
            out->rtt_us = info.tcpi_rtt;
            out->snd_cwnd = info.tcpi_snd_cwnd;
            out->total_retrans = info.tcpi_total_retrans;
            out->notsent_bytes = info.tcpi_notsent_bytes;
            out->snd_ssthresh = info.tcpi_snd_ssthresh;
            out->ca_state = info.tcpi_ca_state;
            out->snd_mss = info.tcpi_snd_mss;
            out->rttvar_us = info.tcpi_rttvar;
            out->min_rtt_us = info.tcpi_min_rtt;
            out->pacing_rate = info.tcpi_pacing_rate;
            out->delivery_rate = info.tcpi_delivery_rate;
            out->bytes_sent = info.tcpi_bytes_sent;
            out->bytes_acked = info.tcpi_bytes_acked;
            out->bytes_retrans = info.tcpi_bytes_retrans;
        }
        return 0;
    }
    return 1;
}
