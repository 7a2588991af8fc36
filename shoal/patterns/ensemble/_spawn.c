/* Native spawn for ensemble executables: glibc posix_spawn + a short wait, the GIL released once.
 *
 * spawn(exe, argv, envp, cwd, stdin, stdout, stderr, null_fd, quick_ms) -> (pid, status)
 *
 *   The child sets itself up (posix_spawn file actions and attributes): fd 0 <- stdin file or
 *   null_fd, fd 1/2 <- stdout/stderr (created, truncated, 0644), close every fd >= 3, chdir(cwd),
 *   setsid, SIGPIPE/SIGXFSZ back to default, an empty signal mask.  Then, still without the
 *   GIL, wait up to quick_ms for the child to exit (pidfd + poll): if it did, SIGKILL what it
 *   left in its process group (the unreaped zombie still holds the group id, so no stranger can
 *   own it), reap it, and return its raw wait status; else status is None and the caller owns
 *   the pid (the runner journals it, and kills the group and reaps it when it exits: runners.py).
 *   A child reaped here was never published to anyone, so no other kill can have aimed at it.
 *   Failure (any file action, the exec itself: glibc's clone(CLONE_VFORK) reports it):
 *   OSError(errno); the caller names the culprit.
 *
 * Why C (issue 14): the same steps through ctypes took ~12 foreign calls and per-task argument
 * arrays, ~75-110 us of the runner thread per /bin/true, holding the GIL between the calls,
 * plus a pidfd_open/select/close round from Python for the quick wait; here one call converts
 * the arguments and drops the GIL once (~55-70 us, the wait included), and the driver thread
 * runs meanwhile.  spawn.py falls back to subprocess.Popen where this was not built.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
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
    Py_BEGIN_ALLOW_THREADS
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    sigset_t deflt, mask;
    int wflags = O_WRONLY | O_CREAT | O_TRUNC;
    rc = posix_spawn_file_actions_init(&fa);
    if (rc == 0) {
        if (!rc) rc = in ? posix_spawn_file_actions_addopen(&fa, 0, in, O_RDONLY, 0)
                         : posix_spawn_file_actions_adddup2(&fa, null_fd, 0);
        if (!rc) rc = posix_spawn_file_actions_addopen(&fa, 1, out, wflags, 0644);
        if (!rc) rc = posix_spawn_file_actions_addopen(&fa, 2, errp, wflags, 0644);
        if (!rc) rc = posix_spawn_file_actions_addclosefrom_np(&fa, 3);
        if (!rc) rc = posix_spawn_file_actions_addchdir_np(&fa, cwd);
        if (!rc) rc = posix_spawnattr_init(&attr);
        if (!rc) {
            sigemptyset(&deflt);
            sigaddset(&deflt, SIGPIPE);
            sigaddset(&deflt, SIGXFSZ);
            sigemptyset(&mask);
            rc = posix_spawnattr_setsigdefault(&attr, &deflt);
            if (!rc) rc = posix_spawnattr_setsigmask(&attr, &mask);
            if (!rc) rc = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGDEF
                                                          | POSIX_SPAWN_SETSIGMASK);
            if (!rc) rc = posix_spawn(&pid, exe, &fa, &attr, argv, envp);
            posix_spawnattr_destroy(&attr);
        }
        posix_spawn_file_actions_destroy(&fa);
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
                do { r = waitpid(pid, &status, 0); } while (r < 0 && errno == EINTR);
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
    result = exited ? Py_BuildValue("(ii)", (int)pid, status) : Py_BuildValue("(iO)", (int)pid, Py_None);
done:
    Py_DECREF(exe_o); Py_DECREF(cwd_o); Py_DECREF(out_o); Py_DECREF(err_o);
    Py_XDECREF(stdin_b); Py_XDECREF(argv_keep); Py_XDECREF(envp_keep);
    PyMem_Free(argv); PyMem_Free(envp);
    return result;
}

static PyMethodDef methods[] = {
    {"spawn", native_spawn, METH_VARARGS,
     "spawn(exe, argv, envp, cwd, stdin, stdout, stderr, null_fd, quick_ms) -> (pid, wait status | None)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_spawn", NULL, -1, methods};

PyMODINIT_FUNC PyInit__spawn(void) { return PyModule_Create(&module); }
