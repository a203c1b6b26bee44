/* One call that issues a whole batch of UCP puts: the loop of transfer/ucp_direct.py's put_many.
 *
 * Called through ctypes a put at a time, every put paid ctypes' argument conversion and a Python loop
 * step (about 1 us each, a thousand puts per 64 MiB batch of 64 KiB blocks, four thousand at 16 KiB).
 * Python hands in the address of ucp_put_nbx and ucp_request_free from the libucp that ucxx loaded,
 * and the endpoint, request parameter and remote key pointers, so this file needs no UCX header or
 * library: it is plain C with no Python API either, loaded with ctypes (which releases the GIL for the
 * call). Built by setuptools with the package (pyproject.toml), or in place on first import
 * (transfer/native.py) where the tree runs from source.
 */

#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <string.h>

typedef void *(*put_nbx_fn)(void *endpoint, const void *buffer, size_t count, uint64_t remote_address,
                            void *rkey, const void *param);
typedef void (*request_free_fn)(void *request);

/* UCS_PTR_IS_ERR: an operation that failed at once returns its (negative) status as a pointer. */
#define UCS_ERR_LAST (-100)

/* Put src[i] (lengths[i] bytes) to dst[i] under rkeys[i] for every i < count. A put that completed
 * at once returns NULL; one in flight returns a request, freed here at once (UCP releases it itself
 * once it completes; the flush after the batch confirms it landed). The indices of the puts that
 * failed at once go to failed[] and the status of the first to *first_status; returns how many. */
int64_t kvf_put_many(put_nbx_fn put, request_free_fn request_free, void *endpoint, const void *param,
                     size_t count, const uint64_t *src, const uint64_t *lengths, const uint64_t *dst,
                     const uint64_t *rkeys, int64_t *failed, int32_t *first_status)
{
    int64_t failures = 0;
    *first_status = 0;
    for (size_t i = 0; i < count; i++) {
        void *request = put(endpoint, (const void *)(uintptr_t)src[i], (size_t)lengths[i], dst[i],
                            (void *)(uintptr_t)rkeys[i], param);
        if (request == NULL) {
            continue;
        }
        if ((uintptr_t)request >= (uintptr_t)(intptr_t)UCS_ERR_LAST) {
            if (failures == 0) {
                *first_status = (int32_t)(intptr_t)request;
            }
            failed[failures++] = (int64_t)i;
        } else {
            request_free(request);
        }
    }
    return failures;
}

/* Copy src[i] (lengths[i] bytes) to dst[i] for every i < count: puts into a peer's shared-memory
 * segment that this process has attached (ucp_rkey_ptr gave the local address of the remote range),
 * done as plain copies. UCP itself would move them by CMA (one process_vm_writev per 512 KiB segment,
 * its pages pinned on every call), at about half of memcpy's speed for 1 MiB blocks. */
void kvf_copy_many(size_t count, const uint64_t *src, const uint64_t *lengths, const uint64_t *dst)
{
    for (size_t i = 0; i < count; i++) {
        memcpy((void *)(uintptr_t)dst[i], (const void *)(uintptr_t)src[i], (size_t)lengths[i]);
    }
}

struct copy_span {
    size_t count;
    const uint64_t *src, *lengths, *dst;
};

static void *copy_span_run(void *arg)
{
    const struct copy_span *span = arg;
    kvf_copy_many(span->count, span->src, span->lengths, span->dst);
    return NULL;
}

/* Two kvf_copy_many spans at once, the second on a thread of its own (the caller's thread copies the
 * first): one thread's memcpy leaves memory bandwidth unused on this class of machine. Without a
 * thread (pthread_create failed) the caller copies both. */
void kvf_copy_two(size_t count, const uint64_t *src, const uint64_t *lengths, const uint64_t *dst,
                  size_t other_count, const uint64_t *other_src, const uint64_t *other_lengths,
                  const uint64_t *other_dst)
{
    struct copy_span other = {other_count, other_src, other_lengths, other_dst};
    pthread_t thread;
    int started = pthread_create(&thread, NULL, copy_span_run, &other) == 0;
    kvf_copy_many(count, src, lengths, dst);
    if (started) {
        pthread_join(thread, NULL);
    } else {
        copy_span_run(&other);
    }
}
