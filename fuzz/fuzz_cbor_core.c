/* libFuzzer harness for the CBOR byte helper's C core (client/sessionstore/wire/cbor_core.c),
 * built with AddressSanitizer and UndefinedBehaviorSanitizer by `make fuzz`. Any bytes
 * must be walked without a fault, and:
 *   - a walk resumed over the input in pieces gives the one-shot walk's verdict;
 *   - an accepted item canonicalises to bytes no longer than it, which walk as
 *     canonical, and canonicalise again to themselves;
 *   - cbor_item_end never reads past the input;
 *   - cbor_snapshot_outline never reads past the input, and a session id it finds
 *     lies inside it.
 * The first byte of an input chooses the depth limit and where it is cut. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cbor_core.h"

#define CHECK(condition)                                                                   \
    do {                                                                                   \
        if (!(condition)) {                                                                \
            fprintf(stderr, "fuzz_cbor_core: %s failed (line %d)\n", #condition, __LINE__); \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

static int same(cb_verdict a, cb_verdict b)
{
    return a.status == b.status && a.reason == b.reason && a.position == b.position;
}

int LLVMFuzzerTestOneInput(const uint8_t *input, size_t size)
{
    if (size < 1)
        return 0;
    unsigned max_depth = input[0] % 72;
    size_t cut_every = 1 + input[0] / 72;
    const uint8_t *data = input + 1;
    size_t len = size - 1;

    /* the input in a buffer of its own size, so that ASan sees any read past it */
    uint8_t *copy = malloc(len ? len : 1);
    memcpy(copy, data, len);
    cb_verdict whole = cbor_walk(copy, len, 0, len + 1, max_depth, 1u << 20);

    cb_frame *frames = malloc(sizeof(cb_frame) * (max_depth ? max_depth : 1));
    cb_walker walker;
    cbor_walker_init(&walker, frames, 0, len + 1, max_depth, 1u << 20);
    cb_verdict pieces = {CB_INCOMPLETE, 0, 0};
    for (size_t seen = 0; seen < len && pieces.status == CB_INCOMPLETE;) {
        seen = seen + cut_every < len ? seen + cut_every : len;
        uint8_t *prefix = malloc(seen);
        memcpy(prefix, copy, seen);
        pieces = cbor_walker_run(&walker, prefix, seen);
        free(prefix);
    }
    if (len == 0)
        pieces = cbor_walker_run(&walker, copy, 0);
    CHECK(same(whole, pieces));
    free(frames);

    if (whole.status == CB_CANONICAL || whole.status == CB_VALID) {
        size_t end = whole.position;
        uint8_t *out = malloc(end);
        long length = cbor_canonicalise(copy, 0, end, max_depth, out);
        if (whole.status == CB_CANONICAL) {
            CHECK(length == (long)end && memcmp(out, copy, end) == 0);
        }
        if (length >= 0) {
            CHECK((size_t)length <= end);
            uint8_t *exact = malloc((size_t)length ? (size_t)length : 1);
            memcpy(exact, out, (size_t)length);
            cb_verdict again = cbor_walk(exact, (size_t)length, 0, (size_t)length, max_depth, 1u << 20);
            CHECK(again.status == CB_CANONICAL && again.position == (size_t)length);
            uint8_t *twice = malloc((size_t)length ? (size_t)length : 1);
            CHECK(cbor_canonicalise(exact, 0, (size_t)length, max_depth, twice) == length);
            CHECK(memcmp(twice, exact, (size_t)length) == 0);
            free(twice);
            free(exact);
        }
        free(out);
    }
    size_t end = cbor_item_end(copy, len, 0);
    CHECK(end <= len);
    size_t id_start = 0, id_end = 0;
    if (cbor_snapshot_outline(copy, len, &id_start, &id_end))
        CHECK(id_start < id_end && id_end <= len);
    free(copy);
    return 0;
}
