# Installed by scripts/autobahn as the sitecustomize module of its CPython 2.7 virtualenv (wstest's interpreter):
# two changes to where wstest spends its CPU in the permessage-deflate cases (12 and 13), with the same messages,
# the same checks and nothing different on the wire. CI runs four of those runs, and wstest's own CPU (13-20
# minutes a run, py-spy) was most of CI's time.
#
# 1. SHA-1 from libcrypto. That CPython was built without OpenSSL (2.7 predates OpenSSL 3), so hashlib.sha1 is the
#    builtin _sha, 80-150 MB/s here; the cases hash every message sent and every echo received, about 22 GB a run,
#    a fifth of wstest's CPU. hashlib.sha1 becomes the same SHA-1 through ctypes and libcrypto's EVP calls (5x
#    faster), checked against a known digest first; without libcrypto it is left as it was.
# 2. The test file decoded once per case, not once per message. Before each message, a case over a text file
#    (162 of the 216) decodes the whole 190-260 KB file as UTF-8 to cut the message from it: another eighth of
#    wstest's CPU. After a case's init, its test data is a str whose decode() remembers its one result; the
#    message cut from it is the same.
import hashlib
import sys

try:
    import ctypes
    import ctypes.util

    _lib = ctypes.CDLL(ctypes.util.find_library("crypto") or "libcrypto.so.3")
    for _name, _result, _arguments in [
        ("EVP_MD_CTX_new", ctypes.c_void_p, []),
        ("EVP_MD_CTX_free", None, [ctypes.c_void_p]),
        ("EVP_MD_CTX_copy_ex", ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]),
        ("EVP_sha1", ctypes.c_void_p, []),
        ("EVP_DigestInit_ex", ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]),
        ("EVP_DigestUpdate", ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]),
        ("EVP_DigestFinal_ex", ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]),
    ]:
        _function = getattr(_lib, _name)
        _function.restype = _result
        _function.argtypes = _arguments
    _sha1 = _lib.EVP_sha1()

    class _SHA1(object):
        """hashlib's sha1 object (update, digest, hexdigest, copy), computed by libcrypto."""

        name = "sha1"
        digest_size = 20
        digestsize = 20
        block_size = 64

        def __init__(self, data=""):
            self._context = _lib.EVP_MD_CTX_new()
            if not self._context or _lib.EVP_DigestInit_ex(self._context, _sha1, None) != 1:
                raise ValueError("libcrypto: EVP_DigestInit_ex failed")
            if data:
                self.update(data)

        def update(self, data):
            if isinstance(data, memoryview):
                data = data.tobytes()
            elif isinstance(data, unicode):
                data = data.encode("ascii")  # what the builtin does: non-ASCII text is an error
            elif not isinstance(data, str):
                data = str(data)  # buffer, bytearray
            if _lib.EVP_DigestUpdate(self._context, data, len(data)) != 1:
                raise ValueError("libcrypto: EVP_DigestUpdate failed")

        def copy(self):
            other = _SHA1.__new__(_SHA1)
            other._context = _lib.EVP_MD_CTX_new()
            _lib.EVP_MD_CTX_copy_ex(other._context, self._context)
            return other

        def digest(self):
            finished = self.copy()  # digest() does not end the running hash
            out = ctypes.create_string_buffer(20)
            _lib.EVP_DigestFinal_ex(finished._context, out, None)
            return out.raw

        def hexdigest(self):
            return self.digest().encode("hex")

        def __del__(self, _free=_lib.EVP_MD_CTX_free):
            _free(self._context)

    if _SHA1("abc").hexdigest() == "a9993e364706816aba3e25717850c26c9cd0d89d":
        hashlib.sha1 = _SHA1
except Exception:  # no libcrypto, or an API it lacks: the builtin stays
    pass


class _DecodedOnce(str):
    """A str whose decode() is computed once (the test data of one case, immutable)."""

    def decode(self, *arguments):
        cache = self.__dict__.setdefault("_decoded", {})
        if arguments not in cache:
            cache[arguments] = str.decode(self, *arguments)
        return cache[arguments]


def _decode_test_data_once(module):
    def wrap(init):
        def init_then_wrap(self):
            init(self)
            self.testData = _DecodedOnce(self.testData)

        return init_then_wrap

    for case in list(getattr(module, "Case12_X_X", [])) + list(getattr(module, "Case13_X_X", [])):
        case.init = wrap(case.__dict__["init"])


class _AfterImport(object):
    """Runs a function on a module once it is imported (Python 2's import hook protocol)."""

    def __init__(self, name, then):
        self.name, self.then = name, then

    def find_module(self, fullname, path=None):
        return self if fullname == self.name else None

    def load_module(self, fullname):
        sys.meta_path.remove(self)  # let the normal import find it
        try:
            module = __import__(fullname, fromlist=["*"])
        finally:
            sys.meta_path.insert(0, self)
        self.then(module)
        return module


sys.meta_path.insert(0, _AfterImport("autobahntestsuite.case.case12_x_x", _decode_test_data_once))
