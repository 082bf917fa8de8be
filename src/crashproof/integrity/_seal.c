/* The v2 record MAC in one call: crashproof.integrity.seal's message and HMAC-SHA256,
 * byte for byte, for the records a live run writes and a load verifies.
 *
 * Why native code: a trivial journaled step costs ~14 us of CPython, and sealing it in
 * Python (an f-string message, then six hashlib calls for the two keyed SHA-256 states)
 * cost ~2 us more, which no pure-Python arrangement brought under ~1.2 us (measured:
 * docs/benchmarks.md). Here the message is built in one buffer and hashed with
 * OpenSSL's SHA-256 (its SHA instructions where the CPU has them) from keyed states
 * copied by memcpy: ~0.2 us.
 *
 * Optional by design: setup.py builds it when a compiler and OpenSSL's headers are
 * there; without it seal.py computes the same MACs in Python. It never decides what a
 * record means: anything unusual (a field of another type, a lone surrogate, a number
 * out of range) raises TypeError or UnicodeEncodeError and seal.py's Python path
 * decides. tests/unit/test_seal_native.py pins every output to the standard library's
 * HMAC over seal._message_v2.
 */
#define PY_SSIZE_T_CLEAN
#define OPENSSL_SUPPRESS_DEPRECATED /* SHA256_CTX: a plain struct, copied without malloc */
#include <Python.h>
#include <float.h>
#include <math.h>
#include <string.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>

#define BLOCK 64
#define PREFIX "crashproof-record-v2|"
#define PREFIX_LEN (sizeof(PREFIX) - 1)
#define STAMP_MAX 32  /* "-0x1.fffffffffffffp+1023": 24 characters */
#define INT_MAX_LEN 21 /* "-9223372036854775808" and one to spare */
#define STACK_MESSAGE 1024

typedef struct {
    SHA256_CTX inner; /* SHA-256 after absorbing K ^ ipad */
    SHA256_CTX outer; /* SHA-256 after absorbing K ^ opad */
} Keyed;

static const char HEX[] = "0123456789abcdef";

/* keyed_state(secret: bytes) -> bytes: the key's two HMAC states (RFC 2104), opaque. */
static PyObject *
keyed_state(PyObject *module, PyObject *arg)
{
    Py_buffer secret;
    unsigned char block[BLOCK], pad[BLOCK];
    Keyed keyed;
    (void)module;
    if (PyObject_GetBuffer(arg, &secret, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    memset(block, 0, BLOCK);
    if (secret.len > BLOCK) {
        SHA256(secret.buf, (size_t)secret.len, block);
    }
    else {
        memcpy(block, secret.buf, (size_t)secret.len);
    }
    PyBuffer_Release(&secret);
    for (int i = 0; i < BLOCK; i++) {
        pad[i] = block[i] ^ 0x36;
    }
    SHA256_Init(&keyed.inner);
    SHA256_Update(&keyed.inner, pad, BLOCK);
    for (int i = 0; i < BLOCK; i++) {
        pad[i] = block[i] ^ 0x5c;
    }
    SHA256_Init(&keyed.outer);
    SHA256_Update(&keyed.outer, pad, BLOCK);
    PyObject *state = PyBytes_FromStringAndSize((const char *)&keyed, sizeof keyed);
    OPENSSL_cleanse(block, BLOCK); /* a plain memset may be optimised away */
    OPENSSL_cleanse(pad, BLOCK);
    OPENSSL_cleanse(&keyed, sizeof keyed);
    return state;
}

/* Decimal digits of n at p; returns how many. */
static size_t
put_int(char *p, long long n)
{
    char digits[INT_MAX_LEN];
    size_t len = 0, out = 0;
    unsigned long long u = n < 0 ? 0ULL - (unsigned long long)n : (unsigned long long)n;
    do {
        digits[len++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (n < 0) {
        p[out++] = '-';
    }
    while (len) {
        p[out++] = digits[--len];
    }
    return out;
}

/* float.hex(x) at p, exactly as CPython writes it (Objects/floatobject.c: 13 hex digits
 * after the point, never trimmed; repr for nan and the infinities); returns the length. */
static size_t
put_stamp(char *p, double x)
{
    size_t n = 0;
    int e, shift;
    double m;
    if (isnan(x)) {
        memcpy(p, "nan", 3);
        return 3;
    }
    if (isinf(x)) {
        if (x < 0) {
            memcpy(p, "-inf", 4);
            return 4;
        }
        memcpy(p, "inf", 3);
        return 3;
    }
    if (x == 0.0) {
        if (copysign(1.0, x) == -1.0) {
            memcpy(p, "-0x0.0p+0", 9);
            return 9;
        }
        memcpy(p, "0x0.0p+0", 8);
        return 8;
    }
    if (x < 0.0) {
        p[n++] = '-';
    }
    p[n++] = '0';
    p[n++] = 'x';
    m = frexp(fabs(x), &e);
    shift = 1 - (DBL_MIN_EXP - e > 0 ? DBL_MIN_EXP - e : 0);
    m = ldexp(m, shift);
    e -= shift;
    p[n++] = HEX[(int)m];
    m -= (int)m;
    p[n++] = '.';
    for (int i = 0; i < 13; i++) {
        m *= 16.0;
        p[n++] = HEX[(int)m];
        m -= (int)m;
    }
    p[n++] = 'p';
    if (e < 0) {
        p[n++] = '-';
        e = -e;
    }
    else {
        p[n++] = '+';
    }
    return n + put_int(p + n, e);
}

/* A str field's UTF-8 and its length in code points (what seal.py's len() counts). */
typedef struct {
    const char *utf8;
    Py_ssize_t size;  /* bytes */
    Py_ssize_t chars; /* code points */
} Text;

static int
text_of(PyObject *obj, Text *text, const char *what)
{
    if (!PyUnicode_CheckExact(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: not a str", what);
        return -1;
    }
    text->utf8 = PyUnicode_AsUTF8AndSize(obj, &text->size);
    if (text->utf8 == NULL) {
        return -1; /* UnicodeEncodeError: a lone surrogate */
    }
    text->chars = PyUnicode_GET_LENGTH(obj);
    return 0;
}

/* A field that may be None: "-1:None" as seal.py writes it, else "<len>:<text>". */
static int
optional_of(PyObject *obj, Text *text, const char *what)
{
    if (obj == Py_None) {
        text->utf8 = "None";
        text->size = 4;
        text->chars = -1;
        return 0;
    }
    return text_of(obj, text, what);
}

#define PUT(src, len)                  \
    do {                               \
        memcpy(p, (src), (size_t)(len)); \
        p += (len);                    \
    } while (0)

/* mac_v2(state, run_id, seq, type, key, payload, value, created_at, prev_mac) -> str:
 * "v2:" and the hex HMAC-SHA256 of the record's v2 message (seal._message_v2). */
static PyObject *
mac_v2(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Text run_id, type_, key, payload, value, prev_mac;
    long long seq;
    int overflow;
    double created_at;
    char stack[STACK_MESSAGE];
    char *message, *p;
    size_t bound;
    Keyed keyed;
    unsigned char digest[SHA256_DIGEST_LENGTH];

    (void)module;
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "mac_v2 takes 9 arguments");
        return NULL;
    }
    if (!PyBytes_CheckExact(args[0]) || PyBytes_GET_SIZE(args[0]) != (Py_ssize_t)sizeof keyed) {
        PyErr_SetString(PyExc_TypeError, "mac_v2: state is not keyed_state()'s");
        return NULL;
    }
    if (!PyLong_CheckExact(args[2]) || !PyFloat_CheckExact(args[7])) {
        PyErr_SetString(PyExc_TypeError, "mac_v2: seq or created_at of another type");
        return NULL;
    }
    seq = PyLong_AsLongLongAndOverflow(args[2], &overflow);
    if (overflow || (seq == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "mac_v2: seq out of range");
        return NULL;
    }
    created_at = PyFloat_AS_DOUBLE(args[7]);
    if (text_of(args[1], &run_id, "run_id") < 0 || text_of(args[3], &type_, "type") < 0
        || optional_of(args[4], &key, "key") < 0 || text_of(args[5], &payload, "payload") < 0
        || optional_of(args[6], &value, "value") < 0
        || text_of(args[8], &prev_mac, "prev_mac") < 0) {
        return NULL;
    }

    /* PREFIX len ":" run_id "|" seq "|" type "|" len ":" key "|" len ":" payload "|"
       len ":" value "|" stamp "|" prev_mac */
    bound = PREFIX_LEN + (size_t)run_id.size + (size_t)type_.size + (size_t)key.size
            + (size_t)payload.size + (size_t)value.size + (size_t)prev_mac.size
            + 5 * INT_MAX_LEN + STAMP_MAX + 16;
    message = bound <= STACK_MESSAGE ? stack : PyMem_Malloc(bound);
    if (message == NULL) {
        return PyErr_NoMemory();
    }
    p = message;
    PUT(PREFIX, PREFIX_LEN);
    p += put_int(p, run_id.chars);
    *p++ = ':';
    PUT(run_id.utf8, run_id.size);
    *p++ = '|';
    p += put_int(p, seq);
    *p++ = '|';
    PUT(type_.utf8, type_.size);
    *p++ = '|';
    p += put_int(p, key.chars);
    *p++ = ':';
    PUT(key.utf8, key.size);
    *p++ = '|';
    p += put_int(p, payload.chars);
    *p++ = ':';
    PUT(payload.utf8, payload.size);
    *p++ = '|';
    p += put_int(p, value.chars);
    *p++ = ':';
    PUT(value.utf8, value.size);
    *p++ = '|';
    p += put_stamp(p, created_at);
    *p++ = '|';
    PUT(prev_mac.utf8, prev_mac.size);

    memcpy(&keyed, PyBytes_AS_STRING(args[0]), sizeof keyed);
    SHA256_Update(&keyed.inner, message, (size_t)(p - message));
    SHA256_Final(digest, &keyed.inner);
    SHA256_Update(&keyed.outer, digest, sizeof digest);
    SHA256_Final(digest, &keyed.outer); /* clears the block it buffered; what is left is
                                           the MAC, which is public */
    if (message != stack) {
        PyMem_Free(message);
    }

    PyObject *mac = PyUnicode_New(3 + 2 * SHA256_DIGEST_LENGTH, 127);
    if (mac == NULL) {
        return NULL;
    }
    Py_UCS1 *out = PyUnicode_1BYTE_DATA(mac);
    out[0] = 'v';
    out[1] = '2';
    out[2] = ':';
    for (int i = 0; i < SHA256_DIGEST_LENGTH; i++) {
        out[3 + 2 * i] = (Py_UCS1)HEX[digest[i] >> 4];
        out[4 + 2 * i] = (Py_UCS1)HEX[digest[i] & 15];
    }
    return mac;
}

static PyMethodDef methods[] = {
    {"keyed_state", keyed_state, METH_O, "The two keyed HMAC-SHA256 states of a secret."},
    {"mac_v2", (PyCFunction)(void (*)(void))mac_v2, METH_FASTCALL,
     "'v2:' and the HMAC-SHA256 hex of a record's v2 message."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "crashproof.integrity._seal",
    "The v2 record MAC in native code (optional; seal.py has the same in Python).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__seal(void)
{
    return PyModule_Create(&module);
}
