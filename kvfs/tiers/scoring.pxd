# Types for the compiled build of scoring.py (kvfs/native.py; Cython's pure-Python mode: this
# file augments the .py, which stays the source of both builds).
cimport cython
from kvfs.tiers.index cimport Ghost, TierIndex


cdef class PrefixScore:
    cdef public double floor
    cdef public Py_ssize_t mode
    cdef public double credit
    cdef public bint frequency
    cdef public list shadows
    cdef public object typical
    cdef public Py_ssize_t lead
    cdef public double rate
    cdef public object _threshold
    cdef public list beats
    cdef public double _decay
    cpdef resize(self, object capacity)
    cpdef double priority(self, Py_ssize_t uses)
    cpdef evicted(self, object priority)
    @cython.locals(t=TierIndex, hit=bint, status=list)
    cpdef observe(self, object key, Py_ssize_t size)


cdef class ScorePolicy:
    cdef public PrefixScore rule
    cdef public dict prio
    cdef public dict uses
    cdef public dict at
    cdef public list heap
    cdef public Ghost ghost
    cdef public dict sizes
    cdef public Py_ssize_t _seq
    @cython.locals(p=double)
    cpdef _set(self, object key, Py_ssize_t uses)
    cpdef _compact(self)
    cpdef insert(self, object key, Py_ssize_t size, object parent=*)
    cpdef touch(self, object key, object parent=*)
    cpdef remove(self, object key)
    cpdef end_chain(self, object key)
    cpdef bint is_hot(self, object key)
    cpdef resize(self, object capacity)
    @cython.locals(held=list, p=double, seq=Py_ssize_t)
    cpdef object victim(self, object evictable, bint cold_only=*)
