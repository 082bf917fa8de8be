/* A last word before SIGBUS ends the process (crashproof.cli.run_cli installs it).
 *
 * SQLite maps the ledger's -shm file into memory. When that file can no longer be written
 * (made immutable mid-run, its disk gone), the kernel answers the next write to a page of
 * the map with SIGBUS, and the process dies without a word: no Python code runs again, a
 * Python-level handler would only re-enter the faulting write. This handler, installed
 * once, writes one error line and a hint prepared beforehand (write(2) is
 * async-signal-safe) and exits 135 (128 + SIGBUS, what the shell would report). What the
 * journal committed stays: SQLite's commits never depend on the map. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static char message[2048];
static size_t message_len;

static void on_sigbus(int sig)
{
    (void)sig;
    ssize_t ignored = write(STDERR_FILENO, message, message_len);
    (void)ignored;
    _exit(128 + SIGBUS);
}

static PyObject *install(PyObject *self, PyObject *args)
{
    const char *text;
    Py_ssize_t len;
    struct sigaction action;

    (void)self;
    if (!PyArg_ParseTuple(args, "s#", &text, &len))
        return NULL;
    if ((size_t)len >= sizeof message)
        len = (Py_ssize_t)(sizeof message - 1);
    memcpy(message, text, (size_t)len);
    message_len = (size_t)len;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_sigbus;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGBUS, &action, NULL) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"install", install, METH_VARARGS, "install(message): write message and exit 135 on SIGBUS"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_sigbus", "The last word before SIGBUS.", -1, methods,
};

PyMODINIT_FUNC PyInit__sigbus(void) { return PyModule_Create(&module); }
