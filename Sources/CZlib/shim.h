#ifndef SOCKETSTYLES_CZLIB_SHIM_H
#define SOCKETSTYLES_CZLIB_SHIM_H
#include <zlib.h>

// deflateInit2 and inflateInit2 are macros (they pass the library version and the stream's size): functions
// Swift can call.
static inline int socketstyles_deflate_init(z_streamp stream, int level, int window_bits, int memory_level,
                                            int strategy) {
    return deflateInit2(stream, level, Z_DEFLATED, window_bits, memory_level, strategy);
}

static inline int socketstyles_inflate_init(z_streamp stream, int window_bits) {
    return inflateInit2(stream, window_bits);
}
#endif
