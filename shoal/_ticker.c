/*
 * shoal._ticker -- a periodic "signal" for the main thread's eval loop, without a kernel signal
 * and without the GIL (shoal/_tick.py says what it is for and what was rejected).
 *
 * start(period_s, signum): from now on, every period_s seconds a helper thread calls
 *     PyErr_SetInterruptEx(signum): the main thread runs the Python handler of signum at its
 *     next eval-breaker check (a loop's backward jump or a call), as if the signal had come.
 *     The thread is created on the first start() in a process (again after a fork: the child
 *     has none) and sleeps on a condition variable while stopped.
 * stop(): no more calls until the next start().
 *
 * PyErr_SetInterruptEx is async-signal-safe and documented callable without the GIL; it sets
 * the handler's "tripped" flag and the eval breaker, nothing else (no EINTR anywhere: no
 * signal is delivered).  It ignores a signum whose handler is SIG_DFL or SIG_IGN.
 */
#define PY_SSIZE_T_CLEAN
#include <patchlevel.h>
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define Py_BUILD_CORE_MODULE 1 /* interp->ceval.eval_breaker: 3.11's layout (see run()) */
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
static int signum = 0;
static pid_t owner = 0;     /* the process whose helper thread exists */
static unsigned long ticks = 0;

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
        if (active) {
            PyErr_SetInterruptEx(signum);
#ifdef HAVE_BREAKER
            /* PyErr_SetInterruptEx marks the signal pending, but it sets the eval breaker
               only when called from the main thread (_Py_ThreadCanHandleSignals of the
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
}

static PyObject *ticker_start(PyObject *self, PyObject *args)
{
    double period;
    int sig;
    if (!PyArg_ParseTuple(args, "di", &period, &sig))
        return NULL;
    if (!(period >= 1e-5 && period <= 10.0)) {
        PyErr_Format(PyExc_ValueError, "period_s must be in [1e-5, 10], got %R",
                     PyTuple_GET_ITEM(args, 0));
        return NULL;
    }
    if (sig < 1 || sig >= NSIG) {
        PyErr_Format(PyExc_ValueError, "signum %d out of range", sig);
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
    signum = sig;
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
    {"start", ticker_start, METH_VARARGS, "start(period_s, signum): tick every period_s"},
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
