/* Native spawn for ensemble executables: vfork + a hand-written child, a short wait, the GIL
 * released once.
 *
 * spawn(exe, argv, envp, cwd, stdin, stdout, stderr, null_fd, quick_ms)
 *     -> (pid, status, (user s, system s, peak rss KiB))
 *
 *   The child sets itself up, in this order (the order glibc's posix_spawn used here before):
 *   setsid, SIGPIPE/SIGXFSZ back to default, fd 0 <- stdin file or null_fd, fd 1/2 <-
 *   stdout/stderr (created, truncated, 0644), close every fd >= 3, chdir(cwd), an empty signal
 *   mask, execve.  Then, still without the GIL, the parent waits up to quick_ms for the child
 *   to exit (pidfd + poll): if it did, SIGKILL what it left in its process group (the unreaped
 *   zombie still holds the group id, so no stranger can own it), reap it with wait4, and return
 *   its raw wait status and its rusage (CPU times, ru_maxrss: ensemble/usage.py); else status
 *   and rusage are None and the caller owns the pid (the runner journals it, and
 *   kills the group and reaps it when it exits: runners.py).  A child reaped here was never
 *   published to anyone, so no other kill can have aimed at it.  Failure (any step, the exec
 *   itself): the child stores errno in the parent's memory (vfork shares it) and _exits(127);
 *   the parent reaps it and raises OSError(errno); the caller names the culprit.
 *
 * vfork safety (the rules CPython's _posixsubprocess follows since 3.10):
 *   - the child shares the parent's memory and stack until execve/_exit, and other threads of
 *     the parent keep running: it calls only raw system calls (no malloc, no locks, no stdio),
 *     everything it needs (argv/envp arrays, paths) is built before vfork, and it never returns
 *     from child() (noreturn, noinline: its frame lies below the parent's);
 *   - no signal handler may run in the child (it would run the parent's handler on the parent's
 *     memory): the calling thread blocks every signal before vfork and restores its mask after;
 *     the child unblocks only right before execve, once setsid has taken it out of every
 *     process group anyone signals and its pid is known to nobody (vfork has not returned), and
 *     it resets to SIG_DFL the handled signals that arrived before (sigpending: rare).  execve
 *     itself resets every other handled signal to SIG_DFL, so the per-signal loop of glibc's
 *     posix_spawn and CPython (~124 rt_sigaction calls, ~16 us per task here) is not needed.
 *
 * Why not glibc's posix_spawn (what an earlier version of this file called): per /bin/true it made 5
 * getrlimit calls (fd checks of the file actions), mmap'ed and munmap'ed a child stack (the
 * munmap takes the address-space lock and shoots down TLBs on the CPUs our other threads use)
 * and reset every signal one by one in the child: ~20-25 us of the ~0.8 ms CPU a task costs
 * (2,000 x /bin/true, 2 cores).  Why C at all: the same steps through ctypes (tried before this file existed)
 * took ~12 foreign calls per task holding the GIL; subprocess.Popen adds an error pipe and fd
 * bookkeeping.  spawn.py falls back to subprocess.Popen where this was not built.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif

/* A NULL-terminated char* array from a sequence of str/bytes; *keep holds the bytes objects. */
static char **to_array(PyObject *seq, PyObject **keep) {
    PyObject *fast = PySequence_Fast(seq, "argv and envp must be sequences");
    if (fast == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject *held = PyTuple_New(n);
    char **arr = PyMem_Malloc((size_t)(n + 1) * sizeof(char *));
    if (held == NULL || arr == NULL) {
        Py_DECREF(fast); Py_XDECREF(held); PyMem_Free(arr);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = NULL;
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(fast, i), &b)) {
            Py_DECREF(fast); Py_DECREF(held); PyMem_Free(arr);
            return NULL;
        }
        PyTuple_SET_ITEM(held, i, b);
        arr[i] = PyBytes_AS_STRING(b);
    }
    arr[n] = NULL;
    Py_DECREF(fast);
    *keep = held;
    return arr;
}

/* fd ``target`` <- open(path, flags): what posix_spawn_file_actions_addopen did. */
static int open_as(int target, const char *path, int flags) {
    int fd;
    close(target);
    do { fd = open(path, flags, 0644); } while (fd < 0 && errno == EINTR);
    if (fd < 0) return -1;
    if (fd != target) {
        if (dup2(fd, target) < 0) return -1;
        close(fd);
    }
    return 0;
}

static void close_from_3(void) {
    if (syscall(SYS_close_range, 3U, ~0U, 0) == 0) return;
    struct rlimit rl;  /* a kernel before 5.9: close them one by one */
    long top = (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < INT_MAX)
               ? (long)rl.rlim_cur : 65536;
    for (long fd = 3; fd < top; fd++) close((int)fd);
}

/* The vfork child: never returns (see the header for what it may do). */
static void __attribute__((noreturn, noinline))
child(const char *exe, char *const argv[], char *const envp[], const char *cwd, const char *in,
      const char *out, const char *errp, int null_fd, volatile int *failed) {
    const int wflags = O_WRONLY | O_CREAT | O_TRUNC;
    struct sigaction dfl;
    sigset_t pending, empty;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    if (setsid() < 0) goto fail;
    if (sigaction(SIGPIPE, &dfl, NULL) < 0 || sigaction(SIGXFSZ, &dfl, NULL) < 0) goto fail;
    if (in != NULL ? open_as(0, in, O_RDONLY) < 0 : dup2(null_fd, 0) < 0) goto fail;
    if (open_as(1, out, wflags) < 0 || open_as(2, errp, wflags) < 0) goto fail;
    close_from_3();
    if (chdir(cwd) < 0) goto fail;
    if (sigpending(&pending) == 0) {  /* arrived while blocked (before setsid): never to a handler */
        for (int sig = 1; sig < NSIG; sig++) {
            struct sigaction old;
            if (sigismember(&pending, sig) == 1 && sigaction(sig, NULL, &old) == 0
                && old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN)
                sigaction(sig, &dfl, NULL);
        }
    }
    sigemptyset(&empty);
    if (syscall(SYS_rt_sigprocmask, SIG_SETMASK, &empty, NULL, (size_t)(NSIG / 8)) < 0) goto fail;
    execve(exe, argv, envp);
fail:
    *failed = errno ? errno : EINVAL;
    _exit(127);
}

static PyObject *native_spawn(PyObject *self, PyObject *args) {
    PyObject *exe_o, *argv_o, *envp_o, *cwd_o, *in_o, *out_o, *err_o;
    int null_fd, quick_ms;
    if (!PyArg_ParseTuple(args, "O&OOO&OO&O&ii", PyUnicode_FSConverter, &exe_o, &argv_o, &envp_o,
                          PyUnicode_FSConverter, &cwd_o, &in_o, PyUnicode_FSConverter, &out_o,
                          PyUnicode_FSConverter, &err_o, &null_fd, &quick_ms))
        return NULL;  /* PyUnicode_FSConverter supports cleanup: nothing is leaked */
    PyObject *stdin_b = NULL, *argv_keep = NULL, *envp_keep = NULL, *result = NULL;
    char **argv = NULL, **envp = NULL;
    if (in_o != Py_None && !PyUnicode_FSConverter(in_o, &stdin_b)) goto done;
    if ((argv = to_array(argv_o, &argv_keep)) == NULL) goto done;
    if ((envp = to_array(envp_o, &envp_keep)) == NULL) goto done;

    const char *exe = PyBytes_AS_STRING(exe_o), *cwd = PyBytes_AS_STRING(cwd_o);
    const char *out = PyBytes_AS_STRING(out_o), *errp = PyBytes_AS_STRING(err_o);
    const char *in = stdin_b ? PyBytes_AS_STRING(stdin_b) : NULL;
    pid_t pid = 0;
    int rc = 0, status = 0, exited = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    volatile int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    sigset_t all, old;
    memset(&all, 0xff, sizeof all);  /* raw calls: glibc would leave its 2 internal signals open */
    if (syscall(SYS_rt_sigprocmask, SIG_BLOCK, &all, &old, (size_t)(NSIG / 8)) < 0) {
        rc = errno;
    } else {
        pid = vfork();
        if (pid == 0)
            child(exe, argv, envp, cwd, in, out, errp, null_fd, &failed);
        if (pid < 0) rc = errno;
        syscall(SYS_rt_sigprocmask, SIG_SETMASK, &old, NULL, (size_t)(NSIG / 8));
    }
    if (rc == 0 && failed) {  /* the child _exited before execve: reap it, report its errno */
        pid_t r;
        do { r = waitpid(pid, &status, 0); } while (r < 0 && errno == EINTR);
        rc = failed;
    }
    if (rc == 0 && quick_ms > 0) {
        int fd = (int)syscall(SYS_pidfd_open, pid, 0);
        if (fd >= 0) {
            struct pollfd p = {fd, POLLIN, 0};
            int n;
            do { n = poll(&p, 1, quick_ms); } while (n < 0 && errno == EINTR);
            close(fd);
            if (n == 1) {
                pid_t r;
                kill(-pid, SIGKILL);  /* its leftovers (sleep 600 &): see the header */
                do { r = wait4(pid, &status, 0, &ru); } while (r < 0 && errno == EINTR);
                exited = (r == pid);
            }
        }
    }
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    if (exited)
        result = Py_BuildValue("(ii(ddl))", (int)pid, status,
                               ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6,
                               ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6, (long)ru.ru_maxrss);
    else
        result = Py_BuildValue("(iOO)", (int)pid, Py_None, Py_None);
done:
    Py_DECREF(exe_o); Py_DECREF(cwd_o); Py_DECREF(out_o); Py_DECREF(err_o);
    Py_XDECREF(stdin_b); Py_XDECREF(argv_keep); Py_XDECREF(envp_keep);
    PyMem_Free(argv); PyMem_Free(envp);
    return result;
}

static PyMethodDef methods[] = {
    {"spawn", native_spawn, METH_VARARGS,
     "spawn(exe, argv, envp, cwd, stdin, stdout, stderr, null_fd, quick_ms) -> "
     "(pid, wait status | None, (user s, system s, peak rss KiB) | None)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_spawn", NULL, -1, methods};

PyMODINIT_FUNC PyInit__spawn(void) { return PyModule_Create(&module); }
