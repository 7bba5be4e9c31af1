"""The docs' block runner rejects pages that break its rules or show the wrong output."""

import pytest

from tests.docs.markdown_blocks import PageError, parse_page
from tests.docs.test_docs_pages import run_page

pytestmark = pytest.mark.anyio

FENCE = "```"


def page(tmp_path, text):
    path = tmp_path / "page.md"
    path.write_text(text.replace("'''", FENCE))
    return path


def run(tmp_path, text, need=None):
    """What went wrong running the page ``text`` for ``need``, in ``tmp_path / "run"``."""
    directory = tmp_path / "run"
    directory.mkdir(exist_ok=True)
    return run_page(parse_page(page(tmp_path, text)), need, directory)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<!-- docs: skip -->\n'''python\nx = 1\n'''\n", "a skip needs its reason"),
        ("<!-- docs: needs gpu -->\n'''python\nx = 1\n'''\n", "unknown need 'gpu'"),
        ("'''toml\na = 1\n'''\n'''text title=\"Output\"\n1\n'''\n",
         "must follow a block that runs"),
        ("<!-- docs: skip: later -->\n'''python\nprint(1)\n'''\n'''text title=\"Output\"\n1\n'''\n",
         "must follow a block that runs"),
        ("<!-- docs: sometimes -->\n'''python\nx = 1\n'''\n", "unknown docs marker 'sometimes'"),
    ],
)  # fmt: skip
async def test_a_page_breaking_a_rule_is_refused_naming_its_line(tmp_path, text, error):
    with pytest.raises(PageError, match=error) as refused:
        parse_page(page(tmp_path, text))
    assert "page.md:" in str(refused.value)


async def test_blocks_share_a_namespace_and_their_output_is_checked(tmp_path):
    text = (
        "'''python\nx = 40\n'''\n"
        "'''python\nprint(x + 2, 'and more')\n'''\n'''text title=\"Output\"\n42 ...\n'''\n"
    )
    assert run(tmp_path, text) == []


async def test_output_other_than_the_page_shows_fails(tmp_path):
    text = "'''python\nprint(41)\n'''\n'''text title=\"Output\"\n42\n'''\n"
    [failure] = run(tmp_path, text)
    assert "page.md:1 printed other output than the page shows" in failure
    assert "41" in failure


async def test_a_failing_block_stops_the_page_naming_its_line(tmp_path):
    text = "'''python\nx = 1\n'''\n\n'''bash\nexit 3\n'''\n'''python\nprint('never')\n'''\n"
    [failure] = run(tmp_path, text)
    assert "page.md:5 failed" in failure and "exited with status 3" in failure


async def test_a_needs_block_runs_only_for_its_need(tmp_path):
    text = (
        "'''python\nopen('a', 'w').close()\n'''\n"
        "<!-- docs: needs ray -->\n'''python\nopen('b', 'w').close()\n'''\n"
    )
    path = page(tmp_path, text)
    for need in (None, "ray"):
        directory = tmp_path / f"run-{need}"
        directory.mkdir()
        assert run_page(parse_page(path), need, directory) == []
        assert (directory / "b").exists() == (need == "ray") and (directory / "a").exists()


async def test_python_blocks_import_what_file_blocks_wrote(tmp_path):
    text = (
        "<!-- docs: file helper.py -->\n'''python\nVALUE = 7\n'''\n"
        "'''python\nimport helper\nprint(helper.VALUE)\n'''\n'''text title=\"Output\"\n7\n'''\n"
    )
    assert run(tmp_path, text) == []


async def test_what_a_block_s_subprocesses_print_is_its_output_too(tmp_path):
    text = (
        "'''python\nimport subprocess, sys\nprint('from the block', flush=True)\n"
        "subprocess.run([sys.executable, '-c', 'print(\"from a child\")'], check=True)\n'''\n"
        "'''text title=\"Output\"\nfrom the block\nfrom a child\n'''\n"
    )
    assert run(tmp_path, text) == []
    assert sorted(path.name for path in (tmp_path / "run").iterdir()) == [
        "bench", "blocks.json", "results.json", "samples"
    ]  # fmt: skip
