# Types for the compiled build of index.py (kvfs/native.py; Cython's pure-Python mode: this file
# augments the .py, which stays the source of both builds). Sizes and counts are C integers,
# keys are any Python object; every attribute stays readable and writable from Python.
cimport cython


cdef class Ghost:
    cdef public Py_ssize_t capacity
    cdef public object entries
    cdef public Py_ssize_t bytes
    cpdef add(self, object key, Py_ssize_t count, Py_ssize_t size)
    cpdef object take(self, object key)


@cython.locals(n=Py_ssize_t, i=Py_ssize_t, j=Py_ssize_t, row=list, won=double, lost=double)
cpdef object sign_test(list beats, list status, double decay, Py_ssize_t lead, double z)


cdef class TierIndex:
    cdef public Py_ssize_t capacity
    cdef public object policy
    cdef public dict sizes
    cdef public Py_ssize_t used
    cdef public Py_ssize_t hits
    cdef public Py_ssize_t misses
    cdef public Py_ssize_t evictions
    cpdef bint lookup(self, object key, object parent=*)
    @cython.locals(out=list)
    cpdef list make_room(self, Py_ssize_t need, object evictable=*, bint cold_only=*)
    cpdef bint fits(self, Py_ssize_t need)
    cpdef add(self, object key, Py_ssize_t size, object parent=*)
    cpdef remove(self, object key)
