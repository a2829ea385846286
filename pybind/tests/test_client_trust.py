"""The client talks only to a socket its own user serves (a defect the soak found): another user who created the socket
directory first, or listens on the path, gets refused before anything is sent."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from kvshm._client import Client, UntrustedServerError

NOBODY = 65534
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another uid")


@needs_root
def test_refuses_another_users_directory(tmp_path: Path) -> None:
    theirs = tmp_path / "kvshm-dir"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(UntrustedServerError, match="not this user's private directory"):
        Client(str(theirs / "kvshmd.sock")).connect()


def test_refuses_a_directory_others_can_write(tmp_path: Path) -> None:
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o777)
    with pytest.raises(UntrustedServerError):
        Client(str(d / "kvshmd.sock")).connect()


@needs_root
def test_refuses_another_users_listener(tmp_path: Path) -> None:
    # The only way another user's process listens in our 0700 directory: we bind, it calls listen(2) (whose
    # credentials SO_PEERCRED reports), then it reports how many bytes it was sent.
    d = tmp_path / "ours"
    d.mkdir(mode=0o700)
    path = str(d / "kvshmd.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    ready_r, ready_w = os.pipe()
    got_r, got_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the impostor
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            srv.listen(1)
            os.write(ready_w, b"1")
            conn, _ = srv.accept()
            conn.settimeout(2)
            try:
                n = len(conn.recv(4096))
            except OSError:
                n = 0
            os.write(got_w, str(n).encode())
        finally:
            os._exit(0)
    try:
        assert os.read(ready_r, 1) == b"1"
        with pytest.raises(UntrustedServerError, match=f"served by uid {NOBODY}"):
            Client(path).connect()
        assert os.read(got_r, 16) == b"0", "the impostor was sent bytes"
    finally:
        os.waitpid(pid, 0)
        srv.close()
        for fd in (ready_r, ready_w, got_r, got_w):
            os.close(fd)
