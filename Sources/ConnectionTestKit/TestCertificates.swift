import Glibc
import POSIXSupport
public import SocketStyles

/// Throwaway certificates made with the `openssl` command for one test run, in a private temporary directory
/// that ``remove()`` deletes. No private key is ever committed: each run makes its own.
///
/// - a CA (`ca.pem`; its key is deleted as soon as the certificates are signed),
/// - `server`: signed by the CA, for `localhost`, `127.0.0.1` and `::1`,
/// - `wrongHost`: signed by the CA, for `wrong.example` only,
/// - `expired`: signed by the CA, for `localhost`, no longer valid,
/// - `selfSigned`: for `localhost`, signed by itself (trusted by no one).
public final class TestCertificates: Sendable {
    /// A certificate (PEM, leaf first) and its private key (PEM).
    public struct Pair: Sendable {
        public let certificate: String
        public let key: String
        /// A server configuration presenting this pair.
        public var server: TLSConfiguration {
            TLSConfiguration.server(certificateChainFile: certificate, privateKeyFile: key)
        }
    }

    /// The directory holding every file.
    public let directory: String
    /// The CA certificate: trust it to verify ``server``, ``wrongHost`` and ``expired``.
    public let caFile: String
    public let server: Pair
    public let wrongHost: Pair
    public let expired: Pair
    public let selfSigned: Pair

    /// A client configuration trusting only the test CA, with full verification.
    public var client: TLSConfiguration {
        var configuration = TLSConfiguration()
        configuration.trustRoots = .file(caFile)
        return configuration
    }

    /// Makes a fresh set. Needs the `openssl` command (Debian package openssl). The server certificate names
    /// localhost, 127.0.0.1 and ::1, and `extraServerHosts` (IP addresses or DNS names) too.
    public static func make(extraServerHosts: [String] = []) throws(ConnectionError) -> TestCertificates {
        var template = Array("/tmp/socketstyles-certs-XXXXXX".utf8CString)
        guard let created = mkdtemp(&template) else { throw .errno(errno, "mkdtemp") }
        let directory = String(cString: created)
        do throws(ConnectionError) {
            return try TestCertificates(directory: directory, extraServerHosts: extraServerHosts)
        } catch {
            Self.removeDirectory(directory)
            throw error
        }
    }

    private init(directory: String, extraServerHosts: [String]) throws(ConnectionError) {
        self.directory = directory
        let openssl = try Self.findOpenSSL()
        func run(_ arguments: [String]) throws(ConnectionError) {
            let (status, output) = try ChildProcess.run([openssl] + arguments)
            guard status == 0 else {
                throw ConnectionError(
                    .system, "openssl \(arguments.prefix(2).joined(separator: " ")) failed: \(output)")
            }
        }
        func path(_ name: String) -> String { "\(directory)/\(name)" }
        let ca = path("ca.pem")
        let curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        try run(
            ["req", "-x509"] + curve + [
                "-keyout", path("ca.key"), "-out", ca, "-days", "2", "-subj", "/CN=SocketStyles test CA",
                "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            ])
        func signed(_ name: String, names: String, days: Int) throws(ConnectionError) -> Pair {
            let extensions = path("\(name).ext")
            let text = "subjectAltName=\(names)\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
            guard let file = fopen(extensions, "w") else { throw .errno(errno, "writing \(extensions)") }
            fputs(text, file)
            fclose(file)
            try run(
                ["req"] + curve + [
                    "-keyout", path("\(name).key"), "-out", path("\(name).csr"), "-subj", "/CN=\(name)",
                ])
            try run([
                "x509", "-req", "-in", path("\(name).csr"), "-CA", ca, "-CAkey", path("ca.key"),
                "-set_serial", String(UInt32.random(in: 1...UInt32.max)), "-days", String(days), "-extfile", extensions,
                "-out", path("\(name).pem"),
            ])
            return Pair(certificate: path("\(name).pem"), key: path("\(name).key"))
        }
        let extra = extraServerHosts.map { host in
            (try? Endpoint(url: "tcp://\(host.contains(":") ? "[\(host)]" : host):1")).map { endpoint in
                if case .name = endpoint.host { return "DNS:" + host }
                return "IP:" + host
            } ?? "DNS:" + host
        }
        let server = try signed(
            "server", names: (["DNS:localhost", "IP:127.0.0.1", "IP:::1"] + extra).joined(separator: ","), days: 2)
        let wrongHost = try signed("wrong-host", names: "DNS:wrong.example", days: 2)
        // -days -1: valid until a day before it was made.
        let expired = try signed("expired", names: "DNS:localhost,IP:127.0.0.1", days: -1)
        unlink(path("ca.key"))
        try run(
            ["req", "-x509"] + curve + [
                "-keyout", path("self-signed.key"), "-out", path("self-signed.pem"), "-days", "2", "-subj",
                "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
            ])
        caFile = ca
        self.server = server
        self.wrongHost = wrongHost
        self.expired = expired
        selfSigned = Pair(certificate: path("self-signed.pem"), key: path("self-signed.key"))
    }

    /// Deletes every file and the directory.
    public func remove() { Self.removeDirectory(directory) }

    private static func removeDirectory(_ directory: String) {
        guard let handle = opendir(directory) else { return }
        while let entry = readdir(handle) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            if name != "." && name != ".." { unlink("\(directory)/\(name)") }
        }
        closedir(handle)
        rmdir(directory)
    }

    private static func findOpenSSL() throws(ConnectionError) -> String {
        let path = String(cString: getenv("PATH") ?? strdup("/usr/bin:/bin"))
        for directory in path.split(separator: ":") {
            let candidate = "\(directory)/openssl"
            if access(candidate, X_OK) == 0 { return candidate }
        }
        throw ConnectionError(.unsupported, "the openssl command is not installed (Debian package openssl)")
    }
}
