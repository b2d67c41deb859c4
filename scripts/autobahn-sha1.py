# Installed by scripts/autobahn as the sitecustomize module of its CPython 2.7 virtualenv (wstest's interpreter).
#
# That CPython was built without OpenSSL (2.7 predates OpenSSL 3), so its hashlib.sha1 is the builtin _sha: 80-150
# MB/s here. wstest's permessage-deflate cases (12 and 13) hash every message they send and every echo they
# receive, about 22 GB a run, and that hashing was a fifth of wstest's CPU time (py-spy). This gives hashlib the
# same SHA-1 from the system's libcrypto (one-shot EVP calls through ctypes, 5x faster). Digests are identical
# and nothing on the wire changes. Without libcrypto, hashlib is left as it was.
import hashlib

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
