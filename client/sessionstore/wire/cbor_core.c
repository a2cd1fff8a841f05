/* Theory of operation
 *
 * A snapshot is mostly bytes that no rule of the contract reads: trace events,
 * message bodies, artifacts. Decoding them builds one Python object per CBOR
 * item, so the cost of a save would grow with its items. These functions look
 * at the bytes instead, once each, and build nothing:
 *
 * - cbor_walk walks one item with an explicit stack and says whether the store
 *   accepts it as it is (CB_CANONICAL: shortest heads, definite lengths, text
 *   keys in strictly increasing bytewise order, floats in their shortest exact
 *   form, strict UTF-8, only false/true/null among the simple values), accepts
 *   it once canonicalised (CB_VALID), or leaves it to the decoder (CB_OTHER:
 *   tags, indefinite lengths, keys that are not text: rare, and the decoder's
 *   rules for them are the reference). Refused bytes are CB_ERROR with a reason
 *   and the offset, and an item cut short is CB_INCOMPLETE. Limits on bytes,
 *   depth and item count are enforced before anything is allocated.
 * - cbor_canonicalise rewrites a CB_VALID item: heads shortened, floats
 *   narrowed where exact, every map's entries sorted by their encoded keys
 *   (RFC 8949 section 4.2.1). Equal keys make it give up (-1): the decoder
 *   then refuses them with its own message.
 * - cbor_item_end skips one item of bytes already walked.
 * - cbor_snapshot_outline reads the snapshot rules of the contract off a stored
 *   snapshot's canonical bytes, for the usual snapshot (every rule holds; run ids,
 *   where given, are text; at most MAX_OUTLINED_RUNS run records): it says where
 *   the session id is. Anything else, or any doubt, is left to the rules in
 *   Python, which name the problem (ops/snapshot.py).
 *
 * sessionstore/cbor_bytes_python.py is the twin of these functions in Python,
 * held equal to them by tests/test_cbor_bytes.py; fuzz/fuzz_cbor_core.c runs
 * them under AddressSanitizer and UndefinedBehaviorSanitizer.
 */
#define _GNU_SOURCE /* qsort_r */
#include "cbor_core.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static size_t head_length(unsigned info) { return info < 24 ? 1 : 1 + ((size_t)1 << (info - 24)); }

static uint64_t read_argument(const uint8_t *p, unsigned info)
{
    if (info < 24)
        return info;
    uint64_t value = 0;
    size_t width = (size_t)1 << (info - 24);
    for (size_t i = 1; i <= width; i++)
        value = (value << 8) | p[i];
    return value;
}

static int is_shortest(unsigned info, uint64_t argument)
{
    switch (info) {
    case 24: return argument >= 24;
    case 25: return argument > 0xFF;
    case 26: return argument > 0xFFFF;
    case 27: return argument > 0xFFFFFFFFu;
    default: return 1;
    }
}

/* Strict UTF-8 as Python decodes it: no overlong forms, no surrogates, nothing above U+10FFFF. */
static int valid_utf8(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t word;
            memcpy(&word, s + i, 8);
            if (!(word & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        uint8_t low = 0x80, high = 0xBF;
        if (c >= 0xC2 && c <= 0xDF)
            need = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0)
                low = 0xA0;
            else if (c == 0xED)
                high = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0)
                low = 0x90;
            else if (c == 0xF4)
                high = 0x8F;
        } else
            return 0;
        if (need > n - i - 1)
            return 0;
        if (s[i + 1] < low || s[i + 1] > high)
            return 0;
        for (size_t k = 2; k <= need; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
        i += need + 1;
    }
    return 1;
}

static double half_to_double(uint16_t h)
{
    int exponent = (h >> 10) & 0x1F;
    int mantissa = h & 0x3FF;
    double value;
    if (exponent == 0)
        value = ldexp(mantissa, -24);
    else if (exponent == 31)
        value = mantissa ? NAN : INFINITY;
    else
        value = ldexp(mantissa + 1024, exponent - 25);
    return (h & 0x8000) ? -value : value;
}

static double single_to_double(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, 4);
    return (double)f;
}

static double double_of(uint64_t bits)
{
    double d;
    memcpy(&d, &bits, 8);
    return d;
}

/* A finite double that half precision holds exactly (subnormals included). */
static int fits_half(double d)
{
    double a = fabs(d);
    if (a == 0.0)
        return 1;
    if (a > 65504.0)
        return 0;
    int exponent;
    double fraction = frexp(a, &exponent);
    double scaled = exponent - 1 >= -14 ? ldexp(fraction, 11) : ldexp(a, 24);
    return scaled == floor(scaled);
}

static int fits_single(double d) { return fabs(d) <= FLT_MAX && (double)(float)d == d; }

static uint16_t half_bits(double d)
{
    uint16_t sign = signbit(d) ? 0x8000 : 0;
    double a = fabs(d);
    if (a == 0.0)
        return sign;
    if (a < ldexp(1.0, -14))
        return sign | (uint16_t)ldexp(a, 24);
    int exponent;
    double fraction = frexp(a, &exponent);
    uint16_t mantissa = (uint16_t)(ldexp(fraction, 11) - 1024);
    return sign | (uint16_t)((exponent - 1 + 15) << 10) | mantissa;
}

/* Whether the float of this additional information and bits is in its shortest exact form. */
static int float_is_shortest(unsigned info, uint64_t bits)
{
    if (info == 25)
        return !((bits & 0x7C00) == 0x7C00 && (bits & 0x3FF)) || bits == 0x7E00;
    double d = info == 26 ? single_to_double((uint32_t)bits) : double_of(bits);
    if (isnan(d) || isinf(d))
        return 0;
    return info == 26 ? !fits_half(d) : !fits_single(d);
}

static int compare_keys(const uint8_t *base, size_t a_start, size_t a_end, size_t b_start,
                        size_t b_end)
{
    if (base[a_start] != base[b_start]) /* a head byte: keys of different lengths, mostly */
        return base[a_start] < base[b_start] ? -1 : 1;
    size_t a_len = a_end - a_start, b_len = b_end - b_start;
    int order = memcmp(base + a_start, base + b_start, a_len < b_len ? a_len : b_len);
    if (order)
        return order;
    return a_len < b_len ? -1 : a_len > b_len ? 1 : 0;
}

void cbor_walker_init(cb_walker *s, cb_frame *stack, size_t start, size_t limit,
                       unsigned max_depth, uint64_t max_items)
{
    if (limit > SIZE_MAX / 4)
        limit = SIZE_MAX / 4; /* so that a map's count of keys and values cannot overflow */
    s->stack = stack;
    s->depth = 0;
    s->max_depth = max_depth > CB_MAX_DEPTH ? CB_MAX_DEPTH : max_depth;
    s->items = 0;
    s->max_items = max_items;
    s->canonical = 1;
    s->pos = start;
    s->hard_end = start > SIZE_MAX / 4 ? start : start + limit;
    s->finished = 0;
}

/* The walk keeps its state in locals (the compiler may not keep fields of *s in
 * registers across the byte loads, which may alias them) and stores it back on the
 * way out. */
#define STORE_STATE()                                                                      \
    do {                                                                                   \
        s->pos = at;                                                                       \
        s->depth = depth;                                                                  \
        s->items = items;                                                                  \
        s->canonical = canonical;                                                          \
    } while (0)
#define FINISH(status_, reason_, position_)                                                \
    do {                                                                                   \
        STORE_STATE();                                                                     \
        cb_verdict v_ = {(status_), (reason_), (position_)};                               \
        s->finished = 1;                                                                   \
        s->final = v_;                                                                     \
        return v_;                                                                         \
    } while (0)
#define INCOMPLETE()                                                                       \
    do {                                                                                   \
        STORE_STATE();                                                                     \
        cb_verdict v_ = {CB_INCOMPLETE, CB_R_NONE, len};                                   \
        return v_;                                                                         \
    } while (0)

/* Walks on from s->pos; an item cut short leaves the state at its start, so that a
 * later call with more bytes (the same ones first) resumes there. */
cb_verdict cbor_walker_run(cb_walker *s, const uint8_t *data, size_t len)
{
    if (s->finished)
        return s->final;
    cb_frame *const stack = s->stack;
    const size_t hard_end = s->hard_end;
    const unsigned max_depth = s->max_depth;
    const uint64_t max_items = s->max_items;
    size_t at = s->pos; /* where the next item starts */
    unsigned depth = s->depth;
    uint64_t items = s->items;
    int canonical = s->canonical;
    for (;;) {
        size_t pos = at;
        if (pos >= hard_end)
            FINISH(CB_ERROR, CB_R_TOO_LARGE, pos);
        if (pos >= len)
            INCOMPLETE();
        cb_frame *top = depth ? &stack[depth - 1] : NULL;
        int is_key = top && top->is_map && !(top->remaining & 1);
        uint8_t initial = data[pos];
        unsigned major = initial >> 5, info = initial & 0x1F;
        size_t head = head_length(info);
        if (info < 28 && head > len - pos && head <= hard_end - pos)
            INCOMPLETE();
        if (++items > max_items)
            FINISH(CB_ERROR, CB_R_ITEMS, pos);
        if (info >= 28) {
            if (info != 31)
                FINISH(CB_ERROR, CB_R_RESERVED, pos);
            if (major == 7)
                FINISH(CB_ERROR, CB_R_BREAK, pos);
            if (major >= 2 && major <= 5)
                FINISH(CB_OTHER, CB_R_INDEFINITE, pos);
            FINISH(CB_ERROR, CB_R_RESERVED, pos);
        }
        if (is_key && major != 3)
            FINISH(CB_OTHER, CB_R_KEY, pos);
        if (head > hard_end - pos)
            FINISH(CB_ERROR, CB_R_TOO_LARGE, pos);
        uint64_t argument = read_argument(data + pos, info);
        if (major != 7 && !is_shortest(info, argument))
            canonical = 0; /* set again, harmlessly, if the item turns out cut short */
        switch (major) {
        case 0:
        case 1:
            pos += head;
            break;
        case 2:
        case 3:
            if (argument > hard_end - pos - head)
                FINISH(CB_ERROR, CB_R_TOO_LARGE, pos);
            if (argument > len - pos - head) {
                items--; /* counted again when its bytes are here */
                INCOMPLETE();
            }
            if (major == 3 && !valid_utf8(data + pos + head, (size_t)argument))
                FINISH(CB_ERROR, CB_R_UTF8, pos);
            pos += head + (size_t)argument;
            if (is_key) {
                if (canonical && top->has_key) {
                    int order = compare_keys(data, top->key_start, top->key_end, at, pos);
                    if (order == 0)
                        FINISH(CB_OTHER, CB_R_DUPLICATE, at);
                    if (order > 0)
                        canonical = 0;
                }
                top->has_key = 1;
                top->key_start = at;
                top->key_end = pos;
            }
            break;
        case 4:
        case 5:
            if (argument > hard_end - pos)
                FINISH(CB_ERROR, CB_R_TOO_LARGE, pos);
            if (argument && depth >= max_depth)
                FINISH(CB_ERROR, CB_R_DEPTH, pos);
            pos += head;
            if (!argument)
                break;
            stack[depth].remaining = major == 5 ? argument * 2 : argument;
            stack[depth].is_map = major == 5;
            stack[depth].has_key = 0;
            depth++;
            at = pos;
            continue; /* its first item comes next */
        case 6:
            FINISH(argument == 2 || argument == 3 ? CB_OTHER : CB_ERROR, CB_R_TAG, pos);
        default:
            if (info >= 25 && info <= 27) {
                if (!float_is_shortest(info, argument))
                    canonical = 0;
            } else if (info < 20 || info > 22)
                FINISH(CB_ERROR, CB_R_SIMPLE, pos);
            pos += head;
            break;
        }
        at = pos;
        /* an item ended: count it against its containers */
        while (depth) {
            if (--stack[depth - 1].remaining)
                break;
            depth--;
        }
        if (!depth)
            FINISH(canonical ? CB_CANONICAL : CB_VALID, CB_R_NONE, pos);
    }
}

cb_verdict cbor_walk(const uint8_t *data, size_t len, size_t start, size_t limit,
                     unsigned max_depth, uint64_t max_items)
{
    cb_frame stack[CB_MAX_DEPTH];
    cb_walker s;
    cbor_walker_init(&s, stack, start, limit, max_depth, max_items);
    return cbor_walker_run(&s, data, len);
}

size_t cbor_item_end(const uint8_t *data, size_t len, size_t start)
{
    uint64_t pending = 1; /* items still to skip */
    size_t pos = start;
    while (pending) {
        if (pos >= len)
            return 0;
        unsigned major = data[pos] >> 5, info = data[pos] & 0x1F;
        if (info >= 28)
            return 0;
        size_t head = head_length(info);
        if (head > len - pos)
            return 0;
        uint64_t argument = read_argument(data + pos, info);
        pos += head;
        pending--;
        if (major == 2 || major == 3) {
            if (argument > len - pos)
                return 0;
            pos += (size_t)argument;
        } else if (major == 4 || major == 5) {
            if (argument > len - pos)
                return 0; /* every item takes a byte at least */
            pending += major == 5 ? argument * 2 : argument;
        } else if (major == 6)
            pending++;
        if (pending > len - pos + 1)
            return 0;
    }
    return pos;
}

/* -- canonicalise ---------------------------------------------------------------- */

typedef struct {
    const uint8_t *in;
    size_t in_end;
    uint8_t *out;
    size_t out_len;
    unsigned max_depth;
} canon_state;

typedef struct {
    size_t key_start, key_end, entry_end; /* offsets into out */
} entry;

static void write_head(canon_state *s, unsigned major, uint64_t argument)
{
    uint8_t *o = s->out + s->out_len;
    if (argument < 24) {
        o[0] = (uint8_t)(major << 5 | argument);
        s->out_len += 1;
        return;
    }
    unsigned info;
    size_t width;
    if (argument <= 0xFF)
        info = 24, width = 1;
    else if (argument <= 0xFFFF)
        info = 25, width = 2;
    else if (argument <= 0xFFFFFFFFu)
        info = 26, width = 4;
    else
        info = 27, width = 8;
    o[0] = (uint8_t)(major << 5 | info);
    for (size_t i = 0; i < width; i++)
        o[1 + i] = (uint8_t)(argument >> (8 * (width - 1 - i)));
    s->out_len += 1 + width;
}

static void write_float(canon_state *s, double d)
{
    uint8_t *o = s->out + s->out_len;
    if (isnan(d)) {
        memcpy(o, "\xf9\x7e\x00", 3);
        s->out_len += 3;
    } else if (isinf(d) || fits_half(d)) {
        uint16_t h = isinf(d) ? (d < 0 ? 0xFC00 : 0x7C00) : half_bits(d);
        o[0] = 0xF9, o[1] = (uint8_t)(h >> 8), o[2] = (uint8_t)h;
        s->out_len += 3;
    } else if (fits_single(d)) {
        float f = (float)d;
        uint32_t bits;
        memcpy(&bits, &f, 4);
        o[0] = 0xFA;
        for (int i = 0; i < 4; i++)
            o[1 + i] = (uint8_t)(bits >> (8 * (3 - i)));
        s->out_len += 5;
    } else {
        uint64_t bits;
        memcpy(&bits, &d, 8);
        o[0] = 0xFB;
        for (int i = 0; i < 8; i++)
            o[1 + i] = (uint8_t)(bits >> (8 * (7 - i)));
        s->out_len += 9;
    }
}

static int compare_entries(const void *a, const void *b, void *base)
{
    const entry *x = a, *y = b;
    return compare_keys(base, x->key_start, x->key_end, y->key_start, y->key_end);
}

static int canon_item(canon_state *s, size_t *pos, unsigned depth);

/* Sort the n entries just written at out[region_start:]; -1 on equal keys. */
static int sort_entries(canon_state *s, entry *entries, size_t n, size_t region_start)
{
    int sorted = 1;
    for (size_t i = 1; i < n && sorted; i++)
        if (compare_keys(s->out, entries[i - 1].key_start, entries[i - 1].key_end,
                         entries[i].key_start, entries[i].key_end) >= 0)
            sorted = 0;
    if (sorted)
        return 0;
    qsort_r(entries, n, sizeof(entry), compare_entries, s->out);
    for (size_t i = 1; i < n; i++)
        if (!compare_keys(s->out, entries[i - 1].key_start, entries[i - 1].key_end,
                          entries[i].key_start, entries[i].key_end))
            return -1;
    size_t region = s->out_len - region_start;
    uint8_t *copy = malloc(region ? region : 1);
    if (!copy)
        return -1;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        size_t length = entries[i].entry_end - entries[i].key_start;
        memcpy(copy + at, s->out + entries[i].key_start, length);
        at += length;
    }
    memcpy(s->out + region_start, copy, region);
    free(copy);
    return 0;
}

static int canon_item(canon_state *s, size_t *pos, unsigned depth)
{
    size_t p = *pos;
    if (p >= s->in_end)
        return -1;
    unsigned major = s->in[p] >> 5, info = s->in[p] & 0x1F;
    if (info >= 28)
        return -1;
    size_t head = head_length(info);
    if (head > s->in_end - p)
        return -1;
    uint64_t argument = read_argument(s->in + p, info);
    p += head;
    switch (major) {
    case 0:
    case 1:
        write_head(s, major, argument);
        break;
    case 2:
    case 3:
        if (argument > s->in_end - p)
            return -1;
        write_head(s, major, argument);
        memcpy(s->out + s->out_len, s->in + p, (size_t)argument);
        s->out_len += (size_t)argument;
        p += (size_t)argument;
        break;
    case 4:
        if ((argument && depth >= s->max_depth) || argument > s->in_end - p)
            return -1;
        write_head(s, 4, argument);
        for (uint64_t i = 0; i < argument; i++)
            if (canon_item(s, &p, depth + 1) < 0)
                return -1;
        break;
    case 5: {
        if ((argument && depth >= s->max_depth) || argument > s->in_end - p)
            return -1;
        write_head(s, 5, argument);
        if (!argument)
            break;
        entry *entries = malloc((size_t)argument * sizeof(entry));
        if (!entries)
            return -1;
        size_t region_start = s->out_len;
        for (uint64_t i = 0; i < argument; i++) {
            if (p >= s->in_end || s->in[p] >> 5 != 3) {
                free(entries);
                return -1;
            }
            entries[i].key_start = s->out_len;
            int failed = canon_item(s, &p, depth + 1) < 0;
            entries[i].key_end = s->out_len;
            failed = failed || canon_item(s, &p, depth + 1) < 0;
            entries[i].entry_end = s->out_len;
            if (failed) {
                free(entries);
                return -1;
            }
        }
        int result = sort_entries(s, entries, (size_t)argument, region_start);
        free(entries);
        if (result < 0)
            return -1;
        break;
    }
    case 6:
        return -1;
    default:
        if (info >= 20 && info <= 22) {
            s->out[s->out_len++] = s->in[p - 1];
        } else if (info == 25) {
            write_float(s, half_to_double((uint16_t)argument));
        } else if (info == 26) {
            write_float(s, single_to_double((uint32_t)argument));
        } else if (info == 27) {
            write_float(s, double_of(argument));
        } else
            return -1;
        break;
    }
    *pos = p;
    return 0;
}

long cbor_canonicalise(const uint8_t *data, size_t start, size_t end, unsigned max_depth,
                       uint8_t *out)
{
    canon_state s = {data, end, out, 0, max_depth};
    size_t pos = start;
    if (canon_item(&s, &pos, 0) < 0 || pos != end)
        return -1;
    return (long)s.out_len;
}

/* -- the snapshot rules' fast path ------------------------------------------------ */

/* The definite text or container head at *pos (advanced past it); 0 when there is none. */
static int read_head(const uint8_t *data, size_t len, size_t *pos, unsigned *major,
                     uint64_t *argument)
{
    if (*pos >= len)
        return 0;
    unsigned info = data[*pos] & 0x1F;
    if (info >= 28 || head_length(info) > len - *pos)
        return 0;
    *major = data[*pos] >> 5;
    *argument = read_argument(data + *pos, info);
    *pos += head_length(info);
    return 1;
}

/* The text item at data[at] (bytes [*start, *end)); 0 when it is not definite text. */
static int text_at(const uint8_t *data, size_t len, size_t at, size_t *start, size_t *end)
{
    unsigned major;
    uint64_t n;
    size_t pos = at;
    if (!read_head(data, len, &pos, &major, &n) || major != 3 || n > len - pos)
        return 0;
    *start = pos;
    *end = pos + (size_t)n;
    return 1;
}

static int text_is(const uint8_t *data, size_t start, size_t end, const char *name)
{
    size_t n = strlen(name);
    return end - start == n && memcmp(data + start, name, n) == 0;
}

/* Where the map at data[at] (ending at end) holds each of the n names as a key: its
 * value's offset in values[k], or 0 when absent; one pass over the map. Returns 0 when
 * the bytes are not such a map. */
static int map_values(const uint8_t *data, size_t end, size_t at, const char *const *names,
                      size_t *values, size_t n)
{
    unsigned major;
    uint64_t count;
    size_t pos = at;
    for (size_t k = 0; k < n; k++)
        values[k] = 0;
    if (!read_head(data, end, &pos, &major, &count) || major != 5 || count > end - pos)
        return 0;
    for (uint64_t i = 0; i < count; i++) {
        size_t key_start, key_end;
        if (!text_at(data, end, pos, &key_start, &key_end))
            return 0;
        size_t value_end = cbor_item_end(data, end, key_end);
        if (!value_end)
            return 0;
        for (size_t k = 0; k < n; k++)
            if (text_is(data, key_start, key_end, names[k]))
                values[k] = key_end;
        pos = value_end;
    }
    return 1;
}

static int map_value(const uint8_t *data, size_t end, size_t at, const char *name,
                     size_t *value)
{
    return map_values(data, end, at, &name, value, 1);
}

/* The array at data[at] (ending at end): its items' count and the first one's offset. */
static int array_items(const uint8_t *data, size_t end, size_t at, uint64_t *count,
                       size_t *first)
{
    unsigned major;
    size_t pos = at;
    if (!read_head(data, end, &pos, &major, count) || major != 4 || *count > end - pos)
        return 0;
    *first = pos;
    return 1;
}

#define MAX_ID_BYTES 1024 /* ops/snapshot.py's MAX_ID_BYTES */

static int session_id_at(const uint8_t *data, size_t end, size_t at, size_t *id_start,
                         size_t *id_end)
{
    size_t id_at;
    if (!map_value(data, end, at, "id", &id_at) || !id_at)
        return 0;
    if (!text_at(data, end, id_at, id_start, id_end))
        return 0;
    size_t n = *id_end - *id_start;
    return n > 0 && n <= MAX_ID_BYTES && !memchr(data + *id_start, 0, n);
}

static int all_text(const uint8_t *data, size_t end, size_t at)
{
    uint64_t count;
    size_t pos, start, stop;
    if (!array_items(data, end, at, &count, &pos))
        return 0;
    for (uint64_t i = 0; i < count; i++) {
        if (!text_at(data, end, pos, &start, &stop))
            return 0;
        pos = stop;
    }
    return 1;
}

/* Every task a map whose parent_session_id is absent, null, empty or the session's id. */
static int tasks_owned(const uint8_t *data, size_t end, size_t at, size_t id_start,
                       size_t id_end)
{
    uint64_t count;
    size_t pos;
    if (!array_items(data, end, at, &count, &pos))
        return 0;
    for (uint64_t i = 0; i < count; i++) {
        size_t task_end = cbor_item_end(data, end, pos), parent_at, start, stop;
        if (!task_end || !map_value(data, task_end, pos, "parent_session_id", &parent_at))
            return 0;
        if (parent_at && data[parent_at] != 0xF6) {
            if (!text_at(data, task_end, parent_at, &start, &stop))
                return 0;
            if (stop != start && (stop - start != id_end - id_start ||
                                  memcmp(data + start, data + id_start, stop - start) != 0))
                return 0;
        }
        pos = task_end;
    }
    return 1;
}

#define MAX_OUTLINED_RUNS 256 /* more run records: Python reads them (ids compared pairwise) */

/* An unsigned integer at data[at] (*value); 0 for anything else. */
static int unsigned_at(const uint8_t *data, size_t end, size_t at, uint64_t *value)
{
    unsigned major;
    size_t pos = at;
    return read_head(data, end, &pos, &major, value) && major == 0;
}

/* A record's events: maps whose `sequence` is an unsigned integer, strictly increasing.
 * *any: there was one; *largest: the last. */
static int events_in_order(const uint8_t *data, size_t end, size_t at, int *any,
                           uint64_t *largest)
{
    uint64_t count;
    size_t pos;
    *any = 0;
    if (!array_items(data, end, at, &count, &pos))
        return 0;
    for (uint64_t i = 0; i < count; i++) {
        size_t event_end = cbor_item_end(data, end, pos), sequence_at;
        uint64_t sequence;
        if (!event_end || !map_value(data, event_end, pos, "sequence", &sequence_at) ||
            !sequence_at || !unsigned_at(data, event_end, sequence_at, &sequence))
            return 0;
        if (*any && sequence <= *largest)
            return 0;
        *any = 1;
        *largest = sequence;
        pos = event_end;
    }
    return 1;
}

/* One run record: its snapshot a map of this session (session_id absent or the
 * session's id), its id absent, null or text (*run_id_at: the text item, or 0), its
 * events in order, and event_count (absent, null, or an unsigned integer) past them. */
static int run_in_order(const uint8_t *data, size_t end, size_t at, size_t id_start,
                        size_t id_end, size_t *run_id_at)
{
    static const char *const record_names[] = {"snapshot", "events"};
    static const char *const snapshot_names[] = {"session_id", "id", "event_count"};
    size_t record[2], fields[3], start, stop;
    if (!map_values(data, end, at, record_names, record, 2) || !record[0])
        return 0;
    size_t snapshot_at = record[0], events_at = record[1];
    size_t snapshot_end = cbor_item_end(data, end, snapshot_at);
    if (!snapshot_end || !map_values(data, snapshot_end, snapshot_at, snapshot_names, fields, 3))
        return 0;
    size_t owner_at = fields[0], count_at = fields[2];
    *run_id_at = fields[1];
    if (owner_at && (!text_at(data, snapshot_end, owner_at, &start, &stop) ||
                     stop - start != id_end - id_start ||
                     memcmp(data + start, data + id_start, stop - start) != 0))
        return 0;
    if (*run_id_at && data[*run_id_at] == 0xF6)
        *run_id_at = 0;
    if (*run_id_at && !text_at(data, snapshot_end, *run_id_at, &start, &stop))
        return 0;
    int any = 0;
    uint64_t largest = 0, event_count;
    if (events_at && !events_in_order(data, end, events_at, &any, &largest))
        return 0;
    if (count_at && data[count_at] != 0xF6) {
        if (!unsigned_at(data, snapshot_end, count_at, &event_count))
            return 0;
        if (any && event_count <= largest)
            return 0;
    }
    return 1;
}

static int same_text(const uint8_t *data, size_t end, size_t a, size_t b)
{
    size_t a_start, a_end, b_start, b_end;
    return text_at(data, end, a, &a_start, &a_end) && text_at(data, end, b, &b_start, &b_end) &&
           a_end - a_start == b_end - b_start &&
           memcmp(data + a_start, data + b_start, a_end - a_start) == 0;
}

/* Every run record in order, no run id twice. */
static int runs_in_order(const uint8_t *data, size_t end, size_t at, size_t id_start,
                         size_t id_end)
{
    uint64_t count;
    size_t pos, ids[MAX_OUTLINED_RUNS], seen = 0;
    if (!array_items(data, end, at, &count, &pos) || count > MAX_OUTLINED_RUNS)
        return 0;
    for (uint64_t i = 0; i < count; i++) {
        size_t record_end = cbor_item_end(data, end, pos), run_id_at;
        if (!record_end || !run_in_order(data, record_end, pos, id_start, id_end, &run_id_at))
            return 0;
        if (run_id_at) {
            for (size_t k = 0; k < seen; k++)
                if (same_text(data, end, ids[k], run_id_at))
                    return 0;
            ids[seen++] = run_id_at;
        }
        pos = record_end;
    }
    return 1;
}

int cbor_snapshot_outline(const uint8_t *data, size_t len, size_t *id_start, size_t *id_end)
{
    unsigned major;
    uint64_t count;
    size_t pos = 0, tasks_at = 0, runs_at = 0;
    int version = 0, session = 0;
    if (!read_head(data, len, &pos, &major, &count) || major != 5 || count > len - pos)
        return 0;
    for (uint64_t i = 0; i < count; i++) {
        size_t key_start, key_end;
        if (!text_at(data, len, pos, &key_start, &key_end))
            return 0;
        size_t at = key_end, end = cbor_item_end(data, len, at);
        if (!end)
            return 0;
        uint64_t items;
        size_t first;
        if (text_is(data, key_start, key_end, "schema_version")) {
            version = end - at == 1 && data[at] == 0x01; /* the integer 1 */
            if (!version)
                return 0;
        } else if (text_is(data, key_start, key_end, "session")) {
            session = session_id_at(data, end, at, id_start, id_end);
            if (!session)
                return 0;
        } else if (text_is(data, key_start, key_end, "artifacts") ||
                   text_is(data, key_start, key_end, "trace_events") ||
                   text_is(data, key_start, key_end, "verification_reports")) {
            if (!array_items(data, end, at, &items, &first))
                return 0;
        } else if (text_is(data, key_start, key_end, "retained_artifact_uris")) {
            if (!all_text(data, end, at))
                return 0;
        } else if (text_is(data, key_start, key_end, "run_records")) {
            runs_at = at; /* read once the session's id is known */
        } else if (text_is(data, key_start, key_end, "subagent_tasks")) {
            tasks_at = at;
        }
        pos = end;
    }
    if (!version || !session || pos != len)
        return 0;
    if (runs_at && !runs_in_order(data, len, runs_at, *id_start, *id_end))
        return 0;
    return !tasks_at || tasks_owned(data, len, tasks_at, *id_start, *id_end);
}
