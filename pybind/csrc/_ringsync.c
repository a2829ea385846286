/* kvshm._ringsync: the ring writer's ordered accesses to the shared header, on every CPU.
 *
 * The Python writer fills record bytes with plain stores (pack_into, slice copies). What makes them visible to the
 * reader is the tail store, which must be a release; what keeps the doorbell from missing a parked consumer is a
 * store->load fence between the tail store and the load of consumer_parked (shm/FORMAT.md, "Publication protocol"
 * and "Doorbell"). Python has neither, so this module does both, built against the Limited API (abi3, CPython
 * 3.11+, where PyObject_GetBuffer became part of it): one compiled file per platform serves every interpreter.
 *
 * Words(buffer, tail_offset, parked_offset) holds a buffer export of the mapping (mmap.close() refuses until
 * release() is called) and offers:
 *   publish(tail) -> parked   tail store (release, and a full fence before the next load) then consumer_parked
 *   wake() -> int             FUTEX_WAKE (shared) on the low 32 bits of the tail word, all waiters
 *   load_acquire(off) -> int  an 8-byte load (acquire)
 *   store_release(off, v)     an 8-byte store (release)
 *   store_release32(off, v)   a 4-byte store (release)
 *   release()                 drops the buffer export; every later call raises ValueError
 * Offsets are checked (inside the buffer, naturally aligned) once per call, values to fit their width.
 *
 * Linked without libc (-nostdlib, see pybind/setup.py): its only undefined symbols are CPython's and syscall, which
 * the interpreter process provides under glibc and musl alike, so one file serves both manylinux and musllinux.
 */
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#if !defined(__x86_64__) && !defined(__aarch64__)
#warning "kvshm._ringsync: built for a CPU kvshm was not checked on; the generic C11 seq_cst mapping is used"
#endif

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int exported;
    uint64_t *tail;
    uint32_t *parked;
} Words;

static int check_offset(Words *self, Py_ssize_t off, Py_ssize_t width) {
    if (!self->exported) {
        PyErr_SetString(PyExc_ValueError, "kvshm._ringsync: Words released");
        return -1;
    }
    if (off < 0 || off > self->view.len - width || off % width) {
        PyErr_Format(PyExc_ValueError, "kvshm._ringsync: offset %zd is not an aligned %zd-byte word of a %zd-byte buffer",
                     off, width, self->view.len);
        return -1;
    }
    uintptr_t addr = (uintptr_t)self->view.buf + (uintptr_t)off;
    if (addr % (uintptr_t)width) {
        PyErr_SetString(PyExc_ValueError, "kvshm._ringsync: buffer is not aligned");
        return -1;
    }
    return 0;
}

static PyObject *words_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *buf;
    Py_ssize_t tail_off, parked_off;
    static char *kwlist[] = {"buffer", "tail_offset", "parked_offset", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Onn:Words", kwlist, &buf, &tail_off, &parked_off)) {
        return NULL;
    }
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    Words *self = (Words *)alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    if (PyObject_GetBuffer(buf, &self->view, PyBUF_WRITABLE | PyBUF_SIMPLE) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    self->exported = 1;
    if (check_offset(self, tail_off, 8) < 0 || check_offset(self, parked_off, 4) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    self->tail = (uint64_t *)((char *)self->view.buf + tail_off);
    self->parked = (uint32_t *)((char *)self->view.buf + parked_off);
    return (PyObject *)self;
}

static void words_release_view(Words *self) {
    if (self->exported) {
        self->exported = 0;
        PyBuffer_Release(&self->view);
    }
}

static void words_dealloc(PyObject *obj) {
    PyTypeObject *type = Py_TYPE(obj);
    words_release_view((Words *)obj);
    freefunc free_fn = (freefunc)PyType_GetSlot(type, Py_tp_free);
    free_fn(obj);
    Py_DECREF(type);
}

static int as_u64(PyObject *v, uint64_t *out) {
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) {
        return -1;
    }
    *out = (uint64_t)x;
    return 0;
}

/* The publication and the producer half of the doorbell's Dekker pair (store tail, then load parked). The store is
 * a release (every record byte written before it is visible to a reader that loads the tail with acquire), and no
 * later load may be satisfied before it is globally visible, so this load of consumer_parked and the consumer's
 * store of it (a Go seq-cst store, then its load of the tail) cannot miss each other.
 *   x86-64:  XCHG (a locked instruction: a full fence, cheaper than MOV+MFENCE), then a plain MOV load.
 *   aarch64: STLR, then LDAR: an LDAR is never satisfied before an earlier STLR (ARMv8's RCsc acquire/release),
 *            the mapping C11 seq_cst and Go's sync/atomic use.
 *   others:  C11 seq_cst store and load, correct by the language's memory model. */
static PyObject *words_publish(PyObject *obj, PyObject *arg) {
    Words *self = (Words *)obj;
    uint64_t t;
    if (!self->exported) {
        return check_offset(self, 0, 8), NULL;
    }
    if (as_u64(arg, &t) < 0) {
        return NULL;
    }
#if defined(__x86_64__)
    (void)__atomic_exchange_n(self->tail, t, __ATOMIC_SEQ_CST);
    uint32_t parked = __atomic_load_n(self->parked, __ATOMIC_ACQUIRE);
#else
    __atomic_store_n(self->tail, t, __ATOMIC_SEQ_CST);
    uint32_t parked = __atomic_load_n(self->parked, __ATOMIC_SEQ_CST);
#endif
    return PyLong_FromUnsignedLong(parked);
}

/* FUTEX_WAKE on the tail word's low half (little-endian: its first 4 bytes), shared (no FUTEX_PRIVATE_FLAG: the
 * waiter is another process). SYS_futex comes from this platform's headers (202 on x86-64, 98 on aarch64). A wake
 * never blocks, so the GIL stays held. Returns the waiters woken, or -1 (the caller ignores failures: the
 * consumer's park timeout is the fallback). errno is not read: the module imports no libc symbol but syscall. */
static PyObject *words_wake(PyObject *obj, PyObject *unused) {
    Words *self = (Words *)obj;
    (void)unused;
    if (check_offset(self, 0, 8) < 0) {
        return NULL;
    }
    long r = syscall(SYS_futex, (uint32_t *)self->tail, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    return PyLong_FromLong(r < 0 ? -1 : r);
}

static PyObject *words_load_acquire(PyObject *obj, PyObject *arg) {
    Words *self = (Words *)obj;
    Py_ssize_t off = PyLong_AsSsize_t(arg);
    if ((off == -1 && PyErr_Occurred()) || check_offset(self, off, 8) < 0) {
        return NULL;
    }
    uint64_t v = __atomic_load_n((uint64_t *)((char *)self->view.buf + off), __ATOMIC_ACQUIRE);
    return PyLong_FromUnsignedLongLong(v);
}

static PyObject *store(Words *self, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t width) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "kvshm._ringsync: expected (offset, value)");
        return NULL;
    }
    Py_ssize_t off = PyLong_AsSsize_t(args[0]);
    uint64_t v;
    if ((off == -1 && PyErr_Occurred()) || check_offset(self, off, width) < 0 || as_u64(args[1], &v) < 0) {
        return NULL;
    }
    char *p = (char *)self->view.buf + off;
    if (width == 8) {
        __atomic_store_n((uint64_t *)p, v, __ATOMIC_RELEASE);
    } else {
        if (v > UINT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "kvshm._ringsync: value does not fit in 32 bits");
            return NULL;
        }
        __atomic_store_n((uint32_t *)p, (uint32_t)v, __ATOMIC_RELEASE);
    }
    Py_RETURN_NONE;
}

static PyObject *words_store_release(PyObject *obj, PyObject *const *args, Py_ssize_t nargs) {
    return store((Words *)obj, args, nargs, 8);
}

static PyObject *words_store_release32(PyObject *obj, PyObject *const *args, Py_ssize_t nargs) {
    return store((Words *)obj, args, nargs, 4);
}

static PyObject *words_release(PyObject *obj, PyObject *unused) {
    (void)unused;
    words_release_view((Words *)obj);
    Py_RETURN_NONE;
}

static PyMethodDef words_methods[] = {
    {"publish", words_publish, METH_O, "publish(tail) -> consumer_parked: tail store (release + full fence), then the load"},
    {"wake", words_wake, METH_NOARGS, "wake() -> waiters woken, or -1: FUTEX_WAKE on the tail word"},
    {"load_acquire", words_load_acquire, METH_O, "load_acquire(offset) -> u64"},
    {"store_release", (PyCFunction)(void (*)(void))words_store_release, METH_FASTCALL, "store_release(offset, u64)"},
    {"store_release32", (PyCFunction)(void (*)(void))words_store_release32, METH_FASTCALL, "store_release32(offset, u32)"},
    {"release", words_release, METH_NOARGS, "release(): drop the buffer export (idempotent)"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot words_slots[] = {
    {Py_tp_new, words_new},
    {Py_tp_dealloc, words_dealloc},
    {Py_tp_methods, words_methods},
    {Py_tp_doc, "Words(buffer, tail_offset, parked_offset): ordered accesses to a kvshm ring header"},
    {0, NULL},
};

static PyType_Spec words_spec = {
    .name = "kvshm._ringsync.Words",
    .basicsize = sizeof(Words),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = words_slots,
};

static int ringsync_exec(PyObject *m) {
    PyObject *type = PyType_FromSpec(&words_spec);
    if (type == NULL) {
        return -1;
    }
    if (PyModule_AddObject(m, "Words", type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    if (PyModule_AddIntConstant(m, "SYS_FUTEX", SYS_futex) < 0) {
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot ringsync_slots[] = {
    {Py_mod_exec, ringsync_exec},
    {0, NULL},
};

static struct PyModuleDef ringsync_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvshm._ringsync",
    .m_doc = "The ring writer's release store, doorbell fence and futex wake (see Words).",
    .m_size = 0,
    .m_slots = ringsync_slots,
};

PyMODINIT_FUNC PyInit__ringsync(void) { return PyModuleDef_Init(&ringsync_module); }
