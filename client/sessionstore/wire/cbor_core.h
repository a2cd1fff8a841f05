/* The byte-level CBOR checks of sessionstore (see cbor_core.c), free of the
 * CPython API so that a fuzzer links them alone. */
#ifndef SESSIONSTORE_CBOR_CORE_H
#define SESSIONSTORE_CBOR_CORE_H

#include <stddef.h>
#include <stdint.h>

/* cbor_walk's verdicts; the numbers are part of the twin's contract */
enum {
    CB_CANONICAL = 0,  /* allowed, and already in the store's canonical form */
    CB_VALID = 1,      /* allowed; cbor_canonicalise gives its canonical form */
    CB_OTHER = 2,      /* outside what the helper handles: the decoder decides */
    CB_INCOMPLETE = 3, /* the bytes end inside the item */
    CB_ERROR = 4       /* refused; reason and position say why and where */
};

/* reasons, for CB_OTHER and CB_ERROR */
enum {
    CB_R_NONE = 0,
    CB_R_RESERVED = 1,       /* additional information 28-30 */
    CB_R_INDEFINITE = 2,     /* an indefinite length (OTHER) */
    CB_R_TAG = 3,            /* a tag (OTHER for bignums, else ERROR) */
    CB_R_KEY = 4,            /* a map key that is not definite text (OTHER) */
    CB_R_SIMPLE = 5,         /* a simple value other than false/true/null */
    CB_R_UTF8 = 6,           /* text that is not strict UTF-8 */
    CB_R_DEPTH = 7,          /* containers nested deeper than max_depth */
    CB_R_ITEMS = 8,          /* more data items than max_items */
    CB_R_TOO_LARGE = 9,      /* the item would end past the limit */
    CB_R_BREAK = 10,         /* a break byte outside an indefinite container */
    CB_R_DUPLICATE = 11      /* two equal keys in one map (OTHER: the decoder names them) */
};

typedef struct {
    int status;
    int reason;
    size_t position; /* CB_CANONICAL, CB_VALID: where the item ends; else where the verdict fell */
} cb_verdict;

#define CB_MAX_DEPTH 512

typedef struct {
    uint64_t remaining; /* items still to come; a map counts keys and values */
    int is_map;
    int has_key; /* a previous key of this map is at key_start..key_end */
    size_t key_start, key_end;
} cb_frame;

/* A walk over one item that resumes as more bytes arrive. */
typedef struct {
    cb_frame *stack; /* max_depth frames */
    unsigned depth, max_depth;
    uint64_t items, max_items;
    int canonical, finished;
    size_t pos, hard_end;
    cb_verdict final;
} cb_walker;

void cbor_walker_init(cb_walker *s, cb_frame *stack, size_t start, size_t limit,
                       unsigned max_depth, uint64_t max_items);
/* data: the bytes of every earlier call, and perhaps more after them */
cb_verdict cbor_walker_run(cb_walker *s, const uint8_t *data, size_t len);

/* One item starting at data[start]; it may extend at most `limit` bytes. */
cb_verdict cbor_walk(const uint8_t *data, size_t len, size_t start, size_t limit,
                     unsigned max_depth, uint64_t max_items);

/* The canonical form of the CB_CANONICAL or CB_VALID item data[start:end) into a
 * buffer of at least (end - start) bytes: canonical form is never longer. Returns
 * its length, or -1 when the item is not one of those (duplicate keys included). */
long cbor_canonicalise(const uint8_t *data, size_t start, size_t end, unsigned max_depth,
                       uint8_t *out);

/* Where the item at data[start] ends, for bytes already walked; 0 when malformed. */
size_t cbor_item_end(const uint8_t *data, size_t len, size_t start);

/* The usual stored snapshot (data: the canonical bytes of one map, all of data):
 * 1 when every snapshot rule holds without decoding anything, the session id's text
 * at data[*id_start, *id_end); 0 when the rules in Python must decide (a rule
 * broken, a run id that is not text, many run records, or bytes not as expected). */
int cbor_snapshot_outline(const uint8_t *data, size_t len, size_t *id_start, size_t *id_end);

#endif
