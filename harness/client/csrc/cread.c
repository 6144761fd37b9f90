/* The raw client's read path in one call (harness/client/cread.py builds and loads it).

   scan(data, decode, sends, t) takes one socket read of a chunked body and does, in C, what
   the Python path does with it in the common case:
   - the framing (chunks.whole_chunks): `data` is exactly a run of whole chunks whose sizes
     are spelled as `%x` (lowercase, no leading zero, below 4 KiB) and match their payloads;
   - the SSE split (sse.SSEParser.feed's fast path, with no partial event held): the body is
     a run of one-line `data: ` events, no CR anywhere;
   - when `decode`, the common OpenAI chunk (fast_events.count_common) for a leading run of
     events: one choice, `token_ids` one integer in [0, 2**63), `finish_reason`,
     `prompt_token_ids` and `usage` null or absent, a `delta` null or absent or an object
     whose `reasoning`, `reasoning_content` and `tool_calls` are null or absent, no `cbbench`
     key, `t_send_ns` an int64 or absent; every other value valid JSON (strict UTF-8, no
     surrogate escape, depth <= 64, numbers <= 64 characters). Its `t_send_ns`, where
     present, goes to `sends` as (t, t_send_ns), as the Python path appends it.
   It accepts less than the Python path (a recognised key spelled with an escape or given
   twice, several choices, an empty-string finish reason, ...): such an event and every later
   one are returned as bytes for the Python loop, which decides them as before.

   Returns None (nothing done: the Python path reads `data`), or (last, payload, n, ascii):
   `last` the body's last chunk came; `payload` the list of the events after the first `n`
   common ones, or the unframed body (bytes) when it is not the simple SSE shape; `ascii`
   every byte of the body is ASCII. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#ifdef __linux__
#include <errno.h>
#include <sys/socket.h>
#include <time.h>
#endif

#define MAX_DEPTH 64
#define MAX_NUMBER 64

typedef const unsigned char *cp;

/* ---- framing ---- */

static cp find_crlf(cp p, cp e) {
    while (p < e) {
        cp r = memchr(p, '\r', (size_t)(e - p));
        if (r == NULL || r + 1 >= e) return NULL;
        if (r[1] == '\n') return r;
        p = r + 1;
    }
    return NULL;
}

/* a size line in the `%x` spelling of 0..4095, else -1 */
static long table_size(cp s, Py_ssize_t n) {
    if (n < 1 || n > 3 || (s[0] == '0' && n > 1)) return -1;
    long v = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int c = s[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else return -1;
        v = v * 16 + d;
    }
    return v;
}

static int all_ascii(cp p, cp e) {
    uint64_t acc = 0, w;
    for (; e - p >= 8; p += 8) {
        memcpy(&w, p, 8);
        acc |= w;
    }
    for (; p < e; p++) acc |= *p;
    return (acc & 0x8080808080808080ULL) == 0;
}

/* ---- JSON (strict; refuses on doubt) ---- */

typedef struct {
    cp p, e;
} J;

static void ws(J *j) {
    while (j->p < j->e && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* one UTF-8 sequence starting at a byte >= 0x80 (strict, as Python decodes): its length */
static int utf8_len(cp p, cp e) {
    int c = p[0], n;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 0;
    if (e - p < n || p[1] < lo || p[1] > hi) return 0;
    for (int i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF) return 0;
    return n;
}

/* bytes a string holds as they are: printable ASCII but the quote and the backslash */
static unsigned char PLAIN[256];

static void init_plain(void) {
    for (int c = 0x20; c < 0x80; c++) PLAIN[c] = c != '"' && c != '\\';
}

/* a string at j->p (its opening quote); *plain: it had no escape. 0 on success */
static int string(J *j, cp *start, Py_ssize_t *len, int *plain) {
    cp p = j->p + 1, e = j->e;
    *start = p;
    *plain = 1;
    while (p < e) {
        while (p < e && PLAIN[*p]) p++;
        if (p >= e) break;
        int c = *p;
        if (c == '"') {
            *len = p - *start;
            j->p = p + 1;
            return 0;
        }
        if (c < 0x20) return -1;
        if (c == '\\') {
            *plain = 0;
            if (p + 1 >= e) return -1;
            c = p[1];
            if (c == 'u') {
                if (e - p < 6) return -1;
                int v = 0;
                for (int i = 2; i < 6; i++) {
                    int h = hexval(p[i]);
                    if (h < 0) return -1;
                    v = v * 16 + h;
                }
                if (v >= 0xD800 && v <= 0xDFFF) return -1;  /* surrogates: the Python path */
                p += 6;
            } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' ||
                       c == 'r' || c == 't') {
                p += 2;
            } else return -1;
        } else if (c >= 0x80) {
            int n = utf8_len(p, e);
            if (!n) return -1;
            p += n;
        } else p++;
    }
    return -1;
}

static int skip_string(J *j) {
    cp s;
    Py_ssize_t n;
    int plain;
    return string(j, &s, &n, &plain);
}

static int digits(J *j) {
    cp s = j->p;
    while (j->p < j->e && *j->p >= '0' && *j->p <= '9') j->p++;
    return j->p > s ? 0 : -1;
}

static int skip_number(J *j) {
    cp s = j->p;
    if (*j->p == '-') j->p++;
    if (j->p >= j->e) return -1;
    if (*j->p == '0') j->p++;
    else if (digits(j)) return -1;
    if (j->p < j->e && *j->p == '.') {
        j->p++;
        if (digits(j)) return -1;
    }
    if (j->p < j->e && (*j->p == 'e' || *j->p == 'E')) {
        j->p++;
        if (j->p < j->e && (*j->p == '+' || *j->p == '-')) j->p++;
        if (digits(j)) return -1;
    }
    return j->p - s <= MAX_NUMBER ? 0 : -1;
}

/* a plain integer (no fraction, no exponent, not -0) in [lo_neg ? -2**63 : 0, 2**63) */
static int integer(J *j, int neg_ok, long long *out) {
    int neg = 0;
    if (j->p < j->e && *j->p == '-') {
        if (!neg_ok) return -1;
        neg = 1;
        j->p++;
    }
    if (j->p >= j->e || *j->p < '0' || *j->p > '9') return -1;
    if (*j->p == '0' && (neg || (j->p + 1 < j->e && j->p[1] >= '0' && j->p[1] <= '9')))
        return -1;
    unsigned long long v = 0, lim = neg ? 9223372036854775808ULL : 9223372036854775807ULL;
    while (j->p < j->e && *j->p >= '0' && *j->p <= '9') {
        unsigned d = *j->p - '0';
        if (v > (lim - d) / 10) return -1;
        v = v * 10 + d;
        j->p++;
    }
    if (j->p < j->e && (*j->p == '.' || *j->p == 'e' || *j->p == 'E')) return -1;
    *out = neg ? (long long)(0 - v) : (long long)v;
    return 0;
}

static int literal(J *j, const char *word, size_t n) {
    if ((size_t)(j->e - j->p) < n || memcmp(j->p, word, n)) return -1;
    j->p += n;
    return 0;
}

static int is_null(J *j) { return literal(j, "null", 4); }

static int skip_value(J *j, int depth);

static int skip_container(J *j, int depth, int object) {
    if (depth > MAX_DEPTH) return -1;
    j->p++;
    ws(j);
    if (j->p < j->e && *j->p == (object ? '}' : ']')) {
        j->p++;
        return 0;
    }
    for (;;) {
        if (object) {
            if (j->p >= j->e || *j->p != '"' || skip_string(j)) return -1;
            ws(j);
            if (j->p >= j->e || *j->p != ':') return -1;
            j->p++;
            ws(j);
        }
        if (skip_value(j, depth + 1)) return -1;
        ws(j);
        if (j->p >= j->e) return -1;
        if (*j->p == ',') {
            j->p++;
            ws(j);
            continue;
        }
        if (*j->p != (object ? '}' : ']')) return -1;
        j->p++;
        return 0;
    }
}

static int skip_value(J *j, int depth) {
    if (j->p >= j->e) return -1;
    switch (*j->p) {
    case '"': return skip_string(j);
    case '{': return skip_container(j, depth, 1);
    case '[': return skip_container(j, depth, 0);
    case 't': return literal(j, "true", 4);
    case 'f': return literal(j, "false", 5);
    case 'n': return is_null(j);
    default:
        if (*j->p == '-' || (*j->p >= '0' && *j->p <= '9')) return skip_number(j);
        return -1;
    }
}

/* an object whose keys we look at: calls `field` per key (plain keys only: an escaped key
   could spell a recognised one), which parses the value and returns 0, or -1 to refuse */
typedef int (*field_fn)(J *j, cp key, Py_ssize_t n, void *ctx);

static int object(J *j, field_fn field, void *ctx) {
    if (j->p >= j->e || *j->p != '{') return -1;
    j->p++;
    ws(j);
    if (j->p < j->e && *j->p == '}') {
        j->p++;
        return 0;
    }
    for (;;) {
        cp key;
        Py_ssize_t n;
        int plain;
        if (j->p >= j->e || *j->p != '"' || string(j, &key, &n, &plain) || !plain) return -1;
        ws(j);
        if (j->p >= j->e || *j->p != ':') return -1;
        j->p++;
        ws(j);
        if (field(j, key, n, ctx)) return -1;
        ws(j);
        if (j->p >= j->e) return -1;
        if (*j->p == ',') {
            j->p++;
            ws(j);
            continue;
        }
        if (*j->p != '}') return -1;
        j->p++;
        return 0;
    }
}

#define KEY(name) (n == (Py_ssize_t)sizeof(name) - 1 && !memcmp(key, name, sizeof(name) - 1))

/* a string value, kept (start, length) when it has no escape; else only checked */
typedef struct {
    cp s;
    Py_ssize_t n;
    int kind; /* 0 absent, 1 a plain string, 2 anything else (null, escapes, another type) */
    int twice;
} Text;

static int text_value(J *j, Text *t) {
    t->twice |= t->kind != 0;
    if (j->p < j->e && *j->p == '"') {
        int plain;
        if (string(j, &t->s, &t->n, &plain)) return -1;
        t->kind = plain ? 1 : 2;
        return 0;
    }
    t->kind = 2;
    return skip_value(j, 2);
}

typedef struct {
    unsigned seen;
    Py_ssize_t keys;
    Text content;
} Delta;

static int delta_field(J *j, cp key, Py_ssize_t n, void *ctx) {
    Delta *d = ctx;
    unsigned bit;
    d->keys++;
    if (KEY("reasoning")) bit = 1;
    else if (KEY("reasoning_content")) bit = 2;
    else if (KEY("tool_calls")) bit = 4;
    else if (KEY("content")) return text_value(j, &d->content);
    else return skip_value(j, 2);
    if (d->seen & bit) return -1;
    d->seen |= bit;
    return is_null(j);
}

typedef struct {
    unsigned seen;
    long long id;
    int message, delta_obj; /* a `message` key; `delta` was an object (its keys in `delta`) */
    int tail;               /* `last`: a finish reason may be a string (kept in `reason`) */
    Text text;
    Delta delta;
    Text reason;
} Choice;

static int choice_field(J *j, cp key, Py_ssize_t n, void *ctx) {
    Choice *c = ctx;
    unsigned bit;
    if (KEY("token_ids")) bit = 1;
    else if (KEY("finish_reason")) bit = 2;
    else if (KEY("prompt_token_ids")) bit = 4;
    else if (KEY("delta")) bit = 8;
    else if (KEY("text")) return text_value(j, &c->text);
    else if (KEY("message")) {
        c->message = 1;
        return skip_value(j, 2);
    } else return skip_value(j, 2);
    if (c->seen & bit) return -1;
    c->seen |= bit;
    if (bit == 1) {
        if (j->p >= j->e || *j->p != '[') return -1;
        j->p++;
        ws(j);
        if (integer(j, 0, &c->id)) return -1;
        ws(j);
        if (j->p >= j->e || *j->p != ']') return -1;
        j->p++;
        return 0;
    }
    if (bit == 8 && j->p < j->e && *j->p == '{') {
        c->delta_obj = 1;
        return object(j, delta_field, &c->delta);
    }
    if (bit == 2 && c->tail && j->p < j->e && *j->p == '"') return text_value(j, &c->reason);
    return is_null(j);
}

typedef struct {
    unsigned seen;
    long long t_send;
    int state_keys; /* `metrics` or `timings`: _apply keeps them (first) */
    int tail;       /* `last`: a `cbbench` object is taken (its bytes in cb, cb_n) */
    cp cb;
    Py_ssize_t cb_n;
    Choice choice;
} Chunk;

static int chunk_field(J *j, cp key, Py_ssize_t n, void *ctx) {
    Chunk *c = ctx;
    unsigned bit;
    if (KEY("choices")) bit = 1;
    else if (KEY("usage")) bit = 2;
    else if (KEY("t_send_ns")) bit = 4;
    else if (KEY("cbbench")) {
        if (!c->tail || c->cb != NULL || j->p >= j->e || *j->p != '{') return -1;
        c->cb = j->p;
        if (skip_value(j, 1)) return -1;
        c->cb_n = j->p - c->cb;
        return 0;
    } else if (KEY("metrics") || KEY("timings")) {
        c->state_keys = 1;
        return skip_value(j, 1);
    } else return skip_value(j, 1);
    if (c->seen & bit) return -1;
    c->seen |= bit;
    if (bit == 2) return is_null(j);
    if (bit == 4) return integer(j, 1, &c->t_send);
    if (j->p >= j->e || *j->p != '[') return -1;  /* exactly one choice */
    j->p++;
    ws(j);
    Choice *ch = &c->choice;
    memset(ch, 0, sizeof(*ch));
    ch->tail = c->tail;
    if (object(j, choice_field, ch) || !(ch->seen & 1)) return -1;
    ws(j);
    if (j->p >= j->e || *j->p != ']') return -1;
    j->p++;
    return 0;
}

static int parse_chunk_as(cp p, Py_ssize_t n, Chunk *c, int tail) {
    J j = {p, p + n};
    memset(c, 0, sizeof(*c));
    c->tail = tail;
    ws(&j);
    if (object(&j, chunk_field, c) || !(c->seen & 1)) return 0;
    ws(&j);
    return j.p == j.e;
}

static int parse_chunk(cp p, Py_ssize_t n, Chunk *c) { return parse_chunk_as(p, n, c, 0); }

/* the common chunk: 1 (t_send_ns in *t_send when *has_send), 0 not it */
static int common(cp p, Py_ssize_t n, long long *t_send, int *has_send) {
    Chunk c;
    if (!parse_chunk(p, n, &c)) return 0;
    *has_send = (c.seen & 4) != 0;
    *t_send = c.t_send;
    return 1;
}

/* ---- the call ---- */

static PyObject *rest_list(cp *starts, Py_ssize_t *lens, Py_ssize_t from, Py_ssize_t k) {
    PyObject *out = PyList_New(k - from);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = from; i < k; i++) {
        PyObject *b = PyBytes_FromStringAndSize((const char *)starts[i], lens[i]);
        if (b == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i - from, b);
    }
    return out;
}

static PyObject *scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyBytes_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "scan(data: bytes, decode, sends, t)");
        return NULL;
    }
    PyObject *sends = args[2] == Py_None ? NULL : args[2], *t = args[3];
    if (sends != NULL && !PyList_CheckExact(sends)) {
        PyErr_SetString(PyExc_TypeError, "sends must be a list or None");
        return NULL;
    }
    int decode = PyObject_IsTrue(args[1]);
    if (decode < 0) return NULL;
    cp d = (cp)PyBytes_AS_STRING(args[0]), de = d + PyBytes_GET_SIZE(args[0]);
    if (de - d < 2 || de[-2] != '\r' || de[-1] != '\n') Py_RETURN_NONE;

    /* pass 1: whole chunks, sizes as their payloads, the body's length and ASCII-ness */
    Py_ssize_t total = 0;
    int last = 0, ascii = 1;
    for (cp p = d; p < de;) {
        if (last) Py_RETURN_NONE;  /* a 0-size chunk before the end */
        cp a = find_crlf(p, de);
        if (a == NULL) Py_RETURN_NONE;
        cp b = find_crlf(a + 2, de);
        if (b == NULL) Py_RETURN_NONE;
        long size = table_size(p, a - p);
        if (size < 0 || size != b - (a + 2)) Py_RETURN_NONE;
        last = size == 0;
        if (ascii) ascii = all_ascii(a + 2, b);
        total += size;
        p = b + 2;
    }
    /* pass 2: the body */
    PyObject *body = PyBytes_FromStringAndSize(NULL, total);
    if (body == NULL) return NULL;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(body), *B = w;
    for (cp p = d; p < de;) {
        cp a = find_crlf(p, de), b = find_crlf(a + 2, de);
        memcpy(w, a + 2, (size_t)(b - a - 2));
        w += b - a - 2;
        p = b + 2;
    }
    PyObject *payload = body;
    Py_ssize_t n_common = 0;
    /* the SSE split: one-line `data: ` events, no CR */
    if (total >= 8 && !memcmp(B, "data: ", 6) && B[total - 2] == '\n' && B[total - 1] == '\n' &&
        memchr(B, '\r', (size_t)total) == NULL) {
        cp starts_small[64], *starts = starts_small;
        Py_ssize_t lens_small[64], *lens = lens_small, cap = 64, k = 0;
        int simple = 1;
        cp p = B + 6, e = B + total - 2;
        for (;;) {
            cp q = memchr(p, '\n', (size_t)(e - p));
            cp end = q ? q : e;
            if (k == cap) {
                cp *s2 = PyMem_Malloc(sizeof(cp) * cap * 2);
                Py_ssize_t *l2 = PyMem_Malloc(sizeof(Py_ssize_t) * cap * 2);
                if (s2 == NULL || l2 == NULL) {
                    PyMem_Free(s2), PyMem_Free(l2);
                    if (starts != starts_small) PyMem_Free(starts), PyMem_Free(lens);
                    Py_DECREF(body);
                    return PyErr_NoMemory();
                }
                memcpy(s2, starts, sizeof(cp) * cap), memcpy(l2, lens, sizeof(Py_ssize_t) * cap);
                if (starts != starts_small) PyMem_Free(starts), PyMem_Free(lens);
                starts = s2, lens = l2, cap *= 2;
            }
            starts[k] = p, lens[k] = end - p, k++;
            if (q == NULL) break;
            if (e - q < 8 || memcmp(q, "\n\ndata: ", 8)) {
                simple = 0;  /* another field, a comment, a multi-line event: sse.py */
                break;
            }
            p = q + 8;
        }
        if (simple) {
            int err = 0;
            if (decode) {
                for (; n_common < k; n_common++) {
                    long long ts;
                    int has;
                    if (!common(starts[n_common], lens[n_common], &ts, &has)) break;
                    if (has && sends != NULL) {
                        PyObject *v = PyLong_FromLongLong(ts);
                        PyObject *pair = v ? PyTuple_Pack(2, t, v) : NULL;
                        Py_XDECREF(v);
                        if (pair == NULL || PyList_Append(sends, pair)) err = 1;
                        Py_XDECREF(pair);
                        if (err) break;
                    }
                }
            }
            payload = err ? NULL : rest_list(starts, lens, n_common, k);
            Py_DECREF(body);
        }
        if (starts != starts_small) PyMem_Free(starts), PyMem_Free(lens);
        if (payload == NULL) return NULL;
    }
    PyObject *res = Py_BuildValue("(ONnO)", last ? Py_True : Py_False, payload, n_common,
                                  ascii ? Py_True : Py_False);
    return res;  /* on failure Py_BuildValue has released `payload` (N) */
}

/* count(events, start, sends, t): how many of `events` from `start` on are the common chunk
   (as scan's decode; their t_send_ns to `sends`): the run after a stream's first answer
   token, which the stream classifier saw first */
static PyObject *count(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "count(events: list, start, sends, t)");
        return NULL;
    }
    PyObject *events = args[0], *sends = args[2] == Py_None ? NULL : args[2], *t = args[3];
    if (sends != NULL && !PyList_CheckExact(sends)) {
        PyErr_SetString(PyExc_TypeError, "sends must be a list or None");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), i;
    if (start == -1 && PyErr_Occurred()) return NULL;
    for (i = start < 0 ? 0 : start; i < PyList_GET_SIZE(events); i++) {
        PyObject *e = PyList_GET_ITEM(events, i);
        long long ts;
        int has;
        if (!PyBytes_CheckExact(e) ||
            !common((cp)PyBytes_AS_STRING(e), PyBytes_GET_SIZE(e), &ts, &has))
            break;
        if (has && sends != NULL) {
            PyObject *v = PyLong_FromLongLong(ts);
            PyObject *pair = v ? PyTuple_Pack(2, t, v) : NULL;
            Py_XDECREF(v);
            int err = pair == NULL || PyList_Append(sends, pair);
            Py_XDECREF(pair);
            if (err) return NULL;
        }
    }
    return PyLong_FromSsize_t(i - (start < 0 ? 0 : start));
}

/* times(chunks, t0) -> (token_times_s, itl_s), or None: response.spread, then
   `(t - t0) / 1e9` per token and the gaps, in one pass with Python's float operations in
   Python's order (int / int and int + float as CPython does them for values below 2**53;
   the build turns FMA contraction off). None (the Python code decides) when a time or t0 is
   outside [0, 2**53), a count outside [1, 2**31), or an item is not a pair of ints. */
#define EXACT ((int64_t)1 << 53)

static PyObject *times(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyLong_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "times(chunks: list, t0: int)");
        return NULL;
    }
    PyObject *chunks = args[0];
    Py_ssize_t m = PyList_GET_SIZE(chunks), n = 0;
    int overflow = 0;
    long long t0 = PyLong_AsLongLongAndOverflow(args[1], &overflow);
    if (m == 0 || overflow || t0 < 0 || t0 >= EXACT) Py_RETURN_NONE;
    for (Py_ssize_t c = 0; c < m; c++) {  /* check every pair first: no partial work */
        PyObject *it = PyList_GET_ITEM(chunks, c);
        if (!PyTuple_CheckExact(it) || PyTuple_GET_SIZE(it) != 2) Py_RETURN_NONE;
        PyObject *a = PyTuple_GET_ITEM(it, 0), *b = PyTuple_GET_ITEM(it, 1);
        if (!PyLong_CheckExact(a) || !PyLong_CheckExact(b)) Py_RETURN_NONE;
        long long t = PyLong_AsLongLongAndOverflow(a, &overflow);
        if (overflow || t < 0 || t >= EXACT) Py_RETURN_NONE;
        long long k = PyLong_AsLongLongAndOverflow(b, &overflow);
        if (overflow || k < 1 || k >= ((long long)1 << 31)) Py_RETURN_NONE;
        n += (Py_ssize_t)k;
    }
    PyObject *tt = PyList_New(n), *itl = PyList_New(n > 0 ? n - 1 : 0);
    if (tt == NULL || itl == NULL) goto fail;
    Py_ssize_t i = 0;
    long long prev = 0;
    double last = 0.0;
    for (Py_ssize_t c = 0; c < m; c++) {
        PyObject *it = PyList_GET_ITEM(chunks, c);
        long long t = PyLong_AsLongLong(PyTuple_GET_ITEM(it, 0));
        long long k = PyLong_AsLongLong(PyTuple_GET_ITEM(it, 1));
        double gap = c == 0 || k == 1 ? 0.0 : (double)(t - prev) / (double)k;
        for (long long j = 0; j < k; j++) {
            long long at = t;  /* the first read's tokens and a one-token read: its stamp */
            if (c > 0 && k != 1) {
                double step = gap * (double)(j + 1);
                at = (long long)((double)prev + step);
            }
            double s = (double)(at - t0) / 1e9;
            PyObject *v = PyFloat_FromDouble(s);
            if (v == NULL) goto fail;
            PyList_SET_ITEM(tt, i, v);
            if (i > 0) {
                PyObject *d = PyFloat_FromDouble(s - last);
                if (d == NULL) goto fail;
                PyList_SET_ITEM(itl, i - 1, d);
            }
            last = s;
            i++;
        }
        prev = t;
    }
    PyObject *out = PyTuple_Pack(2, tt, itl);
    Py_DECREF(tt);
    Py_DECREF(itl);
    return out;
fail:
    Py_XDECREF(tt);
    Py_XDECREF(itl);
    return NULL;
}

/* first(event) -> None | (text, t_send_ns or None): the common chunk (as `common`) whose
   answer-field text the stream classifier needs, for a stream's events before its answer
   began (response._events): the text StreamKinds.add reads, i.e. the choice's `text` when
   its `delta` is null, absent or empty (and it has no `message`), else the delta's
   `content`; a string with no escape and not empty. None (the Python path decides) for
   anything else, for a `metrics` or `timings` key (_apply keeps those) or a text key given
   twice. What _apply then does with such an event is: one token id, the classifier told
   the text (`StreamKinds.content`, then `tokens`), nothing else in the state. */
static PyObject *first(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1 || !PyBytes_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "first(event: bytes)");
        return NULL;
    }
    Chunk c;
    if (!parse_chunk((cp)PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]), &c) ||
        c.state_keys || c.choice.message)
        Py_RETURN_NONE;
    Choice *ch = &c.choice;
    Text *t = ch->delta_obj && ch->delta.keys > 0 ? &ch->delta.content : &ch->text;
    if (t->kind != 1 || t->twice || t->n == 0) Py_RETURN_NONE;
    PyObject *text = PyUnicode_DecodeUTF8((const char *)t->s, t->n, "strict");
    if (text == NULL) return NULL;
    if (!(c.seen & 4)) return Py_BuildValue("(NO)", text, Py_None);
    return Py_BuildValue("(NL)", text, c.t_send);
}


#ifdef __linux__
/* recv(fd, size) -> None | (data, t, delay): one read of a non-blocking socket with its
   receive stamp, as h1conn.SockConn._readable's Python lines do it with socket.recvmsg:
   `now` is CLOCK_MONOTONIC after the read; where the kernel attached SO_TIMESTAMPNS
   (CLOCK_REALTIME), t = min(now, stamp - (realtime - now)) with realtime read after now,
   and the read is kernel-stamped when that is below now (Python's min keeps `now` on a tie:
   a user stamp); delay = now - t then, else -1 and t = now. None: nothing to read (EAGAIN,
   EINTR); b"" at EOF; OSError for any other error. The bytes land in one kept buffer and
   are copied out at their size (no 256 KiB object a read). The GIL is held: the socket
   does not block. */
#define STAMP_OPT 35 /* SO_TIMESTAMPNS(_OLD), as h1conn.SO_TIMESTAMPNS */
#define RECV_MAX (1 << 18)
static char recv_buf[RECV_MAX];

static PyObject *recv_stamped(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "recv(fd, size)");
        return NULL;
    }
    long fd = PyLong_AsLong(args[0]);
    if (fd == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t size = PyLong_AsSsize_t(args[1]);
    if (size == -1 && PyErr_Occurred()) return NULL;
    if (size <= 0 || size > RECV_MAX || fd < 0 || fd > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "recv: fd >= 0 and 0 < size <= 262144");
        return NULL;
    }
    union {
        char buf[CMSG_SPACE(sizeof(struct timespec))];
        struct cmsghdr align;
    } control;
    struct iovec iov = {recv_buf, (size_t)size};
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof control.buf;
    ssize_t n = recvmsg((int)fd, &msg, 0);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) Py_RETURN_NONE;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long now = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec, t = now, delay = -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == STAMP_OPT &&
            c->cmsg_len >= CMSG_LEN(16)) {
            long long sec, nsec;
            memcpy(&sec, CMSG_DATA(c), 8);
            memcpy(&nsec, CMSG_DATA(c) + 8, 8);
            struct timespec rt;
            clock_gettime(CLOCK_REALTIME, &rt);
            long long real = (long long)rt.tv_sec * 1000000000LL + rt.tv_nsec;
            long long k = sec * 1000000000LL + nsec - (real - now);
            if (k < now) {
                t = k;
                delay = now - k;
            }
            break;
        }
    }
    PyObject *data = PyBytes_FromStringAndSize(recv_buf, n);
    if (data == NULL) return NULL;
    return Py_BuildValue("(NLL)", data, t, delay);
}
#endif

/* last(event) -> None | (text, t_send_ns or None, finish_reason or None, cbbench or None):
   a stream's finish chunk, which `first` and `count` refuse: the common chunk (as `first`
   reads it: one token id, the answer-field text, no `metrics`, `timings` or `message`) with
   a finish reason that is a plain non-empty string and/or a `cbbench` object (its bytes, for
   the caller's JSON decode). None for anything else, and for the common chunk itself (no
   finish reason, no `cbbench`: the counted paths take it). What _apply does with such an
   event is what it does with `first`'s, plus `finish` and `cbbench` in the state. */
static PyObject *last(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1 || !PyBytes_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "last(event: bytes)");
        return NULL;
    }
    Chunk c;
    if (!parse_chunk_as((cp)PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]), &c, 1) ||
        c.state_keys || c.choice.message)
        Py_RETURN_NONE;
    Choice *ch = &c.choice;
    Text *r = &ch->reason;
    if (r->kind == 2 || (r->kind == 1 && r->n == 0) || (r->kind == 0 && c.cb == NULL))
        Py_RETURN_NONE;
    Text *t = ch->delta_obj && ch->delta.keys > 0 ? &ch->delta.content : &ch->text;
    if (t->kind != 1 || t->twice || t->n == 0) Py_RETURN_NONE;
    PyObject *out = PyTuple_New(4);
    if (out == NULL) return NULL;
    PyObject *v = PyUnicode_DecodeUTF8((const char *)t->s, t->n, "strict");
    if (v == NULL) goto fail;
    PyTuple_SET_ITEM(out, 0, v);
    if (c.seen & 4) {
        if ((v = PyLong_FromLongLong(c.t_send)) == NULL) goto fail;
    } else v = Py_NewRef(Py_None);
    PyTuple_SET_ITEM(out, 1, v);
    if (r->kind == 1) {
        if ((v = PyUnicode_DecodeUTF8((const char *)r->s, r->n, "strict")) == NULL) goto fail;
    } else v = Py_NewRef(Py_None);
    PyTuple_SET_ITEM(out, 2, v);
    if (c.cb != NULL) {
        if ((v = PyBytes_FromStringAndSize((const char *)c.cb, c.cb_n)) == NULL) goto fail;
    } else v = Py_NewRef(Py_None);
    PyTuple_SET_ITEM(out, 3, v);
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* usage(event) -> None | (prompt_tokens or None, completion_tokens or None): the stream's
   usage chunk (`choices` an empty array, `usage` a non-empty object), as _apply folds it
   (_usage: `prompt_tokens` and `completion_tokens` each an integer, null or absent; no
   `*_tokens_details`, which _usage reads), with no `error`, `cbbench`, `metrics` or
   `timings` key (_apply keeps or raises on those) and no recognised key given twice. None
   for anything else: the Python path decides it. Such an event carries no token. */
typedef struct {
    unsigned seen;
    long long v[2];
    int has[2]; /* the value was an integer (else null or absent) */
    Py_ssize_t keys;
} Usage;

static int usage_field(J *j, cp key, Py_ssize_t n, void *ctx) {
    Usage *u = ctx;
    int i;
    u->keys++;
    if (KEY("prompt_tokens")) i = 0;
    else if (KEY("completion_tokens")) i = 1;
    else if (KEY("prompt_tokens_details") || KEY("completion_tokens_details")) return -1;
    else return skip_value(j, 2);
    if (u->seen & (1u << i)) return -1;
    u->seen |= 1u << i;
    if (j->p < j->e && *j->p == 'n') return is_null(j);
    u->has[i] = 1;
    return integer(j, 1, &u->v[i]);
}

typedef struct {
    unsigned seen;
    Usage usage;
} UsageChunk;

static int usage_chunk_field(J *j, cp key, Py_ssize_t n, void *ctx) {
    UsageChunk *c = ctx;
    unsigned bit;
    if (KEY("choices")) bit = 1;
    else if (KEY("usage")) bit = 2;
    else if (KEY("error") || KEY("cbbench") || KEY("metrics") || KEY("timings")) return -1;
    else return skip_value(j, 1);
    if (c->seen & bit) return -1;
    c->seen |= bit;
    if (bit == 2) return object(j, usage_field, &c->usage);
    if (j->p >= j->e || *j->p != '[') return -1;
    j->p++;
    ws(j);
    if (j->p >= j->e || *j->p != ']') return -1;
    j->p++;
    return 0;
}

static PyObject *usage(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1 || !PyBytes_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "usage(event: bytes)");
        return NULL;
    }
    UsageChunk c;
    memset(&c, 0, sizeof c);
    J j = {(cp)PyBytes_AS_STRING(args[0]), (cp)PyBytes_AS_STRING(args[0]) + PyBytes_GET_SIZE(args[0])};
    ws(&j);
    if (object(&j, usage_chunk_field, &c) || c.seen != 3 || c.usage.keys == 0) Py_RETURN_NONE;
    ws(&j);
    if (j.p != j.e) Py_RETURN_NONE;
    PyObject *out = PyTuple_New(2);
    if (out == NULL) return NULL;
    for (int i = 0; i < 2; i++) {
        PyObject *v = c.usage.has[i] ? PyLong_FromLongLong(c.usage.v[i]) : Py_NewRef(Py_None);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, v);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"count", (PyCFunction)(void (*)(void))count, METH_FASTCALL,
     "count(events, start, sends, t) -> the common chunks from events[start] on"},
    {"last", (PyCFunction)(void (*)(void))last, METH_FASTCALL,
     "last(event) -> None | (text, t_send_ns | None, finish_reason | None, cbbench | None)"},
    {"usage", (PyCFunction)(void (*)(void))usage, METH_FASTCALL,
     "usage(event) -> None | (prompt_tokens | None, completion_tokens | None)"},
    {"first", (PyCFunction)(void (*)(void))first, METH_FASTCALL,
     "first(event) -> None | (text, t_send_ns | None): a common chunk's answer-field text"},
#ifdef __linux__
    {"recv", (PyCFunction)(void (*)(void))recv_stamped, METH_FASTCALL,
     "recv(fd, size) -> None | (data, t_ns, delay_ns or -1): one stamped socket read"},
#endif
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL,
     "scan(data, decode, sends, t) -> None | (last, payload, n_common, ascii)"},
    {"times", (PyCFunction)(void (*)(void))times, METH_FASTCALL,
     "times(chunks, t0) -> None | (token_times_s, itl_s)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cbbench_cread", NULL, -1, methods};

PyMODINIT_FUNC PyInit__cbbench_cread(void) {
    init_plain();
    return PyModule_Create(&module);
}
