#ifndef SOCKETSTYLES_CLIBUV_SHIM_H
#define SOCKETSTYLES_CLIBUV_SHIM_H
#include <uv.h>

/* Casts Swift cannot spell directly between libuv's "subclasses" of uv_handle_t / uv_stream_t. */
static inline uv_handle_t *csuv_handle(void *h) { return (uv_handle_t *)h; }
static inline uv_stream_t *csuv_stream(void *h) { return (uv_stream_t *)h; }

/* UV_EOF and the getaddrinfo error range, as plain ints. */
static inline int csuv_eof(void) { return UV_EOF; }
static inline int csuv_ecanceled(void) { return UV_ECANCELED; }
static inline int csuv_eagain(void) { return UV_EAGAIN; }
static inline int csuv_is_eai(int code) { return code <= -3000 && code > -3100; }

/* libuv keeps one descriptor on /dev/null per loop (the "EMFILE trick": freed to accept-and-drop a client
 * when the process runs out of descriptors). It opens it lazily at the first uv_listen and closes it in
 * uv_loop_close. Opening it when the loop starts keeps the process's descriptor count steady afterwards. */
#include <fcntl.h>
static inline void csuv_reserve_emfile_fd(uv_loop_t *loop) {
    if (loop->emfile_fd == -1) loop->emfile_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}
#endif
