"""The run's records: an append-only JSON Lines file that a stopped run resumes from.

Line 1 is the header: {"type": "header", "settings": {...}, "derived": {...}}. `settings` is
everything that decides the results (models' identities, tiers, router, arms asked for, problem
ids, token budget, sandbox limits, seed, prompt version); `derived` is what the run worked out
from them before the first problem (swept thresholds, arm names). Then one record per line:
{"type": "result", "task_id", "arm", …} per problem and arm, and {"type": "positions", "task_id",
…} per problem (the teacher-forced arrays along the top tier's answer), and {"type": "groups
added", "groups", "arms"} where a resumed run asked for more arm groups (read as the header's
`settings.groups` and `derived.arms` from there on). Each line is one write
under an exclusive lock, fsynced before the next, so shards of a run (several processes on
disjoint problems) can append to one file; a torn last line (a crash mid-write) is dropped on
resume.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
from pathlib import Path
from typing import BinaryIO

from ...decoding.mode import MODE_SETTINGS
from ...errors import OutputError, UsageError
from ...json_numbers import json_float
from ...models.sources import EmbeddedSource, model_source
from ...profiles import Profile
from ...resources import user_dir
from ..command import finite

FORMAT = 1
GROUPS_ADDED = "groups added"
# What two runs share for their tiers' answers to be pooled: the same models answering the same
# prompt within the same budget and sandbox. Problems, arms and the router may differ.
POOLED_SETTINGS = (
    "suite",
    "prompt_version",
    "models",
    "gears",
    "tiers",
    "max_tokens",
    "timeout_s",
    "memory_mb",
)
# How this process computes, not what it answers: a run resumes only under the same, but a report
# (which loads no model) reads the records under any.
PROCESS_SETTINGS = ("mlx_blas",)
_FINGERPRINT_BYTES = 1 << 20  # hash the head and tail of big files: a changed model shows there


def model_identity(source: str) -> dict:
    """What names a model across runs: its source, and for local files their sizes and a hash."""
    located = model_source(source)
    if located.known_sha256() is not None:
        return {"source": source, "sha256": located.known_sha256()}
    where = located.local_path()
    if where is None:
        return {"source": source}
    files = sorted(p for p in where.rglob("*") if p.is_file()) if where.is_dir() else [where]
    digest = hashlib.sha256()
    total = 0
    for path in files:
        size = path.stat().st_size
        total += size
        digest.update(f"{path.relative_to(where) if where.is_dir() else path.name}:{size}\n".encode())
        with open(path, "rb") as handle:
            digest.update(handle.read(_FINGERPRINT_BYTES))
            if size > 2 * _FINGERPRINT_BYTES:
                handle.seek(-_FINGERPRINT_BYTES, os.SEEK_END)
                digest.update(handle.read())
    name = "embedded" if isinstance(located, EmbeddedSource) else source
    # Not the install path: a reinstall (another clone, another venv) is the same model and resumes.
    return {"source": name, "bytes": total, "fingerprint": digest.hexdigest()}


def profile_settings(profile: Profile) -> dict:
    """What names a profile's ladder in a records header: its name, its models (by identity), gears,
    tiers, router settings and decoding mode."""
    return {
        "profile": profile.name,
        "models": [model_identity(source) for source in profile.models],
        "gears": list(profile.gears),
        "tiers": list(profile.tier_names()),
        "router": profile.router.settings(json_float),
        "decoding": profile.decoding.settings(),
    }


def default_records_path(suite: str, profile: Profile) -> Path:
    """Where a suite's records for a profile go unless --records says: the user directory's bench
    folder (made here: a fresh machine has none, and a folder the user names must exist), one
    file per suite and ladder."""
    key = hashlib.sha256("\n".join(profile.models + tuple(map(str, profile.gears))).encode()).hexdigest()[:8]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", profile.name).strip("-") or "profile"
    folder = user_dir() / "bench"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{folder}: cannot make the records folder ({exc.strerror or exc})") from None
    return folder / f"{suite}-{slug}-{key}.jsonl"


def _without_install_paths(settings: dict) -> dict:
    """Settings as compared: without the install path older records kept in a model's identity
    (the fingerprint names the files; where they lie does not matter)."""
    models = settings.get("models")
    if not isinstance(models, list):
        return settings
    stripped = [{k: v for k, v in m.items() if k != "path"} if isinstance(m, dict) else m for m in models]
    return {**settings, "models": stripped}


def _mode_apart(settings: dict) -> dict:
    """Settings as compared: with the decoding mode apart from the router's settings, where older
    records kept it (DecodingMode.of_record reads their arms the same way)."""
    router = settings.get("router")
    if "decoding" in settings or not isinstance(router, dict):
        return settings
    mode = {key: router[key] for key in MODE_SETTINGS if key in router}
    kept = {key: value for key, value in router.items() if key not in MODE_SETTINGS}
    return {**settings, "router": kept, "decoding": mode}


def _comparable(settings: dict) -> dict:
    return _mode_apart(_without_install_paths(settings))


def _check(path: Path, header: dict | None, settings: dict, read_only: bool = False) -> None:
    """Refuse a records file of another version, or made with other settings (but for
    PROCESS_SETTINGS, when it is only read). A run may ask for more arm groups than the file
    has: it adds their arms (a report reads the groups as they are)."""
    if header is None:
        return
    if header.get("format") != FORMAT:
        raise UsageError(
            f"--records {path} is not a records file of this version; "
            "pass --restart to start over, or another --records file"
        )
    made = header["settings"]
    if read_only:
        made = {key: value for key, value in made.items() if key not in PROCESS_SETTINGS}
        settings = {key: value for key, value in settings.items() if key not in PROCESS_SETTINGS}
    if not read_only and set(settings.get("groups", [])) > set(made.get("groups", [])):
        made = {**made, "groups": settings["groups"]}  # more arm groups: the run adds their arms
    changed = _differences(_comparable(made), _comparable(settings))
    if changed:
        raise UsageError(
            f"--records {path} was made with other settings ({_listed(changed)}): "
            "pass --restart to start over, or another --records file"
        )


def _listed(changed: list[str]) -> str:
    """The first few differences for an error line."""
    return "; ".join(changed[:4]) + ("; …" if len(changed) > 4 else "")


def _pooled_part(settings: dict) -> dict:
    return {key: settings.get(key) for key in POOLED_SETTINGS}


def _differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key} {_short(a)} → {_short(b)}")
    return out


def _short(value) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "…"


class Records:
    """A records file opened for one run: what is there already, and appending more."""

    def __init__(self, path: Path, header: dict | None, lines: list[dict]):
        self.path = path
        self.header = header
        self.lines = lines
        self._handle: BinaryIO | None = None

    @classmethod
    def open(cls, path: Path, settings: dict, restart: bool = False, read_only: bool = False) -> Records:
        """Read `path` (dropping a torn last line) and check its settings; empty with `restart`.

        `read_only`: leave the file as it is (a run may still be writing its last line).
        """
        path = Path(path).expanduser()
        if not path.parent.is_dir():
            raise OutputError(f"--records {path}: no such directory")
        if restart or not path.exists():
            return cls(path, None, [])
        if read_only:
            header, lines, _ = _read(path, path.read_bytes())
            _check(path, header, settings, read_only=True)
            return cls(path, header, lines)
        with open(path, "r+b") as handle, _locked(handle):
            # Under the lock, another shard's line is whole or not begun.
            header, lines, good_bytes = _read(path, handle.read())
            _check(path, header, settings)
            handle.truncate(good_bytes)  # the torn tail goes, so appends start on a new line
        return cls(path, header, lines)

    @classmethod
    def pooled_with(cls, path: Path, settings: dict, flag: str = "--with-records") -> Records:
        """Another run's records, read only, whose tiers' answers may be pooled with a run of
        `settings`: refused unless both share POOLED_SETTINGS (problems and arms may differ)."""
        path = Path(path).expanduser()
        if not path.is_file():
            raise UsageError(f"{flag} {path}: no such file")
        header, lines, _ = _read(path, path.read_bytes(), flag)
        if header is None or header.get("format") != FORMAT:
            raise UsageError(f"{flag} {path}: not a records file of this version")
        changed = _differences(
            _without_install_paths(_pooled_part(settings)),
            _without_install_paths(_pooled_part(header["settings"])),
        )
        if changed:
            raise UsageError(
                f"{flag} {path} was made with other settings ({_listed(changed)}): only runs of the "
                "same models, prompt, token budget and sandbox pool"
            )
        return cls(path, header, lines)

    def start(self, settings: dict, derived: dict) -> None:
        """Write the header of a new file (replacing whatever was there)."""
        self.header = {"type": "header", "format": FORMAT, "settings": settings, "derived": derived}
        self.lines = []
        try:
            self.path.write_bytes(b"")
        except OSError as exc:
            raise OutputError(f"--records {self.path}: {exc.strerror}") from None
        self._write(self.header)

    def add_groups(self, groups: list[str], arms: list[dict]) -> None:
        """Record that the run now asks for `groups`, whose arms are `arms` (every arm, old ones
        included): the header reads so from here on, and the arms already answered keep their
        records."""
        assert self.header is not None
        self._write({"type": GROUPS_ADDED, "groups": groups, "arms": arms})
        _merge_groups(self.header, groups, arms)

    def append(self, record: dict) -> None:
        """Add one record, on disk (flushed and fsynced) before this returns."""
        self._write(record)
        self.lines.append(record)

    def _write(self, record: dict) -> None:
        if self._handle is None:
            # Held open across records, closed by close(); O_APPEND, so shards never overwrite.
            self._handle = open(self.path, "ab", buffering=0)  # noqa: SIM115
        handle = self._handle
        data = (json.dumps(finite(record), ensure_ascii=False, allow_nan=False) + "\n").encode()
        with _locked(handle):
            written = 0
            while written < len(data):  # one write(2) for a regular file; a short one goes on
                written += os.write(handle.fileno(), data[written:])
            os.fsync(handle.fileno())

    def close(self) -> None:
        """Close the file (records already written stay)."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def results(self) -> dict[tuple[str, str], dict]:
        """The result records by (task id, arm name)."""
        return {(r["task_id"], r["arm"]): r for r in self.lines if r.get("type") == "result"}

    def positions(self) -> dict[str, dict]:
        """The positions records by task id."""
        return {r["task_id"]: r for r in self.lines if r.get("type") == "positions"}


@contextlib.contextmanager
def _locked(handle):
    """An exclusive advisory lock on the records file: one shard reads or appends at a time."""
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _read(path: Path, data: bytes, flag: str = "--records") -> tuple[dict | None, list[dict], int]:
    """The header, the records, and how many bytes of `data` (the file's) hold whole lines.

    `flag` names the option the file came through in an error line; only a run's own
    `--records` file can be started over."""
    remedy = "; pass --restart to start over" if flag == "--records" else ""
    header, lines, good = None, [], 0
    chunks = data.split(b"\n")
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        if not chunk.strip():
            if not last:
                good += len(chunk) + 1
            continue
        try:
            record = json.loads(chunk)
            if last:  # no newline after it: written, but not known to be whole
                raise ValueError("torn")
        except ValueError:
            if last or i == len(chunks) - 2 and not chunks[-1]:
                break  # a torn last line: dropped, and cut off before appending
            raise UsageError(f"{flag} {path}:{i + 1}: not a JSON record{remedy}") from None
        if header is None:
            if record.get("type") != "header":
                raise UsageError(f"{flag} {path}: its first line is no header{remedy}")
            header = record
        elif record.get("type") == GROUPS_ADDED:
            _merge_groups(header, record["groups"], record["arms"])
        else:
            lines.append(record)
        good += len(chunk) + 1
    return header, lines, good


def _merge_groups(header: dict, groups: list[str], arms: list[dict]) -> None:
    header["settings"]["groups"] = groups
    header["derived"]["arms"] = arms
