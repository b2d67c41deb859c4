import Foundation
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
        var phases: [Int] = []
        for (index, read) in result.receives.enumerated() {
            let phase = out.trace.phase(
                index < 3 ? "Sender to joined receiver \(index + 1)" : "Sender to the socket that did not join", .udp)
            phases.append(phase)
            out.trace.replay(result.sends + read, into: phase, byteStream: false)
        }
        out.figure("sent", Double(result.sent))
        out.figure("notJoined", Double(result.notJoined))
        out.say()
        out.say("Why: a multicast datagram is sent once, to a group address (224.0.0.0/4); the network (here the")
        out.say("loopback device) delivers a copy to every socket that joined the group (IP_ADD_MEMBERSHIP), and")
        out.say("to no one else. The sender does not know or care how many listen. Broadcast (255.255.255.255 or a")
        out.say("subnet's broadcast address, with SO_BROADCAST) reaches every host on the link whether it wants it or")
        out.say("not; routers never forward it, and IPv6 dropped broadcast for multicast. (This lesson uses plain")
        out.say("sockets whatever --backend says: joining a group is a socket option, the same in every style.)")
        let everyJoined =
            !result.receivedPerReceiver.isEmpty && result.receivedPerReceiver.allSatisfy { $0 == result.sent }
        if everyJoined && result.notJoined == 0 {
            out.say(
                "Here it showed: each of the \(result.receivedPerReceiver.count) joined sockets got all \(result.sent) datagrams from one send each, and the socket that did not join got none (every arrow to it ends in a cross).",
                pointingAt: phases.last)
        } else {
            out.say(
                "Here it did NOT show as described: the joined sockets got \(result.receivedPerReceiver.map(String.init).joined(separator: ", ")) of \(result.sent), the socket that did not join \(result.notJoined)."
            )
        }
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
        /// The sends (as the client's) and, per receiver (the three joined, then the one that did not), what it
        /// read (as the server's), for the lesson's picture. A receive's time is when the receiver read it: after
        /// all ten were sent.
        public var sends: [LessonTrace.Observation] = []
        public var receives: [[LessonTrace.Observation]] = []
    }

    public static func run(group: String) throws -> Result {
        var result = Result()
        let loopbackInterface = SocketAddress.loopbackIPv4(port: 0)
        // Receivers: bound to the group address on one port (SO_REUSEADDR); three join the group, one does not.
        var receivers: [SocketDescriptor] = []
        defer { for receiver in receivers { receiver.close() } }
        var port: UInt16 = 0
        for index in 0..<4 {
            let receiver = try Syscall.socket(family: .ipv4, datagram: true)
            receivers.append(receiver)
            let groupAddress = try Syscall.resolve(try Endpoint(url: "udp://\(group):\(port)"))[0]
            try receiver.withDescriptor { (fd) throws(ConnectionError) in
                try Syscall.setOption(fd, .reuseAddress, true)
                // Deliver to this socket only the groups it joined itself (Linux's default would hand it every
                // group any socket of the host joined).
                try Syscall.setMulticastAll(fd, false)
                try Syscall.bind(fd, to: groupAddress)
                if port == 0 { port = try Syscall.localAddress(fd).port }
                if index < 3 {
                    try Syscall.joinMulticastGroup(fd, group: groupAddress, interface: loopbackInterface)
                }
                try Syscall.setReceiveTimeout(fd, milliseconds: 200)
            }
        }
        result.port = port
        let destination = try Syscall.resolve(try Endpoint(url: "udp://\(group):\(port)"))[0]
        let sender = try Syscall.socket(family: .ipv4, datagram: true)
        defer { sender.close() }
        try sender.withDescriptor { (fd) throws(ConnectionError) in
            try Syscall.setMulticastSender(fd, interface: loopbackInterface, loop: true)
        }
        for index in 0..<10 {
            let at = MonotonicClock.nanoseconds()
            let sent = try [UInt8(index)].withBytes { (bytes) throws(ConnectionError) in
                try sender.withDescriptor { (fd) throws(ConnectionError) in
                    try Syscall.sendTo(fd, bytes, to: destination)
                }
            }
            if case .processed = sent {
                result.sent += 1
                result.sends.append(.init(at: at, side: .client, kind: .send, bytes: 1, number: index))
            }
        }
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 16, alignment: 1)
        defer { buffer.deallocate() }
        for (index, receiver) in receivers.enumerated() {
            var count = 0
            var read: [LessonTrace.Observation] = []
            while case .processed(let bytes) = try receiver.withDescriptor({ (fd) throws(ConnectionError) in
                try Syscall.recv(fd, buffer)
            }) {
                count += 1
                read.append(
                    .init(
                        at: MonotonicClock.nanoseconds(), side: .server, kind: .receive, bytes: bytes,
                        number: bytes > 0 ? Int(buffer[0]) : nil))
            }
            result.receives.append(read)
            if index < 3 { result.receivedPerReceiver.append(count) } else { result.notJoined = count }
        }
        return result
    }
}
