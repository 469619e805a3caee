# Types for the compiled build of policy.py (kvfs/native.py; Cython's pure-Python mode: this file
# augments the .py, which stays the source of both builds). The protocols and the admission
# policies stay plain classes.
cimport cython
from kvfs.tiers.index cimport Ghost


cdef class LRUPolicy:
    cdef public object order
    cpdef insert(self, object key, Py_ssize_t size, object parent=*)
    cpdef touch(self, object key, object parent=*)
    cpdef remove(self, object key)
    cpdef end_chain(self, object key)
    cpdef bint is_hot(self, object key)
    cpdef resize(self, object capacity)
    cpdef object victim(self, object evictable, bint cold_only=*)


cdef class ProbationFrequencyPolicy:
    cdef public Py_ssize_t capacity
    cdef public double small
    cdef public object probation
    cdef public dict main
    cdef public list heap
    cdef public dict size
    cdef public dict count
    cdef public double inflation
    cdef public Py_ssize_t probation_bytes
    cdef public Py_ssize_t main_bytes
    cdef public double ghost_share
    cdef public Ghost ghost
    cdef public Py_ssize_t _seq
    cpdef resize(self, object capacity)
    cpdef _to_main(self, object key, object h=*)
    cpdef insert(self, object key, Py_ssize_t size, object parent=*)
    cpdef touch(self, object key, object parent=*)
    cpdef end_chain(self, object key)
    cpdef remove(self, object key)
    cpdef object _evict(self, object key)
    cpdef bint is_hot(self, object key)
    @cython.locals(held=list)
    cpdef object victim(self, object evictable, bint cold_only=*)
    @cython.locals(skipped=list)
    cpdef object _probation_victim(self, object evictable, bint cold_only)


cdef class _ExpertLRU:
    cdef public Py_ssize_t capacity
    cdef public object order
    cdef public Py_ssize_t bytes
    cpdef bint access(self, object key, Py_ssize_t size, object parent, list evicted)
    cpdef end_chain(self, object key)
    cpdef bint is_hot(self, object key)
    cpdef resize(self, object capacity)


cdef class _ExpertProbation:
    cdef public ProbationFrequencyPolicy policy
    cdef public str name
    @cython.locals(p=ProbationFrequencyPolicy)
    cpdef bint access(self, object key, Py_ssize_t size, object parent, list evicted)
    cpdef end_chain(self, object key)
    cpdef bint is_hot(self, object key)
    cpdef resize(self, object capacity)


cdef class PrefixPolicy:
    cdef public Py_ssize_t capacity
    cdef public list experts
    cdef public list beats
    cdef public Py_ssize_t lead
    cdef public dict sizes
    cdef public object recency
    cdef public object doomed
    cdef public object _walks
    cdef public object typical
    cdef public double _decay
    cpdef resize(self, object capacity)
    @cython.locals(d=double, status=list, evicted=list, i=Py_ssize_t, prefix_hit=bint)
    cpdef _observe(self, object key, Py_ssize_t size, object parent)
    cpdef insert(self, object key, Py_ssize_t size, object parent=*)
    cpdef touch(self, object key, object parent=*)
    cpdef remove(self, object key)
    cpdef end_chain(self, object key)
    cpdef bint is_hot(self, object key)
    cpdef object victim(self, object evictable, bint cold_only=*)
