"""tests/conftest.py's ScriptHost: the kept process that runs the commands given a CTranslate2 export gives what a
process of their own would (output at every level in order, exit status, environment), and a crash costs only the
command that crashed."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ScriptHost


def test_the_kept_process_answers_as_a_fresh_one_would_and_is_replaced_after_a_crash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "probe.py"
    script.write_text("import os, sys\nprint('one')\nos.write(1, b'two\\n')\nprint('three', file=sys.stderr)\n"
                      "os.write(2, b'four\\n')\nprint(os.environ.get('FR2EN_PROBE'), sys.argv[1:], sys.stdin.read())\n"
                      "sys.exit(3)\n")
    crash = tmp_path / "crash.py"
    crash.write_text("import os\nos.abort()\n")
    host = ScriptHost()
    try:
        monkeypatch.setenv("FR2EN_PROBE", "x")
        res = host.run(str(script), ["a"], "in")
        assert (res.returncode, res.stdout, res.stderr) == (3, "one\ntwo\nx ['a'] in\n", "three\nfour\n")
        assert host.process is not None
        first = host.process.pid
        monkeypatch.delenv("FR2EN_PROBE")
        res = host.run(str(script), ["b"], None)  # the same process, the caller's environment of now
        assert (res.returncode, res.stdout.splitlines()[-1]) == (3, "None ['b'] ") and host.process.pid == first
        res = host.run(str(crash), [], None)
        assert res.returncode == -6 and host.process is None  # SIGABRT, as subprocess.run reports it
        res = host.run(str(script), [], "")
        assert res.returncode == 3 and host.process is not None and host.process.pid != first
    finally:
        host.close()
