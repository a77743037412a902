"""The child side of the code sandbox: the source that ``python -I -B -c`` runs in the sandboxed process.

It reads its settings and the program from stdin, sets its own resource limits, drops privileges when asked,
disables process creation, networking (and, without a privilege drop, file deletion), runs the program and reports
success with the per-run token on the parent's result descriptor. See :mod:`exploration_trl.rewards.sandbox`.
"""

CHILD_SOURCE = r"""
import json, os, sys

def _sandbox_main():
    cfg = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    token = ("PASS " + cfg.pop("nonce") + "\n").encode()
    null_fd = os.open(os.devnull, os.O_RDWR)
    os.dup2(null_fd, 0)
    result_fd = os.dup(1)          # the parent's result file
    os.dup2(null_fd, 1)            # user output is discarded
    import signal, resource
    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # oversize writes fail instead of killing us

    def limit(name, soft, hard=None):
        which = getattr(resource, name, None)
        if which is None or soft is None:
            return
        hard = soft if hard is None else hard
        try:
            current = resource.getrlimit(which)[1]
            if current != resource.RLIM_INFINITY:  # cannot raise a hard limit: clamp to it
                soft, hard = min(soft, current), min(hard, current)
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError):
            pass

    mb = 1024 * 1024
    limit("RLIMIT_CORE", 0)
    limit("RLIMIT_CPU", cfg["cpu_seconds"], cfg["cpu_seconds"] + 1)
    limit("RLIMIT_FSIZE", cfg["fsize_mb"] * mb if cfg["fsize_mb"] else None)
    limit("RLIMIT_NPROC", cfg["nproc"] or None)
    limit("RLIMIT_AS", cfg["memory_mb"] * mb if cfg["memory_mb"] else None)

    drop = cfg.get("drop")
    if drop:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        keep_read = drop["mode"] == "read_cap"
        if keep_read:
            libc.prctl(8, 1, 0, 0, 0)                     # PR_SET_KEEPCAPS
        os.setgroups([])
        os.setgid(drop["gid"])
        os.setuid(drop["uid"])
        if keep_read:
            class _Hdr(ctypes.Structure):
                _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
            class _Data(ctypes.Structure):
                _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                            ("inheritable", ctypes.c_uint32)]
            hdr = _Hdr(0x20080522, 0)                     # _LINUX_CAPABILITY_VERSION_3
            data = (_Data * 2)()
            data[0].effective = data[0].permitted = 1 << 2  # CAP_DAC_READ_SEARCH only
            if libc.capset(ctypes.byref(hdr), data) != 0:
                os._exit(97)
            libc.prctl(8, 0, 0, 0, 0)
        if libc.prctl(38, 1, 0, 0, 0) != 0:               # PR_SET_NO_NEW_PRIVS
            os._exit(97)
        if os.getuid() == 0 or os.geteuid() == 0:
            os._exit(97)

    for key in list(os.environ):
        if key.lower().endswith("_proxy"):
            del os.environ[key]

    def blocked(name):
        def _blocked(*args, **kwargs):
            raise PermissionError(name + " is disabled in the sandbox")
        _blocked.__name__ = name
        return _blocked

    def disable(module, names):
        for name in names:
            if hasattr(module, name):
                setattr(module, name, blocked(module.__name__ + "." + name))

    import socket, _socket, subprocess, posix, shutil
    net = ["socket", "socketpair", "fromfd", "create_connection", "create_server", "getaddrinfo",
           "gethostbyname", "gethostbyname_ex", "gethostbyaddr", "getnameinfo"]
    disable(socket, net)
    disable(_socket, net)
    procs = ["system", "popen", "fork", "forkpty", "vfork", "execv", "execve", "execl", "execle",
             "execlp", "execlpe", "execvp", "execvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe",
             "spawnv", "spawnve", "spawnvp", "spawnvpe", "posix_spawn", "posix_spawnp", "kill",
             "killpg", "setsid", "setpgid", "setpgrp", "setuid", "setgid", "setreuid", "setresuid"]
    disable(os, procs)
    disable(posix, procs)
    disable(subprocess, ["Popen", "call", "check_call", "check_output", "run", "getoutput",
                         "getstatusoutput"])
    try:
        import _posixsubprocess
        disable(_posixsubprocess, ["fork_exec"])
    except ImportError:
        pass
    if not drop:
        files = ["remove", "unlink", "rmdir", "removedirs", "rename", "renames", "replace",
                 "truncate", "chmod", "fchmod", "lchmod", "chown", "fchown", "lchown", "chroot",
                 "link", "symlink"]
        disable(os, files)
        disable(posix, files)
        disable(shutil, ["rmtree", "move", "chown", "copytree"])

    program = cfg.pop("program")
    namespace = {"__name__": "__sandbox__", "__builtins__": __builtins__}
    try:
        code = compile(program, "solution.py", "exec")
        del program, cfg
        exec(code, namespace)
    except BaseException:
        try:
            import traceback
            traceback.print_exc(limit=5)
            sys.stderr.flush()
        except BaseException:
            pass
        os._exit(1)
    os.write(result_fd, token)
    os._exit(0)

_sandbox_main()
"""
