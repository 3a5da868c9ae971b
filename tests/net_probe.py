"""Runs app.py with every name lookup and socket connection written to $NETLOG: the test of
'nothing leaves the machine' reads that file. Usage: python net_probe.py APP_ARGS..."""

import json
import os
import runpy
import socket
import sys

LOG = os.environ["NETLOG"]


def _log(kind: str, address) -> None:
    host = address[0] if isinstance(address, tuple) else address
    with open(LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps([kind, str(host)]) + "\n")


def _wrap(owner, name, kind, pick):
    original = getattr(owner, name)

    def wrapped(*args, **kwargs):
        _log(kind, pick(args))
        return original(*args, **kwargs)
    setattr(owner, name, wrapped)


_wrap(socket, "getaddrinfo", "lookup", lambda a: a[0])
_wrap(socket, "gethostbyname", "lookup", lambda a: a[0])
_wrap(socket.socket, "connect", "connect", lambda a: a[1])
_wrap(socket.socket, "connect_ex", "connect", lambda a: a[1])

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, root)
sys.argv = [os.path.join(root, "app.py"), *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
