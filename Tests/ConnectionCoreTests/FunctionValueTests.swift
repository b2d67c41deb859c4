@_spi(Loop) import ConnectionCore
import Foundation
import Testing

/// The rule that keeps a stored closure from growing as it is read (`FunctionValue`): a function value in a generic
/// box is a field of a named struct. Checked three ways: the detector on types, a closure read through the box many
/// times still called at the same stack depth, and the package's sources holding no generic box of a bare function.
@Suite("function values in generic boxes", .timeLimit(.minutes(1)))
struct FunctionValueTests {
    struct Handler {
        let call: (Int) -> Void
    }

    @Test("Function types, and optionals and tuples of them, are bare; structs and collections holding them are not")
    func detector() {
        #expect(FunctionValue.isBare(((Int) -> Void).self))
        #expect(FunctionValue.isBare((@Sendable (Int32) -> Void).self))
        #expect(FunctionValue.isBare(((@Sendable () async throws -> Int)?).self))
        #expect(FunctionValue.isBare((Int, (Int) -> Void).self))
        #expect(!FunctionValue.isBare(Handler.self))
        #expect(!FunctionValue.isBare(Handler?.self))
        #expect(!FunctionValue.isBare([() -> Void].self))
        #expect(!FunctionValue.isBare((local: Int?, remote: String?).self))
        #expect(!FunctionValue.isBare(Int.self))
    }

    @Test("A closure in a struct, read through LoopConfined's inout access 20,000 times, is called at the same depth")
    func readsDoNotDeepen() {
        final class Depths: @unchecked Sendable {
            var first = 0
            var last = 0
        }
        let depths = Depths()
        let box = LoopConfined(
            Handler(call: { index in
                // Frames on the stack: a thunk a read added is a frame more (a local's address would not do:
                // AddressSanitizer moves locals to frames of its own).
                let depth = Thread.callStackReturnAddresses.count
                if index == 0 { depths.first = depth }
                depths.last = depth
            }))
        for index in 0..<20_000 {
            let handler = box.withValue { $0 }
            handler.call(index)
        }
        #expect(depths.first == depths.last, "the call went \(depths.last - depths.first) frames deeper")
    }

    /// `Box<(A) -> B>`, `Box<@Sendable (A) -> B>`, `Box<((A) -> B)?>`: a generic type's argument that is a function.
    static let bareArgument = try! NSRegularExpression(
        pattern:
            #"\b[A-Z][A-Za-z]*<\(*\s*(@Sendable\s+|@escaping\s+)*\([^<>]*\)\s*(async\s+)?(throws(\([^)]*\))?\s+)?->"#)

    @Test("No source of the package makes a generic box of a bare function type")
    func sources() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        let sources = root.appendingPathComponent("Sources")
        let files = try #require(FileManager.default.enumerator(atPath: sources.path)).compactMap { $0 as? String }
            .filter { $0.hasSuffix(".swift") }
        #expect(files.count > 100)
        var found: [String] = []
        for file in files {
            let text = try String(contentsOf: sources.appendingPathComponent(file), encoding: .utf8)
            for (number, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
                let line = String(line)
                if line.trimmingCharacters(in: .whitespaces).hasPrefix("//") { continue }
                let range = NSRange(line.startIndex..., in: line)
                if Self.bareArgument.firstMatch(in: line, range: range) != nil { found.append("\(file):\(number + 1)") }
            }
        }
        #expect(found.isEmpty, "generic boxes of bare function types: \(found)")
    }
}
