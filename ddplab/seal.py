"""A checkpoint is read only as this lab wrote it, unchanged.

Reading a DCP checkpoint can run code: torch's `FileSystemReader.read_metadata` unpickles
`checkpoint/.metadata`, and DCP loads its byte items with `torch.load(weights_only=False)`. So a
checkpoint that someone else made, or changed, would run whatever it holds in every rank that resumes
from it. The lab therefore seals what it writes and reads only what it sealed:

- **Seal** (`seal`, called by rank 0 of a saving run once every rank has written its part): the SHA-256
  of every file under the checkpoint folder and of the run's spec.json (so the checkpoint belongs to
  that run: its world size, its step), and an HMAC-SHA256 of that list under a key that only this
  account holds (`key_file()`: `$DDPLAB_KEY_FILE`, else `~/.config/ddplab/checkpoint.key`; made on first
  use, 32 random bytes, mode 0600). It goes to `checkpoint.seal.json` beside the folder, in the run
  directory.
- **Verify** (`verify`): the seal's HMAC under this account's key, then every file's digest, with no
  file added or missing. Anything else is a ValueError naming the file and why. It runs in full once in
  the launcher, before anything starts, and once per node in the ranks, on a private copy that the
  ranks then load from (`rank/tasks/resume.py`), so nothing can change the files between the check and
  the read. Building a resume Experiment checks it in full too (a clear error as early as can be),
  except in a rank, which rebuilds the spec the launcher checked: there `digests=False` checks the
  seal and the file names only, so W ranks do not hash the checkpoint W more times.

A copy or a move of the saving run still verifies (the seal names files relative to the folder); a
checkpoint from another account or machine does not (another key), whatever its own seal says. On
several nodes every rank needs the same key: point `$DDPLAB_KEY_FILE` at a file on the shared file
system. Pure: no torch.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

SEAL = "checkpoint.seal.json"
_VERSION = "ddplab-checkpoint-seal-1"


def key_file() -> Path:
    env = os.environ.get("DDPLAB_KEY_FILE")
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "ddplab" / "checkpoint.key"


def _read_key(path: Path) -> bytes:
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ValueError(f"{path}, the checkpoint key, must belong to this account and be readable by it alone "
                         f"(chmod 600 {path}): anyone who can read it can seal a checkpoint that runs code here")
    text = path.read_text().strip()
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise ValueError(f"{path} is not a ddplab checkpoint key (64 hex digits); delete it to make a new one "
                         f"(checkpoints sealed with the old one will then be refused)")
    return bytes.fromhex(text)


def _key(create: bool) -> bytes:
    path = key_file()
    if path.is_file():
        return _read_key(path)
    if path.exists():
        raise ValueError(f"{path}, the checkpoint key, is not a file")
    if not create:
        raise ValueError(f"this account has no checkpoint key ({path}), so no checkpoint here was sealed by it; "
                         f"on several nodes, point $DDPLAB_KEY_FILE at one key on the shared file system")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    try:
        os.link(tmp, path)          # atomic, and never over a key another process made meanwhile
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return _read_key(path)


def check_key() -> None:
    """ValueError now if the key that will seal a checkpoint is there but unusable (another account's, readable
    by others, not a key): a saving run checks it before it trains, not when it seals. A missing key is
    made when first used."""
    path = key_file()
    try:
        if path.is_file():
            _read_key(path)
        elif path.exists() or path.is_symlink():
            raise ValueError(f"{path}, the checkpoint key, is not a file")
    except OSError as e:
        raise ValueError(f"{path}, the checkpoint key, cannot be read ({e.strerror or e})") from None


def seal_file(run_dir) -> Path:
    return Path(run_dir) / SEAL


def _digests(folder: Path) -> dict[str, str]:
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_symlink():
            raise ValueError(f"{p} is a symbolic link; a checkpoint holds plain files only")
        if p.is_file():
            h = hashlib.sha256()
            with p.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            out[p.relative_to(folder).as_posix()] = h.hexdigest()
        elif not p.is_dir():
            raise ValueError(f"{p} is not a plain file; a checkpoint holds plain files only")
    return out


def _names(folder: Path) -> list[str]:
    """The files under `folder`, as `_digests` names them, without reading any."""
    out = []
    for p in sorted(folder.rglob("*")):
        if p.is_symlink():
            raise ValueError(f"{p} is a symbolic link; a checkpoint holds plain files only")
        if p.is_file():
            out.append(p.relative_to(folder).as_posix())
        elif not p.is_dir():
            raise ValueError(f"{p} is not a plain file; a checkpoint holds plain files only")
    return out


def _mac(key: bytes, files: dict[str, str]) -> str:
    msg = _VERSION + "\n" + json.dumps(files, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, msg.encode(), hashlib.sha256).hexdigest()


def _sealed(run_dir, folder: Path) -> dict[str, str]:
    """Every checkpoint file's digest, and the run's spec.json as `../spec.json`: a checkpoint is sealed to
    the run that wrote it (its world size, its save_at), so one moved into another run is refused too."""
    files = _digests(folder)
    spec = Path(run_dir) / "spec.json"
    files["../spec.json"] = hashlib.sha256(spec.read_bytes()).hexdigest() if spec.is_file() else "missing"
    return files


def sign(run_dir, folder) -> Path:
    """Seal the checkpoint `folder` of the run in `run_dir` as it is now (see the module docstring)."""
    files = _sealed(run_dir, Path(folder))
    out = seal_file(run_dir)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps({"version": _VERSION, "files": files, "hmac": _mac(_key(create=True), files)},
                              indent=1))
    os.replace(tmp, out)
    return out


def verify(run_dir, folder, read_from=None, digests: bool = True) -> None:
    """ValueError unless `folder` is exactly what this account's lab sealed in `run_dir`: or, given
    `read_from`, unless that copy of `folder` is. With digests=False only the seal and the file names
    are checked (no file is read)."""
    folder, sf = Path(folder), seal_file(run_dir)
    why = ("ddplab reads only a checkpoint it wrote itself and that nobody changed since: loading one "
           "unpickles its files, which can run code")
    if not sf.is_file():
        raise ValueError(f"{sf} is missing: this checkpoint was not sealed by ddplab when it was written; {why}. "
                         f"Run the saving run again here")
    try:
        d = json.loads(sf.read_text())
        files, mac = d["files"], d["hmac"]
        ok = (isinstance(files, dict) and isinstance(mac, str)
              and all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()))
    except (ValueError, KeyError, TypeError, RecursionError):
        ok = False
    if not ok:
        raise ValueError(f"{sf} is not a ddplab checkpoint seal; {why}")
    if not hmac.compare_digest(_mac(_key(create=False), files), mac):
        raise ValueError(f"{sf} was not made with this account's checkpoint key ({key_file()}): the checkpoint "
                         f"comes from another account or machine, or its seal was edited; {why}. Run the "
                         f"saving run again here")
    if not digests:
        now = {k: files.get(k, "") for k in _names(folder)} | {"../spec.json": files.get("../spec.json", "")}
    else:
        now = _sealed(run_dir, Path(read_from) if read_from is not None else folder)
    changed = sorted(set(files) ^ set(now)) + sorted(k for k in set(files) & set(now) if files[k] != now[k])
    if changed:
        what = ", ".join(f"{folder / k} ({'added' if k not in files else 'missing' if k not in now else 'changed'})"
                         for k in changed[:4])
        raise ValueError(f"the checkpoint differs from what its saving run sealed: {what}"
                         f"{' ...' if len(changed) > 4 else ''}; {why}")
