import Foundation
import Glibc
import POSIXSupport
import SocketStyles

extension Lesson {
    /// One sender, several receivers on a multicast group.
    static let multicast = Lesson(
        name: "multicast",
        summary: "one UDP sender, three receivers joined to a multicast group on loopback (inside a namespace)"
    ) { backend, print in
        let out = LessonOutput("multicast", print)
        if let reason = NetworkLab.unavailableReason() {
            out.say("This lesson runs its multicast inside a network namespace of its own, and \(reason).")
            out.figure("skipped", 1)
            return out.report
        }
        let lab = try NetworkLab()
        defer { lab.remove() }
        try NetworkLab.sh("ip", "-n", lab.clientNamespace, "link", "set", "lo", "multicast", "on")
        try NetworkLab.sh("ip", "-n", lab.clientNamespace, "route", "add", "224.0.0.0/4", "dev", "lo")
        let json = try lab.runToEnd(in: lab.clientNamespace, ["lesson-probe", "multicast", "udp://239.7.7.7:0"])
        let result = try JSONDecoder().decode(MulticastProbe.Result.self, from: Data(json.utf8))
        out.say(
            "Inside a namespace, three sockets joined group 239.7.7.7 on port \(result.port); one sender sent \(result.sent)"
        )
        out.say("datagrams to the group, once each.")
        for (index, count) in result.receivedPerReceiver.enumerated() {
            out.say("  receiver \(index + 1): \(count) of \(result.sent) datagrams")
            out.figure("receiver\(index + 1)", Double(count))
        }
        out.say("  a socket on the same port that did not join: \(result.notJoined) datagrams")
        out.figure("sent", Double(result.sent))
        out.figure("notJoined", Double(result.notJoined))
        out.say()
        out.say("Why: a multicast datagram is sent once, to a group address (224.0.0.0/4); the network (here the")
        out.say("loopback device) delivers a copy to every socket that joined the group (IP_ADD_MEMBERSHIP), and")
        out.say("to no one else. The sender does not know or care how many listen. Broadcast (255.255.255.255 or a")
        out.say("subnet's broadcast address, with SO_BROADCAST) reaches every host on the link whether it wants it or")
        out.say("not; routers never forward it, and IPv6 dropped broadcast for multicast. (This lesson uses plain")
        out.say("sockets whatever --backend says: joining a group is a socket option, the same in every style.)")
        _ = backend
        return out.report
    }
}

/// The multicast experiment, run inside a namespace by `sockbench lesson-probe multicast`.
public enum MulticastProbe {
    public struct Result: Codable, Sendable {
        public var port: UInt16 = 0
        public var sent = 0
        public var receivedPerReceiver: [Int] = []
        public var notJoined = 0
    }

    public static func run(group: String) throws -> Result {
        var result = Result()
        // Receivers: bound to the same port (SO_REUSEADDR), three join the group, one does not.
        var receivers: [Int32] = []
        defer { for fd in receivers { close(fd) } }
        var port: UInt16 = 0
        for index in 0..<4 {
            let fd = socket(AF_INET, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            var one: Int32 = 1
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, 4)
            // Deliver to this socket only the groups it joined itself (Linux's default, IP_MULTICAST_ALL = 1,
            // would hand it every group any socket of the host joined).
            var all: Int32 = 0
            setsockopt(fd, Int32(IPPROTO_IP), 49 /* IP_MULTICAST_ALL */, &all, 4)
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = port.bigEndian
            address.sin_addr.s_addr = inet_addr(group)
            let bound = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
            guard bound == 0 else { throw ConnectionError.errno(errno, "bind multicast receiver") }
            if port == 0 { port = try Syscall.localAddress(fd).port }
            if index < 3 {
                var request = ip_mreq()
                request.imr_multiaddr.s_addr = inet_addr(group)
                request.imr_interface.s_addr = inet_addr("127.0.0.1")
                guard
                    setsockopt(
                        fd, Int32(IPPROTO_IP), IP_ADD_MEMBERSHIP, &request, socklen_t(MemoryLayout<ip_mreq>.size)) == 0
                else { throw ConnectionError.errno(errno, "IP_ADD_MEMBERSHIP") }
            }
            var timeout = timeval(tv_sec: 0, tv_usec: 200_000)
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            receivers.append(fd)
        }
        result.port = port
        // Sender.
        let sender = socket(AF_INET, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        defer { close(sender) }
        var interface = in_addr(s_addr: inet_addr("127.0.0.1"))
        setsockopt(sender, Int32(IPPROTO_IP), IP_MULTICAST_IF, &interface, socklen_t(MemoryLayout<in_addr>.size))
        var loop: UInt8 = 1
        setsockopt(sender, Int32(IPPROTO_IP), IP_MULTICAST_LOOP, &loop, 1)
        var destination = sockaddr_in()
        destination.sin_family = sa_family_t(AF_INET)
        destination.sin_port = port.bigEndian
        destination.sin_addr.s_addr = inet_addr(group)
        for index in 0..<10 {
            var payload = UInt8(index)
            let sent = withUnsafePointer(to: &destination) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    sendto(sender, &payload, 1, 0, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
            if sent == 1 { result.sent += 1 }
        }
        var buffer = [UInt8](repeating: 0, count: 16)
        for (index, fd) in receivers.enumerated() {
            var count = 0
            while recv(fd, &buffer, 16, 0) > 0 { count += 1 }
            if index < 3 { result.receivedPerReceiver.append(count) } else { result.notJoined = count }
        }
        return result
    }
}
