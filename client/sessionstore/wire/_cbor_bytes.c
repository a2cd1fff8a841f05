/* sessionstore._cbor_bytes: the CPython face of cbor_core.c (its theory of
 * operation is there). Its functions, each of bytes and small integers:
 *
 *   walk(data, start, limit, max_depth, max_items) -> (status, reason, position)
 *   Walker(start, limit, max_depth, max_items).walk(data): the same, resumable
 *   canonicalise(data, start, end, max_depth) -> bytes | None
 *   entries(data, start[, end]) -> tuple of offsets (end: where the container is
 *       known to end, so that its last item need not be walked)
 *   snapshot_outline(data) -> (id_start, id_end) | None
 *
 * The twin in Python is sessionstore/cbor_bytes_python.py. A walk of a large
 * immutable bytes object runs without the GIL. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "cbor_core.h"

#define RELEASE_GIL_ABOVE_BYTES (64 * 1024)
#define MAX_DEPTH_ACCEPTED 512

static int checked_range(Py_ssize_t length, Py_ssize_t start, Py_ssize_t end)
{
    if (start < 0 || end < start || end > length) {
        PyErr_SetString(PyExc_ValueError, "offsets outside the data");
        return 0;
    }
    return 1;
}

static int checked_depth(long max_depth)
{
    if (max_depth < 0 || max_depth > MAX_DEPTH_ACCEPTED) {
        PyErr_Format(PyExc_ValueError, "max_depth must be 0..%d", MAX_DEPTH_ACCEPTED);
        return 0;
    }
    return 1;
}

static cb_verdict run_walker(cb_walker *s, Py_buffer *view)
{
    cb_verdict v;
    if (view->len > RELEASE_GIL_ABOVE_BYTES && view->obj && PyBytes_CheckExact(view->obj)) {
        Py_BEGIN_ALLOW_THREADS
        v = cbor_walker_run(s, view->buf, (size_t)view->len);
        Py_END_ALLOW_THREADS
    } else {
        v = cbor_walker_run(s, view->buf, (size_t)view->len);
    }
    return v;
}

typedef struct {
    PyObject_HEAD
    cb_walker state;
    size_t start;
    cb_frame *frames;
} Walker;

static int Walker_init(Walker *self, PyObject *args, PyObject *kwargs)
{
    Py_ssize_t start, limit;
    long max_depth;
    long long max_items;
    static char *names[] = {"start", "limit", "max_depth", "max_items", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nnlL", names, &start, &limit, &max_depth,
                                     &max_items))
        return -1;
    if (start < 0) {
        PyErr_SetString(PyExc_ValueError, "offsets outside the data");
        return -1;
    }
    if (!checked_depth(max_depth))
        return -1;
    if (limit < 0 || max_items < 0) {
        PyErr_SetString(PyExc_ValueError, "limit and max_items must not be negative");
        return -1;
    }
    PyMem_Free(self->frames);
    self->frames = PyMem_Malloc(sizeof(cb_frame) * (max_depth ? (size_t)max_depth : 1));
    if (!self->frames) {
        PyErr_NoMemory();
        return -1;
    }
    self->start = (size_t)start;
    cbor_walker_init(&self->state, self->frames, (size_t)start, (size_t)limit,
                      (unsigned)max_depth, (uint64_t)max_items);
    return 0;
}

static void Walker_dealloc(Walker *self)
{
    PyMem_Free(self->frames);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Walker_walk(Walker *self, PyObject *arg)
{
    Py_buffer view;
    if (!self->frames) {
        PyErr_SetString(PyExc_ValueError, "Walker not initialised");
        return NULL;
    }
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (self->start > (size_t)view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "offsets outside the data");
        return NULL;
    }
    cb_verdict v = run_walker(&self->state, &view);
    PyBuffer_Release(&view);
    return Py_BuildValue("(iin)", v.status, v.reason, (Py_ssize_t)v.position);
}

static PyMethodDef Walker_methods[] = {
    {"walk", (PyCFunction)Walker_walk, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WalkerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sessionstore._cbor_bytes.Walker",
    .tp_basicsize = sizeof(Walker),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Walker_init,
    .tp_dealloc = (destructor)Walker_dealloc,
    .tp_methods = Walker_methods,
};

static PyObject *walk(PyObject *module, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t start, limit;
    long max_depth;
    unsigned long long max_items;
    (void)module;
    if (!PyArg_ParseTuple(args, "y*nnlK", &view, &start, &limit, &max_depth, &max_items))
        return NULL;
    if (!checked_range(view.len, start, start) || !checked_depth(max_depth) || limit < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "limit must not be negative");
        PyBuffer_Release(&view);
        return NULL;
    }
    cb_frame frames[CB_MAX_DEPTH];
    cb_walker state;
    cbor_walker_init(&state, frames, (size_t)start, (size_t)limit, (unsigned)max_depth,
                      max_items);
    cb_verdict v = run_walker(&state, &view);
    PyBuffer_Release(&view);
    return Py_BuildValue("(iin)", v.status, v.reason, (Py_ssize_t)v.position);
}

static PyObject *canonicalise(PyObject *module, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t start, end;
    long max_depth;
    (void)module;
    if (!PyArg_ParseTuple(args, "y*nnl", &view, &start, &end, &max_depth))
        return NULL;
    if (!checked_range(view.len, start, end) || !checked_depth(max_depth)) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const uint8_t *data = view.buf;
    cb_verdict v = cbor_walk(data, (size_t)end, (size_t)start, (size_t)(end - start),
                             (unsigned)max_depth, UINT64_MAX);
    PyObject *result;
    if ((v.status != CB_CANONICAL && v.status != CB_VALID) || v.position != (size_t)end) {
        result = Py_NewRef(Py_None);
    } else if (v.status == CB_CANONICAL) {
        result = PyBytes_FromStringAndSize((const char *)data + start, end - start);
    } else {
        result = PyBytes_FromStringAndSize(NULL, end - start);
        if (result) {
            long length = cbor_canonicalise(data, (size_t)start, (size_t)end, (unsigned)max_depth,
                                            (uint8_t *)PyBytes_AS_STRING(result));
            if (length < 0)
                Py_SETREF(result, Py_NewRef(Py_None));
            else if (_PyBytes_Resize(&result, length) < 0)
                result = NULL;
        }
    }
    PyBuffer_Release(&view);
    return result;
}

static PyObject *entries(PyObject *module, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t start, known_end = -1;
    (void)module;
    if (!PyArg_ParseTuple(args, "y*n|n", &view, &start, &known_end))
        return NULL;
    const uint8_t *data = view.buf;
    size_t len = (size_t)view.len;
    PyObject *result = NULL;
    if (!checked_range(view.len, start, start) || known_end < -1 || known_end > view.len) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "offsets outside the data");
        goto done;
    }
    unsigned major = start < view.len ? data[start] >> 5 : 0;
    unsigned info = start < view.len ? data[start] & 0x1F : 31;
    if ((major != 4 && major != 5) || info > 27 || (size_t)start + 1 + (info < 24 ? 0 : 1u << (info - 24)) > len) {
        PyErr_SetString(PyExc_ValueError, "no definite array or map at that offset");
        goto done;
    }
    uint64_t count = info < 24 ? info : 0;
    size_t pos = (size_t)start + 1;
    if (info >= 24)
        for (size_t i = 0; i < (1u << (info - 24)); i++)
            count = (count << 8) | data[pos++];
    if (major == 5)
        count = count > len ? len + 1 : count * 2;
    if (count > len - pos) {
        PyErr_SetString(PyExc_ValueError, "container longer than the data");
        goto done;
    }
    result = PyTuple_New((Py_ssize_t)count + 1);
    if (!result)
        goto done;
    for (uint64_t i = 0; i <= count; i++) {
        PyObject *offset = PyLong_FromSize_t(pos);
        if (!offset) {
            Py_CLEAR(result);
            goto done;
        }
        PyTuple_SET_ITEM(result, (Py_ssize_t)i, offset);
        if (i == count)
            break;
        size_t next;
        if (i + 1 == count && known_end >= 0)
            next = (size_t)known_end >= pos ? (size_t)known_end : 0;
        else
            next = cbor_item_end(data, len, pos);
        if (!next) {
            Py_CLEAR(result);
            PyErr_SetString(PyExc_ValueError, "malformed item inside the container");
            goto done;
        }
        pos = next;
    }
done:
    PyBuffer_Release(&view);
    return result;
}

static PyObject *snapshot_outline(PyObject *module, PyObject *arg)
{
    Py_buffer view;
    (void)module;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    size_t id_start = 0, id_end = 0;
    int found = cbor_snapshot_outline(view.buf, (size_t)view.len, &id_start, &id_end);
    PyBuffer_Release(&view);
    if (!found)
        Py_RETURN_NONE;
    return Py_BuildValue("(nn)", (Py_ssize_t)id_start, (Py_ssize_t)id_end);
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS, NULL},
    {"canonicalise", canonicalise, METH_VARARGS, NULL},
    {"entries", entries, METH_VARARGS, NULL},
    {"snapshot_outline", snapshot_outline, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "sessionstore._cbor_bytes", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__cbor_bytes(void)
{
    if (PyType_Ready(&WalkerType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module && PyModule_AddObjectRef(module, "Walker", (PyObject *)&WalkerType) < 0)
        Py_CLEAR(module);
    return module;
}
