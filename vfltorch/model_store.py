"""Saved models, one shard per party: ``DIR/party-<rank>/manifest.json`` + ``arrays.npz``.

A vertical model is never in one place: each party holds the slice of it that
belongs to its columns (and the active party the coefficients that need the
labels). So a saved model is a directory of shards, one per rank, and each
party writes and reads ONLY its own:

* ``manifest.json``: format and version, the method, the random ``model_id``
  shared by every shard of one training run, this rank and its role, the
  number of parties, whether prediction needs the coordinator, this party's
  global column indices and names, its fitted preprocessing (imputation,
  scaling, clipping; the statistics are in ``arrays.npz``), the public data
  layout (dataset, partition, seed), the hyperparameters prediction needs,
  the label encoding at the active party, the SHA-256 of ``arrays.npz`` and ``mac``:
  an HMAC-SHA256 over the manifest and the arrays together, under the party's
  model key (``model_key``), so that someone who can write the model folder but
  does not hold the party's key cannot change a label, a hyperparameter, a size
  or an array and have it accepted (issue 36);
* ``arrays.npz``: numpy arrays only, read back with ``allow_pickle=False``
  (nothing in a shard is ever unpickled), refused unread if its members would
  inflate beyond their stored size.

The model key. Across organisations it is derived from the party's own federation
identity (its private key, ``--identity``): only that party can write or read its
shards' authentication. On one machine (``--parties Q``, the estimators) it is a
key file kept outside every model folder: ``$VFLTORCH_MODEL_KEY`` if set, else
``~/.config/vfltorch/model.key`` (32 random bytes, mode 0600, made on first save).
A shard saved under another key (another machine, another user) is refused with a
message that says so.

Shards are written atomically (a temporary file beside the target, then
``os.replace``; the manifest last, so a shard with a manifest is complete)
with file mode 0600 in a folder of mode 0700: a party's slice of the model is
as private as its columns. At load time every party checks its own shard
(format, method, hash of the arrays, column count) and the parties compare
their ``model_id`` and method at the active party, so that mismatched or
missing shards stop every party with one clear error (``ModelStoreError``).

Estimators get ``save(path)`` / ``load(path, fed=None)`` from ``ShardedModelMixin``:
each implements ``_shard_state()`` (JSON-able dict, dict of arrays) and
``_restore_shard(manifest, arrays, fed)``.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import os
import shutil
import secrets
from pathlib import Path

import numpy as np

from .devices import to_numpy
from .data.validation import VFLInputError

FORMAT = "vfltorch-model-shard"
FORMAT_VERSION = 2          # 2: manifest and arrays authenticated together (``mac``); 1 had a hash of the arrays only
MANIFEST = "manifest.json"
ARRAYS = "arrays.npz"
MAC_DOMAIN = b"vfltorch/model-shard/v2\0"
KEY_BYTES = 32
# An arrays.npz is written uncompressed (np.savez): its members hold what the file holds. A member that would
# inflate beyond its stored size by more than this slack is a decompression bomb, refused before it is read.
INFLATE_SLACK = 1 << 16


class ModelStoreError(VFLInputError):
    """A saved model cannot be used: a missing, damaged, tampered or mismatched shard."""


def shard_dir(root, rank: int) -> Path:
    return Path(root) / f"party-{int(rank)}"


def new_model_id() -> str:
    return secrets.token_hex(16)


# ------------------------------------------------------------------------------------ the model key
def local_key_path() -> Path:
    env = os.environ.get("VFLTORCH_MODEL_KEY")
    if env:
        return Path(env).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "vfltorch" / "model.key"


def local_model_key(*, create: bool) -> bytes:
    """This machine's (this user's) model key, outside every model folder; made on the first save."""
    path = local_key_path()
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        if not create:
            raise ModelStoreError(f"no model key at {path}: the model was saved on another machine or by another "
                                  f"user (each keeps its shards' key outside the model folder; set "
                                  f"VFLTORCH_MODEL_KEY to the key file it was saved with)") from None
        # Whole or not at all, and the first writer wins: several parties of one machine may save at once.
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(KEY_BYTES))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
        key = path.read_bytes()
    except OSError as exc:
        raise ModelStoreError(f"cannot read the model key {path} ({exc.strerror or exc})") from None
    if len(key) != KEY_BYTES:
        raise ModelStoreError(f"the model key {path} is not {KEY_BYTES} bytes: it was damaged; restore it (models "
                              f"saved under it cannot be read without it)")
    return key


def identity_model_key(identity_path) -> bytes:
    """A party's model key across organisations, derived from its own identity's private key (HMAC as a KDF)."""
    import hmac

    try:
        text = Path(identity_path).read_bytes()
    except OSError as exc:
        raise ModelStoreError(f"cannot read the identity {identity_path} ({exc.strerror or exc})") from None
    start = text.find(b"-----BEGIN")
    private = text[start:] if b"PRIVATE KEY-----" in text else b""
    if not private:
        raise ModelStoreError(f"{identity_path} holds no private key to authenticate model shards with")
    return hmac.new(private, b"vfltorch model shard key v2", hashlib.sha256).digest()


def model_key(fed=None, *, create: bool = False) -> bytes:
    """The key of this party's shards: from its federation identity over TLS links, else the local key file."""
    identity = getattr(getattr(fed, "transport", None), "identity", None)
    if identity is not None:
        return identity_model_key(identity.path)
    return local_model_key(create=create)


def shard_mac(key: bytes, manifest: dict, data: bytes) -> str:
    """HMAC-SHA256 over the manifest (canonical JSON, without ``mac``) and the arrays' bytes."""
    import hmac

    body = {k: v for k, v in manifest.items() if k != "mac"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=_jsonable).encode()
    msg = MAC_DOMAIN + hashlib.sha256(text).digest() + hashlib.sha256(data).digest()
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


# ------------------------------------------------------------------------------------ writing
def _write_bytes_atomic(path: Path, data: bytes) -> None:
    from .runlog import write_atomic

    write_atomic(path, data, mode=0o600)      # readable by the owner only: a shard is a party's secret


def _npz_bytes(arrays: dict) -> bytes:
    buf = io.BytesIO()
    clean = {}
    for k, v in arrays.items():
        a = to_numpy(v)                       # (a tensor on any device, or an array)
        if a.dtype == object:
            raise TypeError(f"model array {k!r} has dtype object: shards hold numeric arrays only")
        clean[k] = a
    np.savez(buf, **clean)
    return buf.getvalue()


def write_shard(root, rank: int, manifest: dict, arrays: dict | None = None, *, key: bytes | None = None) -> Path:
    """Write this rank's shard (arrays first, then the manifest naming their hash and the MAC of both, under
    ``key``: default the local model key); return its folder."""
    key = local_model_key(create=True) if key is None else key
    root_dir = Path(root)
    made_root = not root_dir.exists()
    root_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if made_root:
        os.chmod(root_dir, 0o700)             # the model's folder: as private as its shards
    folder = shard_dir(root, rank)
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    data = _npz_bytes(arrays or {})
    full = {"format": FORMAT, "format_version": FORMAT_VERSION, **manifest, "rank": int(rank),
            "arrays_sha256": hashlib.sha256(data).hexdigest(),
            "saved_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    full = json.loads(json.dumps(full, default=_jsonable))       # what will be read back, for the MAC
    full["mac"] = shard_mac(key, full, data)
    _write_bytes_atomic(folder / ARRAYS, data)
    _write_bytes_atomic(folder / MANIFEST, (json.dumps(full, indent=2, default=_jsonable) + "\n").encode())
    return folder


def _jsonable(v):
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    raise TypeError(f"not JSON-serialisable in a model manifest: {type(v).__name__}")


# ------------------------------------------------------------------------------------ reading
def read_manifest(root, rank: int) -> dict:
    folder = shard_dir(root, rank)
    path = folder / MANIFEST
    if not Path(root).is_dir():
        raise ModelStoreError(f"no saved model at {root}: the folder does not exist (train with --save-model DIR)")
    if not path.is_file():
        raise ModelStoreError(f"the model {root} has no shard for party {rank} ({path} is missing): every party "
                              f"needs its own shard from the same training run")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelStoreError(f"{path} is not a readable model manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ModelStoreError(f"{path} is not a vfltorch model shard")
    if manifest.get("format_version") == 1:
        raise ModelStoreError(f"{path} was saved by an older vfltorch without authentication (shard format 1): "
                              f"anyone who could write the folder could have changed it; train and save it again")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ModelStoreError(f"{path} has shard format version {manifest.get('format_version')}; this vfltorch "
                              f"reads version {FORMAT_VERSION}")
    if manifest.get("rank") != rank:
        raise ModelStoreError(f"{path} is the shard of party {manifest.get('rank')}, found in the folder of "
                              f"party {rank}: shards were moved or renamed")
    return manifest


def read_shard(root, rank: int, *, method=None, key: bytes | None = None, verify: bool = True) -> tuple[dict, dict]:
    """(manifest, arrays) of this rank's shard, checked and authenticated under ``key`` (default: the local model
    key); ``method``: the method(s) the caller can load. ``verify=False`` only where the caller lacks the party's
    key and uses nothing of the shard but its public facts (a launching process across organisations)."""
    manifest = read_manifest(root, rank)
    if method is not None:
        allowed = (method,) if isinstance(method, str) else tuple(method)
        if manifest.get("method") not in allowed:
            raise ModelStoreError(f"{shard_dir(root, rank)} holds a {manifest.get('method')} model, not "
                                  f"{' or '.join(allowed)}")
    path = shard_dir(root, rank) / ARRAYS
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelStoreError(f"cannot read {path} ({exc.strerror or exc})") from None
    if hashlib.sha256(data).hexdigest() != manifest.get("arrays_sha256"):
        raise ModelStoreError(f"{path} does not match its manifest (SHA-256 differs): the shard was modified or "
                              f"damaged after it was saved")
    if verify:
        import hmac

        key = local_model_key(create=False) if key is None else key
        if not isinstance(manifest.get("mac"), str) or not hmac.compare_digest(manifest["mac"],
                                                                               shard_mac(key, manifest, data)):
            raise ModelStoreError(f"{shard_dir(root, rank)} fails its authentication (the MAC over its manifest and "
                                  f"arrays differs): it was changed after it was saved, or saved under another "
                                  f"model key (another machine, user or identity); it is not used")
    _check_inflation(data, path)
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (ValueError, OSError) as exc:
        raise ModelStoreError(f"{path} is not a readable array file ({exc})") from None
    return manifest, arrays


def _check_inflation(data: bytes, path) -> None:
    """Refuse an array file whose members would inflate beyond what it stores (a zip bomb), before reading."""
    import zipfile

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise ModelStoreError(f"{path} is not a readable array file ({exc})") from None
    total = sum(i.file_size for i in infos)
    if total > len(data) + INFLATE_SLACK or any(i.file_size > i.compress_size + INFLATE_SLACK for i in infos):
        raise ModelStoreError(f"{path} would inflate to {total} bytes from {len(data)}: shards are stored "
                              f"uncompressed, so this file was not written by vfltorch; it is not read")


def find_ranks(root) -> list[int]:
    """The ranks whose shards are in ``root`` (what this machine holds; across organisations, one)."""
    folder = Path(root)
    if not folder.is_dir():
        raise ModelStoreError(f"no saved model at {root}: the folder does not exist (train with --save-model DIR)")
    ranks = []
    for p in folder.iterdir():
        if p.name.startswith("party-") and p.name[6:].isdigit() and (p / MANIFEST).is_file():
            ranks.append(int(p.name[6:]))
    if not ranks:
        raise ModelStoreError(f"{root} holds no model shard (no party-<k>/{MANIFEST})")
    return sorted(ranks)


def describe(root) -> dict:
    """The public facts of a saved model from any shard found locally: method, parties, coordinator."""
    m = read_manifest(root, find_ranks(root)[0])
    return {k: m.get(k) for k in ("method", "model_id", "parties", "coordinator", "predict_coordinator",
                                  "data", "hyperparameters")}


def check_local_shards(root, *, complete: bool) -> dict:
    """In the launching process: every shard found under ``root`` is readable, unmodified and of one
    training run; with ``complete`` (all parties local) no rank that prediction needs is missing.
    Returns ``describe(root)``. The parties check again, each its own shard (across organisations
    each machine holds only its own)."""
    ranks = find_ranks(root)
    shards = {r: read_shard(root, r, verify=complete)[0] for r in ranks}
    ids = {r: m.get("model_id") for r, m in shards.items()}
    if len(set(ids.values())) > 1:
        raise ModelStoreError(f"the shards in {root} come from different training runs (model ids differ: "
                              + ", ".join(f"party-{r}: {str(i)[:8]}" for r, i in ids.items())
                              + "): every party needs its shard of the same saved model")
    first = shards[ranks[0]]
    if complete:
        need = list(range(int(first["parties"]))) + ([int(first["parties"])] if first.get("coordinator") else [])
        missing = [r for r in need if r not in shards]
        if missing:
            raise ModelStoreError(f"the model {root} has no shard for "
                                  + ", ".join(f"party {r} (party-{r}/ is missing)" for r in missing)
                                  + ": every party needs its own shard from the same training run")
    return describe(root)


# ------------------------------------------------------------------------------ collectives
def agree_model_id(fed) -> str:
    """A fresh random model id drawn by the active party and told to every rank (coordinator included)."""
    if fed.world_size == 1:
        return new_model_id()
    return fed.broadcast_json(new_model_id() if fed.is_active else None, fed.active)


def settle(fed, error: str | None, ranks=None) -> None:
    """Every rank reports its problem (or None) to the active party; all raise the same error if any failed."""
    if fed.world_size == 1:
        if error:
            raise ModelStoreError(error)
        return
    ranks = list(range(fed.world_size)) if ranks is None else list(ranks)
    reports = fed.gather_json(error, fed.active, ranks=ranks)
    verdict = None
    if fed.is_active:
        found = [f"{fed.name(r)}: {e}" for r, e in zip(ranks, reports) if e]
        verdict = "; ".join(found) or None
    verdict = fed.broadcast_json(verdict, fed.active, ranks=ranks)
    if verdict:
        raise ModelStoreError(verdict)


def save_collective(fed, root, manifest: dict, arrays: dict, ranks=None) -> str:
    """Every rank of ``ranks`` (default: all) writes its shard under one fresh model id; returns the id."""
    ranks = list(range(fed.world_size)) if ranks is None else list(ranks)
    model_id = agree_model_id(fed)
    error = None
    folder = shard_dir(root, fed.rank)
    ours = not os.path.lexists(folder)
    try:
        write_shard(root, fed.rank, {**manifest, "model_id": model_id}, arrays, key=model_key(fed, create=True))
    except (OSError, TypeError, ValueError) as exc:
        error = f"could not write its shard under {root}: {exc}"
    try:
        settle(fed, error, ranks)
    except ModelStoreError:
        # A model with a missing shard is no model, and its party-* folders would block the rerun (preflight):
        # every party removes the folder this save made, the complete ones too.
        if ours:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    return model_id


def load_collective(fed, root, *, method=None, ranks=None) -> tuple[dict, dict]:
    """Read this rank's shard; the parties compare model id, method and party count; all fail alike."""
    ranks = list(range(fed.world_size)) if ranks is None else list(ranks)
    manifest, arrays, error = None, None, None
    try:
        manifest, arrays = read_shard(root, fed.rank, method=method, key=model_key(fed))
        if manifest.get("parties") != fed.num_parties:
            error = (f"the model was trained by {manifest.get('parties')} data parties, this federation has "
                     f"{fed.num_parties}: start as many parties as in training")
    except ModelStoreError as exc:
        error = str(exc)
    facts = None if manifest is None else [manifest.get("model_id"), manifest.get("method")]
    if fed.world_size == 1:
        if error:
            raise ModelStoreError(error)
        return manifest, arrays
    reports = fed.gather_json({"error": error, "facts": facts}, fed.active, ranks=ranks)
    verdict = None
    if fed.is_active:
        errors = [f"{fed.name(r)}: {rep['error']}" for r, rep in zip(ranks, reports) if rep["error"]]
        if not errors:
            ids = {r: rep["facts"][0] for r, rep in zip(ranks, reports)}
            methods = {rep["facts"][1] for rep in reports}
            if len(set(ids.values())) > 1:
                errors.append("the shards come from different training runs (model ids differ: "
                              + ", ".join(f"{fed.name(r)}: {i[:8]}" for r, i in ids.items())
                              + "); every party must load its shard of the same saved model")
            elif len(methods) > 1:
                errors.append(f"the shards hold different methods ({', '.join(sorted(map(str, methods)))})")
        verdict = "; ".join(errors) or None
    verdict = fed.broadcast_json(verdict, fed.active, ranks=ranks)
    if verdict:
        raise ModelStoreError(verdict)
    return manifest, arrays


# ---------------------------------------------------------------------------------- estimators
def role_of(fed) -> str:
    if fed.is_coordinator:
        return "coordinator"
    return "active" if fed.is_active else "passive"


class ShardedModelMixin:
    """``save(path)`` / ``load(path, fed=None)`` for an estimator, one shard per party.

    In a federation both are collective: every party (and the coordinator, where
    the method has one) calls them with the same folder. Centralised (``fed``
    None), the model is one shard, ``party-0``. The estimator provides
    ``_model_method`` (a name), ``_shard_state()`` -> (dict, arrays) and
    ``_restore_shard(manifest, arrays, fed)``; its ``get_params()`` (without
    ``fed``) are stored as the hyperparameters.
    """

    _model_method = "estimator"

    def _model_fed(self):
        from .comm import Federation

        fed = getattr(self, "fed", None)
        return fed if fed is not None else getattr(self, "_fed", None) or Federation.local("cpu")

    def save(self, path, fed=None, *, extra: dict | None = None, extra_arrays: dict | None = None):
        """Write this party's shard of the fitted model under ``path`` (collective in a federation).

        ``fed``: only for estimators that take the federation in ``fit`` (PCA); the others know theirs."""
        fed = fed if fed is not None else self._model_fed()
        state, arrays = self._shard_state()
        if fed.is_active and getattr(self, "classes_", None) is not None:
            # The label encoding (what predict returns), at the party that holds the labels only.
            state["classes"] = [v.item() if hasattr(v, "item") else v for v in np.asarray(self.classes_).tolist()]
        params = {k: v for k, v in self.get_params(deep=False).items() if k != "fed"}
        manifest = {"method": self._model_method, "estimator": type(self).__name__,
                    "vfltorch_version": _version(), "role": role_of(fed), "parties": fed.num_parties,
                    "coordinator": fed.coordinator is not None,
                    "predict_coordinator": bool(state.pop("predict_coordinator", False)),
                    "hyperparameters": _json_params(params), "state": state, **(extra or {})}
        self.model_id_ = save_collective(fed, path, manifest, {**arrays, **(extra_arrays or {})})
        return self

    @classmethod
    def load(cls, path, fed=None):
        """This party's estimator from its shard under ``path`` (collective in a federation)."""
        from .comm import Federation

        fed_ = fed if fed is not None else Federation.local("cpu")
        manifest, arrays = load_collective(fed_, path, method=cls._model_method)
        if manifest.get("estimator") not in (None, cls.__name__):
            raise ModelStoreError(f"{path} holds a {manifest.get('estimator')}, not a {cls.__name__}")
        return restore_estimator(cls, manifest, arrays, fed_)


def restore_estimator(cls, manifest: dict, arrays: dict, fed):
    """An estimator of class ``cls`` with the shard's hyperparameters and learned state, for ``fed``."""
    params = dict(manifest.get("hyperparameters", {}))
    names = cls._get_param_names()
    if "fed" in names:
        params["fed"] = fed if fed.world_size > 1 else None
    est = cls(**{k: v for k, v in params.items() if k in names})
    est._restore_shard(manifest, arrays, fed)
    if "classes" in manifest.get("state", {}):
        est.classes_ = np.asarray(manifest["state"]["classes"])
    est.model_id_ = manifest["model_id"]
    return est


def _json_params(params: dict) -> dict:
    out = {}
    for k, v in params.items():
        if v is None or isinstance(v, (bool, int, float, str)):
            out[k] = v
        elif isinstance(v, (list, tuple)) and all(isinstance(x, (bool, int, float, str)) for x in v):
            out[k] = list(v)
        else:
            out[k] = str(v)
    return out


def _version() -> str:
    from . import __version__

    return __version__
