"""What the HumanEval sandbox tests share: the check that a run left the sandbox's directory and
the sentinel beside it (conftest.py's `sandbox_root`) as they were."""

from __future__ import annotations


def untouched(root):
    """The temporary directory went, nothing was made beside it, the sentinel is unchanged."""
    assert list(root.iterdir()) == []
    assert (root.parent / "sentinel.txt").read_text() == "untouched"
    assert sorted(p.name for p in root.parent.iterdir()) == ["sandbox", "sentinel.txt"]
