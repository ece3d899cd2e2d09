"""The tests' launcher (processes.torchrun) runs a script once more when a process aborted in
C++ teardown, and fails when it aborts twice."""

import pytest

from processes import TEARDOWN_ABORT, torchrun

pytestmark = pytest.mark.distributed  # starts processes

# Counts its runs per rank in $MARKERS (not an argument, which the launcher would put back as
# it was before a second run), and aborts in its first `aborts` runs after its last line.
SCRIPT = f"""
import os, sys
marker = os.path.join(os.environ["MARKERS"], "rank" + os.environ["RANK"])
runs = int(open(marker).read()) if os.path.exists(marker) else 0
open(marker, "w").write(str(runs + 1))
print("trained", flush=True)
if runs < int(sys.argv[1]):
    sys.stderr.write({TEARDOWN_ABORT!r} + "\\n")
    sys.stderr.flush()
    os._exit(134)
"""


@pytest.mark.parametrize("aborts", [0, 1, 2])
def test_a_teardown_abort_is_run_once_more(aborts, tmp_path, monkeypatch):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    monkeypatch.setenv("MARKERS", str(tmp_path))
    done = torchrun(str(script), str(aborts), check=False)
    runs = [int((tmp_path / f"rank{r}").read_text()) for r in range(2)]
    assert runs == [min(aborts, 1) + 1] * 2
    assert (done.returncode == 0) == (aborts < 2)
    if aborts == 2:
        with pytest.raises(AssertionError, match="terminate called"):
            torchrun(str(script), "9", check=True)  # aborts in both runs
