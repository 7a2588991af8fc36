/*
 * shoal._ticker -- a periodic "signal" for the main thread's eval loop, without a kernel signal
 * and without the GIL (shoal/_tick.py says what it is for and what was rejected).
 *
 * start(period_s, func): from now on, every period_s seconds a helper thread queues a pending
 *     call (Py_AddPendingCall): the main thread calls func(frame) -- frame: the one it was
 *     running -- at its next eval-breaker check (a loop's backward jump or a call).  At most
 *     one call is queued at a time (a main thread stuck in C for a while gets one, not a
 *     backlog).  The thread is created on the first start() in a process (again after a
 *     fork: the child has none) and sleeps on a condition variable while stopped.
 * stop(): no more calls until the next start().
 *
 * Py_AddPendingCall is documented callable from any thread without the GIL; it takes the
 * interpreter's pending-calls lock and sets a flag, nothing else: no signal is delivered
 * (no EINTR anywhere), no signal handler is involved (a user's handler of any signal is
 * never called by a tick, and nothing is written to a signal.set_wakeup_fd descriptor).
 * An earlier version called PyErr_SetInterruptEx(SIGRTMAX) and ran a Python handler of
 * that signal: a task that installed its own SIGRTMAX handler mid-search got phantom
 * calls every tick and the loop's polls stopped, and every tick wrote a byte to the
 * wakeup fd of an asyncio loop (tests/attack/test_search_tick_break.py).
 */
#define PY_SSIZE_T_CLEAN
#include <patchlevel.h>
#if PY_VERSION_HEX >= 0x030A0000 && PY_VERSION_HEX < 0x030D0000
/* interp->ceval.eval_breaker: the layout of 3.10, 3.11 and 3.12 (see run()); 3.13 sets the
   main thread's own breaker bit in Py_AddPendingCall.  Without it a busy main thread of
   3.10 or 3.12 never saw a tick (the first version set it for 3.11 only: no poll, so no
   stop and no split, on two of the supported versions) */
#define Py_BUILD_CORE_MODULE 1
#define HAVE_BREAKER 1
#endif
#include <Python.h>
#ifdef HAVE_BREAKER
#include "internal/pycore_interp.h"
#endif
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int active = 0;      /* guarded by mu */
static long period_ns = 1000000;
static PyObject *func = NULL; /* called in the main thread (a strong reference) */
static pid_t owner = 0;     /* the process whose helper thread exists */
static unsigned long ticks = 0;
static int queued = 0;      /* a pending call is queued and has not run yet (atomic) */

static int call(void *arg)
{
    /* a pending call: the main thread, the GIL held, between two bytecodes */
    (void)arg;
    __atomic_store_n(&queued, 0, __ATOMIC_SEQ_CST);
    PyObject *f = func;
    if (f == NULL)
        return 0;
    PyObject *frame = (PyObject *)PyEval_GetFrame(); /* borrowed; NULL: none */
    Py_INCREF(f);
    PyObject *r = PyObject_CallOneArg(f, frame != NULL ? frame : Py_None);
    Py_DECREF(f);
    if (r == NULL)
        return -1; /* the exception propagates into the interrupted code */
    Py_DECREF(r);
    return 0;
}

static void *run(void *arg)
{
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* real signals go to the other threads */
    pthread_mutex_lock(&mu);
    for (;;) {
        while (!active)
            pthread_cond_wait(&cv, &mu);
        struct timespec ts = {period_ns / 1000000000L, period_ns % 1000000000L};
        pthread_mutex_unlock(&mu);
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&mu);
        if (active && !__atomic_load_n(&queued, __ATOMIC_SEQ_CST)) {
            __atomic_store_n(&queued, 1, __ATOMIC_SEQ_CST);
            if (Py_AddPendingCall(call, NULL) != 0)
                __atomic_store_n(&queued, 0, __ATOMIC_SEQ_CST); /* queue full: next tick */
#ifdef HAVE_BREAKER
            /* Py_AddPendingCall marks the call pending, but it sets the eval breaker only
               when called from the main thread (_Py_ThreadCanHandlePendingCalls of the
               *calling* thread): set it, so the main thread looks at its next check */
            _Py_atomic_store_relaxed(&PyInterpreterState_Main()->ceval.eval_breaker, 1);
#endif
            ticks++;
        }
    }
    return NULL;
}

static void before_fork(void) { pthread_mutex_lock(&mu); }
static void after_fork_parent(void) { pthread_mutex_unlock(&mu); }
static void after_fork_child(void)
{
    /* the helper thread is not copied: the next start() makes one */
    pthread_mutex_init(&mu, NULL);
    pthread_cond_init(&cv, NULL);
    active = 0;
    owner = 0;
    queued = 0;
}

static PyObject *ticker_start(PyObject *self, PyObject *args)
{
    double period;
    PyObject *fn;
    if (!PyArg_ParseTuple(args, "dO", &period, &fn))
        return NULL;
    if (!(period >= 1e-5 && period <= 10.0)) {
        PyErr_Format(PyExc_ValueError, "period_s must be in [1e-5, 10], got %R",
                     PyTuple_GET_ITEM(args, 0));
        return NULL;
    }
    if (!PyCallable_Check(fn)) {
        PyErr_Format(PyExc_TypeError, "func must be callable, got %R", fn);
        return NULL;
    }
    pthread_mutex_lock(&mu);
    if (owner != getpid()) {
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 64 * 1024);
        int rc = pthread_create(&th, &attr, run, NULL);
        pthread_attr_destroy(&attr);
        if (rc != 0) {
            pthread_mutex_unlock(&mu);
            errno = rc;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        owner = getpid();
    }
    period_ns = (long)(period * 1e9);
    Py_INCREF(fn);
    Py_XSETREF(func, fn); /* (the GIL is held: call() reads it with the GIL) */
    active = 1;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
    Py_RETURN_NONE;
}

static PyObject *ticker_stop(PyObject *self, PyObject *noargs)
{
    pthread_mutex_lock(&mu);
    active = 0;
    pthread_mutex_unlock(&mu);
    Py_RETURN_NONE;
}

static PyObject *ticker_ticks(PyObject *self, PyObject *noargs)
{
    pthread_mutex_lock(&mu);
    unsigned long n = ticks;
    pthread_mutex_unlock(&mu);
    return PyLong_FromUnsignedLong(n);
}

static PyMethodDef methods[] = {
    {"start", ticker_start, METH_VARARGS, "start(period_s, func): call func(frame) in the main thread every period_s"},
    {"stop", ticker_stop, METH_NOARGS, "stop(): no more ticks until start()"},
    {"ticks", ticker_ticks, METH_NOARGS, "ticks(): how many ticks this process has made"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "shoal._ticker", NULL, -1, methods};

PyMODINIT_FUNC PyInit__ticker(void)
{
    if (pthread_atfork(before_fork, after_fork_parent, after_fork_child) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyModule_Create(&module);
}
