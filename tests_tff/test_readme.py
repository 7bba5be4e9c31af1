"""The TensorFlow Federated example of README.md works as written, and resumes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).parent.parent / "README.md"


def tff_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    return next(block for block in blocks if "TFFContext()" in block)


def test_the_tff_example_trains_then_resumes_as_already_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    example = compile(tff_example(), str(README), "exec")
    exec(example, {"__name__": "readme"})
    # capfd, not capsys: TFF hands its worker process sys.stdout's file descriptor.
    first = re.findall(r"round \d+ loss .*\n", capfd.readouterr().out)
    assert len(first) == 1 and re.fullmatch(r"round 5 loss \d+\.\d+\n", first[0]), first
    assert sorted(p.name for p in (tmp_path / "tff_program_state").iterdir())[-1].startswith(
        "program_state_5"
    )
    exec(example, {"__name__": "readme"})  # resumes: round 5 is saved, nothing trains
    assert re.findall(r"round \d+ loss .*\n", capfd.readouterr().out) == first
