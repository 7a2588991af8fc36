/*
 * shoal.queues._native -- C11 atomics for the shared-memory SPSC rings and doorbells.
 *
 * RingCore(buf, offset, capacity, empty, ok, full): one ring at buf[offset:], see
 * ring.py for the layout.  Each push/pop is one C call: header loads, memcpy, wrap
 * handling, bytes construction and the publishing store.
 *   producer: load head (acquire), copy record, store tail (release)
 *   consumer: load tail (acquire), copy record out, store head (release)
 * BellCore(buf, offset, wake_fd): the sleeping flag of a Doorbell (parking.py).
 *   ring():  seq_cst fence; if flag: write(wake_fd, 1)       -- producer, after publishing
 *   arm():   flag = 1 (seq_cst); seq_cst fence                -- consumer, before re-checking
 * The two seq_cst fences make the Dekker handshake safe on weakly ordered CPUs.
 * The object holds a Py_buffer (PyBUF_WRITABLE) on buf until release()/dealloc.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define RING_HEADER 128
#define TAIL_OFFSET 64
#define REC_BYTES 8
#define FLAG_WRAP 1u

typedef _Atomic uint64_t atomic_u64;
typedef _Atomic uint32_t atomic_u32;

/* ------------------------------------------------------------------ RingCore */

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int has_view;
    atomic_u64 *head;
    atomic_u64 *tail;
    unsigned char *data;
    uint64_t cap;
    uint64_t mask;
    uint64_t max_message;
    PyObject *empty;
    PyObject *ok;
    PyObject *full;
} RingCore;

static void
ringcore_release_view(RingCore *self)
{
    if (self->has_view) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
    }
    self->head = self->tail = NULL;
    self->data = NULL;
}

static int
ringcore_init(RingCore *self, PyObject *args, PyObject *kwds)
{
    PyObject *buf, *empty, *ok, *full;
    Py_ssize_t offset;
    unsigned long long cap;
    static char *kwlist[] = {"buf", "offset", "capacity", "empty", "ok", "full", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OnKOOO", kwlist, &buf, &offset, &cap,
                                     &empty, &ok, &full))
        return -1;
    if (cap < 4096 || (cap & (cap - 1)) || cap > (1ull << 32)) {
        PyErr_Format(PyExc_ValueError,
                     "capacity must be a power of two between 4096 and 4294967296, got capacity=%llu", cap);
        return -1;
    }
    ringcore_release_view(self);
    if (PyObject_GetBuffer(buf, &self->view, PyBUF_WRITABLE) < 0)
        return -1;
    self->has_view = 1;
    if (offset < 0 || (uint64_t)offset + RING_HEADER + cap > (uint64_t)self->view.len) {
        PyErr_Format(PyExc_ValueError, "ring at offset=%zd of %llu bytes does not fit a %zd-byte buffer",
                     offset, (unsigned long long)(RING_HEADER + cap), self->view.len);
        ringcore_release_view(self);
        return -1;
    }
    unsigned char *base = (unsigned char *)self->view.buf + offset;
    if ((uintptr_t)base % 64) {
        PyErr_Format(PyExc_ValueError, "ring header must be 64-byte aligned (offset=%zd)", offset);
        ringcore_release_view(self);
        return -1;
    }
    self->head = (atomic_u64 *)base;
    self->tail = (atomic_u64 *)(base + TAIL_OFFSET);
    self->data = base + RING_HEADER;
    self->cap = cap;
    self->mask = cap - 1;
    self->max_message = cap / 4;
    Py_INCREF(empty); Py_XSETREF(self->empty, empty);
    Py_INCREF(ok); Py_XSETREF(self->ok, ok);
    Py_INCREF(full); Py_XSETREF(self->full, full);
    return 0;
}

static void
ringcore_dealloc(RingCore *self)
{
    ringcore_release_view(self);
    Py_CLEAR(self->empty);
    Py_CLEAR(self->ok);
    Py_CLEAR(self->full);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define RING_CHECK(self)                                              \
    if ((self)->head == NULL) {                                       \
        PyErr_SetString(PyExc_ValueError, "ring has been released"); \
        return NULL;                                                  \
    }

static inline uint64_t pad8(uint64_t n) { return (n + 7) & ~(uint64_t)7; }

static inline void
put_rec(unsigned char *p, uint32_t len, uint32_t flags)
{
    memcpy(p, &len, 4);
    memcpy(p + 4, &flags, 4);
}

static inline void
get_rec(const unsigned char *p, uint32_t *len, uint32_t *flags)
{
    memcpy(len, p, 4);
    memcpy(flags, p + 4, 4);
}

/* producer only */
static PyObject *
ringcore_push(RingCore *self, PyObject *arg)
{
    RING_CHECK(self);
    const char *src;
    Py_ssize_t n;
    Py_buffer pb;
    int have_pb = 0;
    PyObject *tmp = NULL, *result;

    if (PyBytes_CheckExact(arg)) {
        src = PyBytes_AS_STRING(arg);
        n = PyBytes_GET_SIZE(arg);
    }
    else if (PyObject_GetBuffer(arg, &pb, PyBUF_SIMPLE) == 0) {
        have_pb = 1;
        src = pb.buf;
        n = pb.len;
    }
    else {
        PyErr_Clear(); /* e.g. a non-contiguous memoryview: copy it */
        tmp = PyBytes_FromObject(arg);
        if (tmp == NULL)
            return NULL;
        src = PyBytes_AS_STRING(tmp);
        n = PyBytes_GET_SIZE(tmp);
    }
    if ((uint64_t)n > self->max_message) {
        PyErr_Format(PyExc_ValueError,
                     "payload of %zd bytes exceeds max_message=%llu (capacity %llu); fragment it", n,
                     (unsigned long long)self->max_message, (unsigned long long)self->cap);
        result = NULL;
        goto done;
    }
    uint64_t tail = atomic_load_explicit(self->tail, memory_order_relaxed); /* ours */
    uint64_t head = atomic_load_explicit(self->head, memory_order_acquire);
    uint64_t freeb = self->cap - (tail - head);
    uint64_t need = REC_BYTES + pad8((uint64_t)n);
    uint64_t pos = tail & self->mask;
    uint64_t advance;
    if (pos + need > self->cap) {
        uint64_t skip = self->cap - pos;
        if (skip + need > freeb) {
            result = self->full;
            goto done_ref;
        }
        put_rec(self->data + pos, 0, FLAG_WRAP);
        pos = 0;
        advance = skip + need;
    }
    else {
        if (need > freeb) {
            result = self->full;
            goto done_ref;
        }
        advance = need;
    }
    put_rec(self->data + pos, (uint32_t)n, 0);
    memcpy(self->data + pos + REC_BYTES, src, (size_t)n);
    atomic_store_explicit(self->tail, tail + advance, memory_order_release);
    result = self->ok;
done_ref:
    Py_INCREF(result);
done:
    if (have_pb)
        PyBuffer_Release(&pb);
    Py_XDECREF(tmp);
    return result;
}

/* consumer only: read the record at *head (following a wrap marker); NULL on error */
static inline PyObject *
take_record(RingCore *self, uint64_t *head)
{
    uint64_t h = *head;
    uint64_t pos = h & self->mask;
    uint32_t len, flags;
    get_rec(self->data + pos, &len, &flags);
    if (flags & FLAG_WRAP) {
        h += self->cap - pos;
        pos = 0;
        get_rec(self->data, &len, &flags);
    }
    if (len > self->max_message) {
        PyErr_Format(PyExc_RuntimeError, "ring corrupted: record of %u bytes at position %llu", len,
                     (unsigned long long)pos);
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize((const char *)self->data + pos + REC_BYTES, len);
    if (out != NULL)
        *head = h + REC_BYTES + pad8(len);
    return out;
}

static PyObject *
ringcore_pop(RingCore *self, PyObject *Py_UNUSED(ignored))
{
    RING_CHECK(self);
    uint64_t head = atomic_load_explicit(self->head, memory_order_relaxed); /* ours */
    uint64_t tail = atomic_load_explicit(self->tail, memory_order_acquire);
    if (head == tail) {
        Py_INCREF(self->empty);
        return self->empty;
    }
    PyObject *out = take_record(self, &head);
    if (out != NULL)
        atomic_store_explicit(self->head, head, memory_order_release);
    return out;
}

static PyObject *
ringcore_pop_many(RingCore *self, PyObject *const *args, Py_ssize_t nargs)
{
    RING_CHECK(self);
    Py_ssize_t max_n = 64;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "pop_many(max_n=64) takes at most one argument");
        return NULL;
    }
    if (nargs == 1) {
        max_n = PyLong_AsSsize_t(args[0]);
        if (max_n == -1 && PyErr_Occurred())
            return NULL;
    }
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return NULL;
    uint64_t head = atomic_load_explicit(self->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(self->tail, memory_order_acquire);
    Py_ssize_t count = 0;
    while (head != tail && count < max_n) {
        PyObject *rec = take_record(self, &head);
        if (rec == NULL || PyList_Append(list, rec) < 0) {
            Py_XDECREF(rec);
            Py_DECREF(list); /* head not published: the records stay in the ring */
            return NULL;
        }
        Py_DECREF(rec);
        count++;
    }
    if (count)
        atomic_store_explicit(self->head, head, memory_order_release);
    return list;
}

static PyObject *
ringcore_readable(RingCore *self, PyObject *Py_UNUSED(ignored))
{
    RING_CHECK(self);
    uint64_t head = atomic_load_explicit(self->head, memory_order_acquire);
    uint64_t tail = atomic_load_explicit(self->tail, memory_order_acquire);
    return PyBool_FromLong(head != tail);
}

static PyObject *
ringcore_used_bytes(RingCore *self, PyObject *Py_UNUSED(ignored))
{
    RING_CHECK(self);
    uint64_t head = atomic_load_explicit(self->head, memory_order_acquire);
    uint64_t tail = atomic_load_explicit(self->tail, memory_order_acquire);
    return PyLong_FromUnsignedLongLong(tail - head);
}

static PyObject *
ringcore_release(RingCore *self, PyObject *Py_UNUSED(ignored))
{
    ringcore_release_view(self);
    Py_RETURN_NONE;
}

static PyMethodDef ringcore_methods[] = {
    {"push", (PyCFunction)ringcore_push, METH_O, "Producer only: push bytes-like; returns ok or full."},
    {"pop", (PyCFunction)ringcore_pop, METH_NOARGS, "Consumer only: next record as bytes, or empty."},
    {"pop_many", (PyCFunction)(void (*)(void))ringcore_pop_many, METH_FASTCALL,
     "Consumer only: up to max_n records (default 64), one head publish."},
    {"readable", (PyCFunction)ringcore_readable, METH_NOARGS, "head != tail"},
    {"used_bytes", (PyCFunction)ringcore_used_bytes, METH_NOARGS, "tail - head"},
    {"release", (PyCFunction)ringcore_release, METH_NOARGS, "Release the buffer (idempotent)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RingCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shoal.queues._native.RingCore",
    .tp_doc = "RingCore(buf, offset, capacity, empty, ok, full): SPSC ring over a writable buffer.",
    .tp_basicsize = sizeof(RingCore),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ringcore_init,
    .tp_dealloc = (destructor)ringcore_dealloc,
    .tp_methods = ringcore_methods,
};

/* ------------------------------------------------------------------ BellCore */

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int has_view;
    atomic_u32 *flag;
    int wfd;
} BellCore;

static void
bellcore_release_view(BellCore *self)
{
    if (self->has_view) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
    }
    self->flag = NULL;
}

static int
bellcore_init(BellCore *self, PyObject *args, PyObject *kwds)
{
    PyObject *buf;
    Py_ssize_t offset;
    int wfd;
    static char *kwlist[] = {"buf", "offset", "wake_fd", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Oni", kwlist, &buf, &offset, &wfd))
        return -1;
    bellcore_release_view(self);
    if (PyObject_GetBuffer(buf, &self->view, PyBUF_WRITABLE) < 0)
        return -1;
    self->has_view = 1;
    unsigned char *p = (unsigned char *)self->view.buf + offset;
    if (offset < 0 || offset + 4 > self->view.len || (uintptr_t)p % 4) {
        PyErr_Format(PyExc_ValueError, "doorbell offset=%zd out of range or misaligned", offset);
        bellcore_release_view(self);
        return -1;
    }
    self->flag = (atomic_u32 *)p;
    self->wfd = wfd;
    return 0;
}

static void
bellcore_dealloc(BellCore *self)
{
    bellcore_release_view(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define BELL_CHECK(self)                                                  \
    if ((self)->flag == NULL) {                                           \
        PyErr_SetString(PyExc_ValueError, "doorbell has been released"); \
        return NULL;                                                      \
    }

/* any producer, after publishing */
static PyObject *
bellcore_ring(BellCore *self, PyObject *Py_UNUSED(ignored))
{
    BELL_CHECK(self);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(self->flag, memory_order_relaxed)) {
        uint64_t one = 1;
        ssize_t r;
        do {
            r = write(self->wfd, &one, sizeof one);
        } while (r < 0 && errno == EINTR);
        if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

/* owner only, before re-checking readiness */
static PyObject *
bellcore_arm(BellCore *self, PyObject *Py_UNUSED(ignored))
{
    BELL_CHECK(self);
    atomic_store_explicit(self->flag, 1, memory_order_seq_cst);
    atomic_thread_fence(memory_order_seq_cst);
    Py_RETURN_NONE;
}

/* owner only */
static PyObject *
bellcore_disarm(BellCore *self, PyObject *Py_UNUSED(ignored))
{
    BELL_CHECK(self);
    atomic_store_explicit(self->flag, 0, memory_order_release);
    Py_RETURN_NONE;
}

static PyObject *
bellcore_sleeping(BellCore *self, PyObject *Py_UNUSED(ignored))
{
    BELL_CHECK(self);
    return PyBool_FromLong(atomic_load_explicit(self->flag, memory_order_acquire) != 0);
}

static PyObject *
bellcore_release(BellCore *self, PyObject *Py_UNUSED(ignored))
{
    bellcore_release_view(self);
    Py_RETURN_NONE;
}

static PyMethodDef bellcore_methods[] = {
    {"ring", (PyCFunction)bellcore_ring, METH_NOARGS, "Fence; wake the owner if it sleeps."},
    {"arm", (PyCFunction)bellcore_arm, METH_NOARGS, "Set the sleeping flag; fence."},
    {"disarm", (PyCFunction)bellcore_disarm, METH_NOARGS, "Clear the sleeping flag."},
    {"sleeping", (PyCFunction)bellcore_sleeping, METH_NOARGS, "Whether the flag is set."},
    {"release", (PyCFunction)bellcore_release, METH_NOARGS, "Release the buffer (idempotent)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject BellCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shoal.queues._native.BellCore",
    .tp_doc = "BellCore(buf, offset, wake_fd): the sleeping flag of a Doorbell.",
    .tp_basicsize = sizeof(BellCore),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)bellcore_init,
    .tp_dealloc = (destructor)bellcore_dealloc,
    .tp_methods = bellcore_methods,
};

/* ------------------------------------------------------------------ module */

static PyObject *
native_fence(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    atomic_thread_fence(memory_order_seq_cst);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"fence", native_fence, METH_NOARGS, "A sequentially consistent (full) fence."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "shoal.queues._native",
    .m_doc = "C11 atomics for shoal's shared-memory rings and doorbells.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    if (PyType_Ready(&RingCoreType) < 0 || PyType_Ready(&BellCoreType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&native_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&RingCoreType);
    if (PyModule_AddObject(m, "RingCore", (PyObject *)&RingCoreType) < 0) {
        Py_DECREF(&RingCoreType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&BellCoreType);
    if (PyModule_AddObject(m, "BellCore", (PyObject *)&BellCoreType) < 0) {
        Py_DECREF(&BellCoreType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
