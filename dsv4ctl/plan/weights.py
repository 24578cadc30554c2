"""Per-rank weight memory of DeepSeek-V4 under SGLang 0.5.23, from safetensors headers.

Two sources, one rule set:

* a local checkpoint folder (``config.json`` + ``*.safetensors``, optionally
  ``model.safetensors.index.json``): the tensors' names, dtypes and shapes are read from the
  safetensors *headers* only (tensor data is never read);
* a shipped model name: the tensor inventory of the published checkpoint, generated from the
  shipped ``config.json`` (:func:`published_inventory`; for DeepSeek-V4-Pro it reproduces the
  checkpoint inspection report's 145,116 tensors and 805.32 GiB exactly), plus a per-rank load
  overhead calibrated on measured ``Load weight end ... mem usage`` logs (:data:`MEASURED`), whose
  error is printed with the estimate.

Either inventory is divided over the ranks as SGLang 0.5.23 shards DeepSeek-V4
(sglang 0.5.23 wheel, ``sglang/srt/models/deepseek_v4.py``, ``deepseek_v2.py``,
``deepseek_v4_nextn.py``, ``srt/layers/attention/dsv4/{compressor,indexer}.py``):

* ``attn_tp`` -- ``wq_b`` (ColumnParallelLinear), ``wo_a`` (ColumnParallelLinear), ``wo_b``
  (RowParallelLinear), all ``parallel_group="attn_tp"`` (``MqaAttentionBase.__init__``): divided
  by the attention-TP size, ``tp / dp`` with DP attention, else ``tp``.
* ``routed`` -- the routed experts (``DeepseekV2MoE.experts``, FusedMoE): EP x MoE-TP = tp, so
  divided by ``tp`` (redundant EP experts, ``--ep-num-redundant-experts``, are not counted).
* ``shared`` -- the shared expert (``DeepseekV2MLP``, ``parallel_group="tp"``): divided by ``tp``,
  replicated (``parallel_group="replicated"``) when an all-to-all MoE backend (``--moe-a2a-backend``
  deepep, mooncake, megamoe, ...) or ``SGLANG_SHARED_EXPERT_TP1`` is on (``deepseek_v2.py``).
* ``embed`` -- ``VocabParallelEmbedding(enable_tp=not is_dp_attention_enabled())``: divided by
  ``tp``, replicated with DP attention. ``head`` -- ``ParallelLMHead``: divided by ``tp`` (by the
  attention-TP size with ``--enable-dp-lm-head``).
* ``replicated`` -- everything else: ``wq_a``/``wkv`` (ReplicatedLinear, fused as ``wqkv_a``),
  norms, ``attn_sink``, the compressor and C4 indexer (ReplicatedLinear / plain parameters), the
  MoE gate and its bias / ``tid2eid`` hash table, the hyper-connection (``hc_*``) parameters.
* PP: a layer's tensors sit on the stage owning it (``get_pp_indices``); the embedding on the first
  stage, the head, final norm and ``hc_head_*`` on the last. The heaviest stage is reported.
* ``draft`` -- the MTP layer (``mtp.N.*`` in the published naming, or ``layers.N`` with
  ``N >= num_hidden_layers``): loaded by ``DeepseekV4ForCausalLMNextN`` only with speculative
  decoding, sharded like a target layer; ``e_proj``/``h_proj`` are ReplicatedLinear. Its embedding
  and head are the target's in the end (``load_weights(is_nextn=True)`` skips ``embed_tokens`` and
  ``shared_head.head``), but ``DeepseekV4ForCausalLMNextN.__init__`` first allocates its own
  ``VocabParallelEmbedding`` (``enable_tp=not is_dp_attention_enabled()``) and ``ParallelLMHead``
  (over the attention-TP group with ``--enable-dp-lm-head``), ``srt/models/deepseek_v4_nextn.py``
  l.67-72 and 275-281, sharded as the target's embed/head. They are held while the pools are sized
  and built (the scheduler calls ``EAGLEWorkerV2.alloc_memory_pool`` after both models load) and
  freed by ``init_lm_head`` -> ``set_embed_and_head`` (``del`` + ``empty_cache``,
  ``srt/speculative/eagle_worker_v2.py`` l.243-258, ``srt/models/deepseek_v4.py`` l.5650-5656)
  right after the draft pool: ``draft_own`` below, counted in the draft weights at KV sizing and
  given back to the headroom after the pools (issue 44.3).

Units: bytes in, GiB (2**30 bytes, what SGLang's "GB" log lines mean) out."""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Optional

from .capacity import GIB, CapacityError, pp_layer_range
from ..errors import InputError

# Bytes per element of the safetensors dtypes (safetensors format spec, ``Dtype``). MXFP4
# experts of the published checkpoint are stored as I8 (two e2m1 values per byte) with F8_E8M0
# scales, so every dtype here is whole bytes; the header's data_offsets decide the size anyway.
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "F8_E4M3FNUZ": 1,
               "F8_E5M2FNUZ": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
               "I64": 8, "U64": 8, "F64": 8, "C64": 8}
# Sub-byte dtypes newer safetensors writers use: bits per element.
DTYPE_BITS = {"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}
# Largest header read (bytes): safetensors itself refuses headers over 100,000,000 bytes.
MAX_HEADER_BYTES = 100_000_000
# Most header bytes read for one checkpoint, all shards together (issue 44 item 5): the published
# Pro checkpoint's 64 headers take about 20 MB; parsed JSON takes several times its size in memory.
MAX_TOTAL_HEADER_BYTES = 512 * 1024 * 1024
# Most shard files read from one folder (the published Pro checkpoint has 64).
MAX_FILES = 4096
INDEX_NAME = "model.safetensors.index.json"


@dataclass(frozen=True)
class Tensor:
    """One tensor as a safetensors header describes it: ``nbytes`` from its data_offsets.
    ``count`` > 1: that many tensors of the same kind stacked into one entry (the published
    inventory's routed experts, :func:`published_inventory` with ``stacked=True``); ``nbytes`` is
    then the total."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    count: int = 1
    file: str = field(default="", compare=False)     # the shard holding it ("" for an inventory)


class HeaderError(InputError):
    """A safetensors file whose header cannot be used (exit 2)."""


def read_header(path: Path) -> list[Tensor]:
    """The tensors of one ``.safetensors`` file, from its header only.

    Format (safetensors spec): 8-byte little-endian unsigned header length N, then N bytes of
    JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, then
    the data. Parsed here directly (8 bytes + JSON; the ``safetensors`` package is not needed).
    Raises :class:`HeaderError` (exit 2) for a short file, a header longer than the file or
    :data:`MAX_HEADER_BYTES`, malformed JSON or entries, and data offsets past the end of the
    file (a truncated download)."""
    return _read_header(path, MAX_HEADER_BYTES)[0]


def _read_header(path: Path, budget: int) -> tuple[list[Tensor], int]:
    """:func:`read_header` and the header's length in bytes; a header longer than ``budget`` (what
    is left of :data:`MAX_TOTAL_HEADER_BYTES` for the checkpoint) is refused before it is read."""
    import struct
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):     # a FIFO or device named *.safetensors would block the read
            raise HeaderError(f"{path}: not a regular file")
        size = st.st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise HeaderError(f"{path}: truncated safetensors file ({size} bytes, no 8-byte header length)")
            (n,) = struct.unpack("<Q", head)
            if n < 2 or n > MAX_HEADER_BYTES:
                raise HeaderError(f"{path}: not a safetensors file (header length {n:,} bytes)")
            if 8 + n > size:
                raise HeaderError(f"{path}: truncated safetensors file (header of {n:,} bytes, file {size:,} bytes)")
            if n > budget:
                raise HeaderError(f"{path}: the checkpoint's safetensors headers take more than "
                                  f"{MAX_TOTAL_HEADER_BYTES:,} bytes together (this one {n:,}): not read")
            raw = f.read(n)
    except OSError as e:
        raise HeaderError(f"{path}: cannot read ({(e.strerror or type(e).__name__).lower()})") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:    # ValueError: JSON, or an int past 4,300 digits
        raise HeaderError(f"{path}: malformed safetensors header ({type(e).__name__}: {str(e)[:120]})") from None
    if not isinstance(doc, dict):
        raise HeaderError(f"{path}: malformed safetensors header (not a JSON object)")
    out: list[Tensor] = []
    data_len = size - 8 - n
    for name, ent in doc.items():
        if name == "__metadata__":
            continue
        out.append(_entry(path, name, ent, data_len))
    return out, n


def _entry(path: Path, name: str, ent, data_len: int) -> Tensor:
    """One header entry, checked: known dtype, shape of non-negative ints, offsets inside the
    data and as long as dtype x shape says."""
    shown = repr(name[:120]) + ("..." if len(name) > 120 else "")     # repr: one line whatever the name holds
    if not isinstance(ent, dict):
        raise HeaderError(f"{path}: malformed safetensors header: {shown}: not an object")
    dtype, shape, offs = ent.get("dtype"), ent.get("shape"), ent.get("data_offsets")
    if not isinstance(dtype, str) or (dtype not in DTYPE_BYTES and dtype not in DTYPE_BITS):
        raise HeaderError(f"{path}: malformed safetensors header: {shown}: unknown dtype {str(dtype)[:40]!r}")
    if (not isinstance(shape, list) or len(shape) > 16
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise HeaderError(f"{path}: malformed safetensors header: {shown}: bad shape {str(shape)[:60]}")
    if (not isinstance(offs, list) or len(offs) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs) or not 0 <= offs[0] <= offs[1]):
        raise HeaderError(f"{path}: malformed safetensors header: {shown}: bad data_offsets {str(offs)[:60]}")
    if offs[1] > data_len:
        raise HeaderError(f"{path}: truncated safetensors file: {shown} ends at byte {offs[1]:,} of the data, "
                          f"which has {data_len:,}")
    numel = 1
    for d in shape:
        numel *= d
    want = numel * DTYPE_BYTES[dtype] if dtype in DTYPE_BYTES else -(-numel * DTYPE_BITS[dtype] // 8)
    if offs[1] - offs[0] != want:
        raise HeaderError(f"{path}: malformed safetensors header: {shown}: {offs[1] - offs[0]:,} bytes for "
                          f"{dtype} {shape} ({want:,} expected)")
    return Tensor(name, dtype, tuple(shape), offs[1] - offs[0], file=path.name)


def is_checkpoint_dir(folder: Path) -> bool:
    """True when ``folder`` holds safetensors shards or their index (a checkpoint, not a bare
    config folder)."""
    try:
        return (folder / INDEX_NAME).is_file() or any(folder.glob("*.safetensors"))
    except OSError:
        return False


def read_checkpoint(folder: Path) -> tuple[Tensor, ...]:
    """Every tensor of a checkpoint folder, from the safetensors headers (tensor data is never
    read). With ``model.safetensors.index.json`` the files it names are read (each must exist),
    else the folder's one ``*.safetensors``. The routed experts of one layer in one shard
    (``...experts.<N>...``, one dtype and shape) come back as one stacked entry, as in
    :func:`published_inventory` with ``stacked=True`` (name with ``*`` for the expert number,
    ``count`` experts, their bytes): the same bytes per rank in a few thousand entries instead of
    145,116. Each shard's header is read once: later plans read its entry in the header cache
    (:func:`_shard_groups`), and the index's in the same way (:func:`_index`). At most
    :data:`MAX_TOTAL_HEADER_BYTES` of headers are read for one checkpoint. Raises InputError
    (exit 2) for a folder without shards, a missing shard, a bad index or header
    (:func:`read_header`), a tensor in two files, or several shards without their index (a
    partial checkpoint, :func:`_partial_without_index`)."""
    index = folder / INDEX_NAME
    if index.exists() and not index.is_file():      # a folder, FIFO or device: refused, never ignored
        raise InputError(f"{index}: not a regular file: a checkpoint's index is a JSON file")
    has_index = index.is_file()
    if has_index:
        names, inames = _index(index)
        bad = [n for n in names if Path(n).name != n]
        if bad:
            raise InputError(f"{index}: weight_map names a file outside the folder: {bad[0][:120]!r}")
        files = [folder / n for n in names]
        missing = [p.name for p in files if not p.is_file()]
        if missing:
            raise InputError(f"{index}: names {len(missing)} missing shard(s), first {missing[0]}")
    else:
        files = sorted(p for p in folder.glob("*.safetensors"))
    if not files:
        raise InputError(f"{folder}: no safetensors headers (no *.safetensors and no {INDEX_NAME}): give "
                         "memory.weights_gib_per_rank or the checkpoint's shards")
    if len(files) > MAX_FILES:
        raise InputError(f"{folder}: {len(files)} safetensors files (at most {MAX_FILES} read)")
    try:
        key = tuple((str(p),) + _identity(p.stat()) for p in files)
    except OSError as e:
        raise InputError(f"{folder}: cannot read a shard ({(e.strerror or type(e).__name__).lower()})") from None
    tensors, seen = _read_files(key)
    if has_index:
        _check_index(index, inames, seen)
    elif len(files) > 1 or any((m := _SHARD_NAME.match(p.name)) and int(m.group(3)) > 1 for p in files):
        # several shards, or one whose name says it is 1 of N > 1: a partial download without its index
        raise InputError(_partial_without_index(folder, files))
    return tensors


_SHARD_NAME = re.compile(r"^(.*)-(\d{1,6})-of-(\d{1,6})\.safetensors$")


def _partial_without_index(folder: Path, files: list[Path]) -> str:
    """The refusal of several shards without ``model.safetensors.index.json``: a sharded
    checkpoint is written with its index, and without it nothing says which shards belong (a
    partial download would be planned on the shards that are there). Names the files and the
    shards their ``-NNNNN-of-MMMMM`` names say are missing."""
    shown = ", ".join(p.name[:80] for p in files[:4]) + (f", ... ({len(files)} files)" if len(files) > 4 else "")
    missing: list[str] = []
    for stem, total in sorted({(m.group(1), m.group(3)) for p in files if (m := _SHARD_NAME.match(p.name))}):
        have = {int(m.group(2)) for p in files if (m := _SHARD_NAME.match(p.name))
                and (m.group(1), m.group(3)) == (stem, total)}
        gone = [i for i in range(1, min(int(total), MAX_FILES) + 1) if i not in have]
        missing += [f"{stem}-{i:0{len(total)}d}-of-{total}.safetensors"[-100:] for i in gone]
    gap = (f"; missing by their names: {', '.join(missing[:3])}" + (f" and {len(missing) - 3} more" if len(missing) > 3
           else "")) if missing else ""
    return (f"{folder}: partial checkpoint: {len(files)} safetensors files ({shown}) and no {INDEX_NAME}{gap}: "
            "download the whole checkpoint with its index (or give memory.weights_gib_per_rank)")


def _layer_of(name: str) -> Optional[tuple[str, int]]:
    """``("layers", N)`` or ``("mtp", N)`` of a decoder-layer tensor name, else None."""
    m = _MTP.match(name)
    if m:
        return "mtp", int(m.group(1))
    m = _LAYER.match(name)
    return ("layers", int(m.group(1))) if m else None


def check_layers(tensors: Iterable[Tensor], num_hidden_layers: int, nextn_layers: int, where: str) -> None:
    """Refuse (InputError, exit 2) shards holding decoder layers the ``config.json`` does not name:
    target layers ``layers.0`` .. ``layers.<L-1>`` (L = ``num_hidden_layers``), MTP layers ``mtp.0``
    .. ``mtp.<n-1>`` or, in the Hugging Face naming, ``layers.<L>`` .. ``layers.<L+n-1>`` (n =
    ``num_nextn_predict_layers``; SGLang 0.5.23 maps ``mtp.j`` to ``layers.<L+j>``). Anything
    beyond would otherwise be counted as a draft layer (or dropped): a config of a smaller model
    than the shards. Names the layers and the files holding them."""
    lays = [(lay, t.file or "?") for t in tensors if (lay := _layer_of(t.name)) is not None]
    # with mtp.* names the MTP layers are those: no layers.<L+j> is one then
    last = num_hidden_layers + (0 if any(k == "mtp" for (k, _), _ in lays) else nextn_layers)
    extra: dict[tuple[str, int], set[str]] = {}
    for (kind, n), f in lays:
        if (kind == "mtp" and n >= nextn_layers) or (kind == "layers" and n >= last):
            extra.setdefault((kind, n), set()).add(f)
    if not extra:
        return
    keys = sorted(extra)
    shown = ", ".join(f"{k}.{n}" for k, n in keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")
    files = sorted({f for v in extra.values() for f in v})
    in_files = ", ".join(f[:80] for f in files[:4]) + (f" and {len(files) - 4} more" if len(files) > 4 else "")
    raise InputError(f"{where}: the shards hold {len(keys)} layer(s) config.json does not name: {shown} (in {in_files}); "
                     f"its num_hidden_layers is {num_hidden_layers} and num_nextn_predict_layers {nextn_layers}: "
                     "a config.json of another model than its shards")


@lru_cache(maxsize=8)
def _read_files(key: tuple[tuple[str, int, int, int, int], ...]) -> tuple[tuple[Tensor, ...], dict]:
    """The tensors of the shards ``key`` names (path and :func:`_identity`: a changed shard is read
    again) and where each name is (:func:`_no_overlap`'s map), cached per process: every group of
    a plan reads the same checkpoint. Refuses a tensor in two files and headers past
    :data:`MAX_TOTAL_HEADER_BYTES` together."""
    seen: dict[tuple, object] = {}
    out: list[Tensor] = []
    budget = MAX_TOTAL_HEADER_BYTES
    for name, *ident in key:
        p = Path(name)
        groups, tensors, read = _shard_groups(p, tuple(ident), budget)
        budget -= read
        _no_overlap(p, groups, seen)
        out += tensors
    return tuple(out), seen


# --- the header cache: per shard, its tensors' names, dtypes and shapes, never data --------------

HEADER_CACHE = "headers"           # <cache>/headers/
HEADER_CACHE_VERSION = 1
MAX_CACHE_ENTRY = 64 * 1024 * 1024
HEADER_CACHE_MAX, HEADER_CACHE_KEEP = 8192, 4096   # entries before a prune, entries kept by it
# an expert number in a tensor name, written as ``int`` writes it (so the name is rebuilt exactly)
_EXPERT = re.compile(r"\.experts\.(0|[1-9][0-9]{0,8})\.")


def _identity(st) -> tuple[int, int, int, int]:
    """A file's identity for the header cache: (device, inode, size, mtime in ns). A rewritten or
    replaced shard has another one (a new inode, size or mtime), so its old entry is not used."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _pack(items: Iterable[tuple[str, object, object]]) -> list[list]:
    """``(name, dtype, shape)`` items (dtype and shape None for an index's names) as groups, in
    first-seen order: ``[name, None, dtype, shape, None]`` for a tensor alone, ``[prefix, suffix,
    dtype, shape, ranges]`` for the names ``prefix + str(N) + suffix`` whose ``N`` (the expert
    number, :data:`_EXPERT`) runs over ``ranges`` (``[[first, last], ...]``, inclusive). Lossless:
    :func:`_names_of` gives back every name."""
    out: list[list] = []
    stacks: dict[tuple, list] = {}
    for name, dtype, shape in items:
        m = _EXPERT.search(name)
        if m is None:
            out.append([name, None, dtype, None if shape is None else list(shape), None])
            continue
        k = (name[:m.start(1)], name[m.end(1):], dtype, None if shape is None else tuple(shape))
        g = stacks.get(k)
        if g is None:
            g = stacks[k] = [k[0], k[1], dtype, None if shape is None else list(shape), []]
            out.append(g)
        g[4].append(int(m.group(1)))
    for g in stacks.values():
        ids, ranges = sorted(set(g[4])), []
        for i in ids:
            if ranges and ranges[-1][1] == i - 1:
                ranges[-1][1] = i
            else:
                ranges.append([i, i])
        g[4] = ranges
    return out


def _nbytes(dtype: str, shape) -> int:
    numel = 1
    for d in shape:
        numel *= d
    return numel * DTYPE_BYTES[dtype] if dtype in DTYPE_BYTES else -(-numel * DTYPE_BITS[dtype] // 8)


def _unpack(groups: list[list], file: str) -> list[Tensor]:
    """:func:`_pack`'s groups of shard ``file`` as tensors: a stacked entry per group of experts."""
    out = []
    for head, tail, dtype, shape, ranges in groups:
        nb = _nbytes(dtype, shape)
        if ranges is None:
            out.append(Tensor(head, dtype, tuple(shape), nb, file=file))
        else:
            k = sum(b - a + 1 for a, b in ranges)
            out.append(Tensor(f"{head}*{tail}", dtype, (k, *shape), nb * k, k, file=file))
    return out


def _valid_groups(groups, header: bool) -> bool:
    """True for a list of :func:`_pack` groups (with a known dtype and a shape when ``header``):
    the entry's shape is checked, not each number (the folder is this user's alone)."""
    if not isinstance(groups, list):
        return False
    for g in groups:
        if not (type(g) is list and len(g) == 5 and type(g[0]) is str and (g[1] is None) == (g[4] is None)
                and (g[4] is None or type(g[4]) is list and type(g[1]) is str)):
            return False
        if header and not ((g[2] in DTYPE_BYTES or g[2] in DTYPE_BITS) and type(g[3]) is list):
            return False
    return True


def _entry_name(prefix: str, ident: tuple[int, int, int, int]) -> str:
    return prefix + "-".join(f"{x:x}" for x in ident) + ".json"


def _cache_get(prefix: str, ident: tuple[int, int, int, int]) -> Optional[dict]:
    """The cache entry of the file with identity ``ident``, or None (absent, untrusted folder, a
    link, too large, another version or identity, malformed)."""
    from ..resources import read_cache_entry
    raw = read_cache_entry(HEADER_CACHE, _entry_name(prefix, ident), MAX_CACHE_ENTRY)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    ok = isinstance(doc, dict) and doc.get("v") == HEADER_CACHE_VERSION and doc.get("id") == list(ident)
    return doc if ok else None


def _cache_put(prefix: str, ident: tuple[int, int, int, int], path: Path, doc: dict) -> None:
    """Keep ``doc`` as the entry of ``path`` when the file still has identity ``ident`` (it did
    not change while it was read); prune the folder past :data:`HEADER_CACHE_MAX` entries."""
    from ..resources import cache_root, prune_files, write_cache_entry
    try:
        if _identity(path.stat()) != ident:
            return
    except OSError:
        return
    raw = json.dumps({"v": HEADER_CACHE_VERSION, "id": list(ident), **doc}, separators=(",", ":")).encode()
    if len(raw) <= MAX_CACHE_ENTRY and write_cache_entry(HEADER_CACHE, _entry_name(prefix, ident), raw):
        folder = cache_root() / HEADER_CACHE
        try:
            if sum(1 for _ in os.scandir(folder)) > HEADER_CACHE_MAX:
                prune_files(folder, HEADER_CACHE_KEEP, "*.json")
        except OSError:
            pass


def _shard_groups(path: Path, ident: tuple[int, int, int, int], budget: int) -> tuple[list[list], list[Tensor], int]:
    """(:func:`_pack` groups of the shard's tensors, them as :func:`_unpack` gives them, header
    bytes read): from the header cache when
    it holds the shard's identity, else from its header (:func:`read_header`, at most ``budget``
    bytes), then kept in the cache: only names, dtypes and shapes."""
    doc = _cache_get("shard-", ident)
    if doc is not None and _valid_groups(doc.get("groups"), header=True):
        try:
            return doc["groups"], _unpack(doc["groups"], path.name), 0
        except (TypeError, ValueError, KeyError):      # numbers that are not numbers: read the header
            pass
    tensors, n = _read_header(path, budget)
    groups = _pack((t.name, t.dtype, t.shape) for t in tensors)
    _cache_put("shard-", ident, path, {"groups": groups})
    return groups, _unpack(groups, path.name), n


def _index(index: Path) -> tuple[list[str], list[list]]:
    """(the shard names ``weight_map`` points at, sorted; its tensor names as :func:`_pack` groups)
    of ``model.safetensors.index.json``, from the header cache when it holds the file's identity.
    InputError (exit 2) for an index that is unreadable, larger than :data:`MAX_HEADER_BYTES` or
    not ``{"weight_map": {name: file}}``."""
    try:
        ident = _identity(index.stat())
    except OSError as e:
        raise InputError(f"{index}: not a readable safetensors index (OSError: {e.strerror})") from None
    doc = _cache_get("index-", ident)
    if (doc is not None and isinstance(doc.get("files"), list) and all(isinstance(f, str) for f in doc["files"])
            and _valid_groups(doc.get("names"), header=False)):
        return doc["files"], doc["names"]
    wmap = _weight_map(index)
    files, names = sorted(set(wmap.values())), _pack((n, None, None) for n in wmap)
    _cache_put("index-", ident, index, {"files": files, "names": names})
    return files, names


def _weight_map(index: Path) -> dict:
    """The ``weight_map`` of an index file (InputError as :func:`_index` says)."""
    try:
        with open(index, "rb") as f:
            raw = f.read(MAX_HEADER_BYTES + 1)
        if len(raw) > MAX_HEADER_BYTES:
            raise ValueError(f"larger than {MAX_HEADER_BYTES:,} bytes")
        doc = json.loads(raw.decode("utf-8"))
        wmap = doc["weight_map"]
        if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
            raise TypeError("weight_map is not an object of file names")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise InputError(f"{index}: not a readable safetensors index ({type(e).__name__}: {str(e)[:120]})") from None
    return wmap


def _no_overlap(path: Path, groups: list[list], seen: dict) -> None:
    """Record shard ``path``'s names in ``seen`` (``(name,)`` -> file; ``(prefix, suffix)`` -> list
    of ``[first, last, file]``); InputError (exit 2) for a tensor already in another file."""
    for head, tail, _, _, ranges in groups:
        if ranges is None:
            other = seen.setdefault((head,), path.name)
            if other != path.name:
                raise InputError(f"{path}: tensor {head[:120]!r} is also in {other}")
            continue
        have = seen.setdefault((head, tail), [])
        for a, b in ranges:
            for a2, b2, other in have:
                if a <= b2 and a2 <= b:
                    raise InputError(f"{path}: tensor {(head + str(max(a, a2)) + tail)[:120]!r} is also in {other}")
        have += [[a, b, path.name] for a, b in ranges]


def _covered(seen: dict, head: str, tail: Optional[str], ranges: Optional[list]) -> bool:
    """True when every name of one :func:`_pack` group is in ``seen`` (:func:`_no_overlap`)."""
    if ranges is None:
        return (head,) in seen
    have = sorted((a, b) for a, b, _ in seen.get((head, tail), ()))
    merged: list[list[int]] = []
    for a, b in have:
        if merged and a <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return all(any(m[0] <= a and b <= m[1] for m in merged) for a, b in ranges)


def _check_index(index: Path, names: list[list], seen: dict) -> None:
    """Refuse (InputError, exit 2) an index whose ``weight_map`` names tensors no shard holds: a
    partial download or another checkpoint's index. Checked on the packed names; the message
    counts them and names the first in the index's order."""
    if all(_covered(seen, head, tail, ranges) for head, tail, _, _, ranges in names):
        return

    def held(name: str) -> bool:
        m = _EXPERT.search(name)
        return _covered(seen, name, None, None) if m is None else _covered(
            seen, name[:m.start(1)], name[m.end(1):], [[int(m.group(1))] * 2])
    absent = [n for n in _weight_map(index) if not held(n)]
    if not absent:
        return
    raise InputError(f"{index}: {len(absent):,} tensor(s) of its weight_map are in no shard's header, first "
                     f"{absent[0][:120]!r}: a partial download or another checkpoint's index")


# --- classification (SGLang 0.5.23's sharding, see the module docstring) ----------------------

_LAYER = re.compile(r"^(?:model\.)?layers\.(\d{1,9})\.")     # 9 digits: no int() of a 5,000-digit name
_MTP = re.compile(r"^(?:model\.)?mtp\.(\d{1,9})\.")


def classify(name: str, num_hidden_layers: int) -> tuple[str, Optional[int], bool]:
    """``(kind, layer, draft)`` of a checkpoint tensor name, published (``layers.3.attn.wq_b.weight``)
    or Hugging Face style (``model.layers.3.self_attn.wq_b.weight``). ``kind`` is one of ``routed``,
    ``shared``, ``attn_tp``, ``embed``, ``head``, ``final`` (last PP stage: final norm,
    ``hc_head_*``), ``replicated``, ``skip`` (the MTP layer's own copy of embedding/head, shared
    with the target); ``layer`` the target layer index (None outside layers); ``draft`` True for the
    MTP layer (SGLang 0.5.23 ``DeepseekV4ForCausalLM.load_weights`` / ``remap_weight_name_to_dpsk_hf_format``)."""
    draft, layer = False, None
    m = _MTP.match(name)
    if m:
        draft = True
        rest = name[m.end():]
    else:
        m = _LAYER.match(name)
        if m:
            layer = int(m.group(1))
            rest = name[m.end():]
            if layer >= num_hidden_layers:       # HF naming of the nextn layer: layers.<L>
                draft, layer = True, None
        else:
            rest = name.removeprefix("model.")
    if draft and re.match(r"(?:emb\.|embed|head\.|shared_head\.head)", rest):
        return "skip", None, True
    if layer is None and not draft:
        if rest.startswith(("embed.", "embed_tokens.")):
            return "embed", None, False
        if rest.startswith(("head.", "lm_head.")) or name.startswith("lm_head."):
            return "head", None, False
        return "final", None, False
    return _layer_kind(rest), layer, draft


@lru_cache(maxsize=8192)
def _layer_kind(rest: str) -> str:
    """The kind of a decoder-layer tensor from its name past ``layers.N.`` / ``mtp.N.`` (the same
    for every layer: computed once per name tail)."""
    rest = rest.replace(".self_attn.", ".attn.").replace(".mlp.", ".ffn.")
    rest = ("attn." + rest[len("self_attn."):]) if rest.startswith("self_attn.") else rest
    rest = ("ffn." + rest[len("mlp."):]) if rest.startswith("mlp.") else rest
    if rest.startswith("ffn.shared_experts."):
        return "shared"
    if rest.startswith("ffn.experts."):
        return "routed"
    if rest.startswith("attn.") and not rest.startswith(("attn.indexer.", "attn.compressor.")):
        leaf = rest[len("attn."):].split(".", 1)[0]
        if leaf in ("wq_b", "wo_a", "wo_b"):
            return "attn_tp"
    return "replicated"


@dataclass(frozen=True)
class Sharding:
    """How SGLang spreads a server over GPUs: ``tp``, ``dp`` with ``dp_attention``, ``pp`` (and
    ``pp_partition``, SGLANG_PP_LAYER_PARTITION), ``shared_replicated`` (an all-to-all MoE backend
    or SGLANG_SHARED_EXPERT_TP1), ``dp_lm_head`` (``--enable-dp-lm-head``)."""

    tp: int = 1
    dp: int = 1
    dp_attention: bool = False
    pp: int = 1
    pp_partition: Optional[tuple[int, ...]] = None
    shared_replicated: bool = False
    dp_lm_head: bool = False

    @property
    def attn_tp(self) -> int:
        """Attention-TP size: ``tp // dp`` with DP attention (SGLang's ``attn_tp_size``), else ``tp``."""
        return max(1, self.tp // self.dp) if self.dp_attention else self.tp

    def divisor(self, kind: str) -> int:
        """Ranks one tensor of ``kind`` is split over (1 = replicated)."""
        if kind == "routed":
            return self.tp
        if kind == "shared":
            return 1 if self.shared_replicated else self.tp
        if kind == "attn_tp":
            return self.attn_tp
        if kind == "embed":
            return 1 if self.dp_attention else self.tp
        if kind == "head":
            return self.attn_tp if self.dp_lm_head else self.tp
        return 1


@dataclass
class RankWeights:
    """Per-rank weight bytes of the heaviest PP stage: ``target`` and ``draft`` (MTP layer), with
    the target's bytes by kind (``by_kind``) and the tensor count and checkpoint bytes read."""

    target: float
    draft: float
    by_kind: dict[str, float] = field(default_factory=dict)
    tensors: int = 0
    checkpoint_bytes: int = 0
    draft_own: float = 0.0    # the draft's own embed + head copies while the pools are built (module docstring)

    @property
    def target_gib(self) -> float:
        """Target weights per rank in GiB."""
        return self.target / GIB

    @property
    def draft_gib(self) -> float:
        """MTP draft weights per rank in GiB as held when SGLang sizes the pools: the MTP layer and
        the draft's own embedding and head copies (freed after the draft pool is built)."""
        return (self.draft + self.draft_own) / GIB


Classes = tuple[tuple[tuple[str, Optional[int], bool], int], ...]


def classes(tensors: Iterable[Tensor], num_hidden_layers: int) -> tuple[Classes, int, int]:
    """``tensors`` summed by :func:`classify`'s ``(kind, layer, draft)``: ``(((kind, layer, draft),
    bytes), ...)`` in first-seen order (``skip`` left out), the tensor count (a stacked entry counts
    ``count``) and the bytes of all of them. What :func:`per_rank` divides; it does not depend on the
    sharding, so one checkpoint's classes serve every group of a plan."""
    by: dict[tuple[str, Optional[int], bool], int] = {}
    n = total = 0
    for t in tensors:
        n += t.count
        total += t.nbytes
        key = classify(t.name, num_hidden_layers)
        if key[0] != "skip":
            by[key] = by.get(key, 0) + t.nbytes
    return tuple(by.items()), n, total


def per_rank(tensors: Iterable[Tensor], num_hidden_layers: int, sharding: Sharding) -> RankWeights:
    """Bytes per GPU rank of ``tensors`` under SGLang 0.5.23's DeepSeek-V4 sharding (module
    docstring): each tensor's bytes divided by the ranks it is split over, summed per PP stage;
    the heaviest stage is returned. Raises InputError when ``sharding.pp_partition`` does not
    fit the layers."""
    return spread(*classes(tensors, num_hidden_layers), num_hidden_layers, sharding)


def spread(cls: Classes, n: int, total: int, num_hidden_layers: int, sharding: Sharding) -> RankWeights:
    """:func:`per_rank` of tensors already summed by :func:`classes` (``n`` tensors, ``total``
    bytes): each class's bytes divided by the ranks its kind is split over, put on the PP stages
    holding it. Raises InputError when ``sharding.pp_partition`` does not fit the layers."""
    pp = sharding.pp
    stages: list[tuple[int, int]] = []
    try:
        for r in range(pp):
            stages.append(pp_layer_range(num_hidden_layers, pp, r, sharding.pp_partition))
    except CapacityError as e:
        raise InputError(str(e)) from None
    per_stage = [dict() for _ in range(pp)]
    draft = 0.0
    for (kind, layer, is_draft), nbytes in cls:
        b = nbytes / sharding.divisor(kind)
        if is_draft:
            draft += b
            continue
        if kind == "embed":
            owners = [0]
        elif kind in ("head", "final"):
            owners = [pp - 1]
        elif layer is None:
            owners = list(range(pp))
        else:
            owners = [r for r, (s, e) in enumerate(stages) if s <= layer < e] or [pp - 1]
        for r in owners:
            per_stage[r][kind] = per_stage[r].get(kind, 0.0) + b
    heavy = max(per_stage, key=lambda d: sum(d.values()))
    own = 0.0
    if draft:   # DeepseekV4ForCausalLMNextN's own VocabParallelEmbedding + ParallelLMHead, target-shaped
        own = sum(nbytes / sharding.divisor(kind) for (kind, _, is_draft), nbytes in cls
                  if not is_draft and kind in ("embed", "head"))
    return RankWeights(target=sum(heavy.values()), draft=draft, by_kind=heavy, tensors=n, checkpoint_bytes=total,
                       draft_own=own)


# --- the published checkpoints -----------------------------------------------------------------

def published_inventory(cfg: dict, expert_format: str = "fp4", *, stacked: bool = False) -> list[Tensor]:
    """The tensors of the published DeepSeek-V4 checkpoint of ``cfg`` (a ``config.json`` dict),
    without data: bf16 embedding/head/norms/compressors, FP8 e4m3 linears with e8m0 [128,128]
    block scales, routed experts as MXFP4 packed in I8 with an e8m0 scale per 32 (``expert_format``
    ``fp4``) or FP8 with [128,128] block scales (``fp8``), fp32 hyper-connection parameters, the
    MTP layer as ``mtp.0``. Layout taken from the DeepSeek-V4-Pro checkpoint inspection report
    (gogongxt/python:``scripts/models/deepseek_v4_pro.md``: 64 files, 145,116 tensors, 805.32 GiB of
    tensors), which this reproduces exactly for the Pro config (tests/test_plan_weights.py).
    ``stacked``: each layer's routed experts as one entry per tensor name (``count`` = experts),
    the same bytes in 1/``n_routed_experts`` of the entries (what the plan uses: fast)."""
    inv = _Inventory(cfg, expert_format, stacked)
    h, v, hc = cfg["hidden_size"], cfg["vocab_size"], cfg.get("hc_mult", 4)
    ratios = list(cfg["compress_ratios"])
    inv.add("embed.weight", "BF16", v, h)
    inv.add("head.weight", "BF16", v, h)
    inv.add("norm.weight", "BF16", h)
    inv.hc_head("")
    for i in range(cfg["num_hidden_layers"]):
        inv.layer(f"layers.{i}", ratios[i] if i < len(ratios) else 0, i < cfg.get("num_hash_layers", 0))
    for j in range(int(cfg.get("num_nextn_predict_layers", 0) or 0)):
        p = f"mtp.{j}"
        inv.layer(p, 0, False)
        inv.fp8(f"{p}.e_proj", h, h)
        inv.fp8(f"{p}.h_proj", h, h)
        for nm in ("enorm", "hnorm", "norm"):
            inv.add(f"{p}.{nm}.weight", "BF16", h)
        inv.hc_head(f"{p}.")
    return inv.out


class _Inventory:
    """Builds :func:`published_inventory`'s list, one decoder layer at a time."""

    def __init__(self, cfg: dict, expert_format: str, stacked: bool) -> None:
        self.cfg, self.fmt, self.stacked = cfg, expert_format, stacked
        self.h, self.hc = cfg["hidden_size"], cfg.get("hc_mult", 4)
        self.out: list[Tensor] = []

    def add(self, name: str, dtype: str, *shape: int, count: int = 1) -> None:
        numel = count
        for d in shape:
            numel *= d
        self.out.append(Tensor(name, dtype, ((count,) if count > 1 else ()) + tuple(shape),
                               numel * DTYPE_BYTES[dtype], count))

    def fp8(self, name: str, rows: int, cols: int, count: int = 1) -> None:
        """An FP8 e4m3 linear and its e8m0 [128,128] block scales."""
        self.add(f"{name}.weight", "F8_E4M3", rows, cols, count=count)
        self.add(f"{name}.scale", "F8_E8M0", -(-rows // 128), -(-cols // 128), count=count)

    def hc_head(self, prefix: str) -> None:
        hc = self.hc
        self.add(f"{prefix}hc_head_base", "F32", hc)
        self.add(f"{prefix}hc_head_fn", "F32", hc, hc * self.h)
        self.add(f"{prefix}hc_head_scale", "F32", 1)

    def layer(self, p: str, ratio: int, hashed: bool) -> None:
        """One decoder layer ``p`` (``layers.N`` or ``mtp.N``) with compress ratio ``ratio``."""
        self.attention(p, ratio)
        self.add(f"{p}.attn_norm.weight", "BF16", self.h)
        self.add(f"{p}.ffn_norm.weight", "BF16", self.h)
        self.ffn(p, hashed)
        mix, hc = (2 + self.hc) * self.hc, self.hc
        for part in ("attn", "ffn"):
            self.add(f"{p}.hc_{part}_base", "F32", mix)
            self.add(f"{p}.hc_{part}_fn", "F32", mix, hc * self.h)
            self.add(f"{p}.hc_{part}_scale", "F32", 3)

    def attention(self, p: str, ratio: int) -> None:
        c, h = self.cfg, self.h
        nh, hd, ql = c["num_attention_heads"], c["head_dim"], c["q_lora_rank"]
        og, ol = c["o_groups"], c["o_lora_rank"]
        idim, iheads = c["index_head_dim"], c["index_n_heads"]
        self.add(f"{p}.attn.attn_sink", "F32", nh)
        self.add(f"{p}.attn.kv_norm.weight", "BF16", hd)
        self.add(f"{p}.attn.q_norm.weight", "BF16", ql)
        self.fp8(f"{p}.attn.wkv", hd, h)
        self.fp8(f"{p}.attn.wo_a", og * ol, nh * hd // og)
        self.fp8(f"{p}.attn.wo_b", h, og * ol)
        self.fp8(f"{p}.attn.wq_a", ql, h)
        self.fp8(f"{p}.attn.wq_b", nh * hd, ql)
        if ratio:
            coff = 2 if ratio == 4 else 1
            self.add(f"{p}.attn.compressor.ape", "F32", ratio, coff * hd)
            self.add(f"{p}.attn.compressor.norm.weight", "BF16", hd)
            self.add(f"{p}.attn.compressor.wgate.weight", "BF16", coff * hd, h)
            self.add(f"{p}.attn.compressor.wkv.weight", "BF16", coff * hd, h)
        if ratio == 4:
            self.add(f"{p}.attn.indexer.compressor.ape", "F32", ratio, 2 * idim)
            self.add(f"{p}.attn.indexer.compressor.norm.weight", "BF16", idim)
            self.add(f"{p}.attn.indexer.compressor.wgate.weight", "BF16", 2 * idim, h)
            self.add(f"{p}.attn.indexer.compressor.wkv.weight", "BF16", 2 * idim, h)
            self.add(f"{p}.attn.indexer.weights_proj.weight", "BF16", iheads, h)
            self.fp8(f"{p}.attn.indexer.wq_b", iheads * idim, ql)

    def ffn(self, p: str, hashed: bool) -> None:
        c, h = self.cfg, self.h
        ne, mi, ns = c["n_routed_experts"], c["moe_intermediate_size"], c.get("n_shared_experts", 1)
        k = ne if self.stacked else 1
        for e in (["*"] if self.stacked else range(ne)):
            for w, (rows, cols) in (("w1", (mi, h)), ("w2", (h, mi)), ("w3", (mi, h))):
                if self.fmt == "fp8":
                    self.fp8(f"{p}.ffn.experts.{e}.{w}", rows, cols, count=k)
                else:
                    self.add(f"{p}.ffn.experts.{e}.{w}.weight", "I8", rows, cols // 2, count=k)
                    self.add(f"{p}.ffn.experts.{e}.{w}.scale", "F8_E8M0", rows, cols // 32, count=k)
        self.add(f"{p}.ffn.gate.weight", "BF16", ne, h)
        if hashed:
            self.add(f"{p}.ffn.gate.tid2eid", "I64", c["vocab_size"], c["num_experts_per_tok"])
        else:
            self.add(f"{p}.ffn.gate.bias", "F32", ne)
        for w, (rows, cols) in (("w1", (mi * ns, h)), ("w2", (h, mi * ns)), ("w3", (mi * ns, h))):
            self.fp8(f"{p}.ffn.shared_experts.{w}", rows, cols)


@dataclass(frozen=True)
class Measured:
    """One measured per-rank weight figure: model, expert format, topology, GiB (SGLang's
    ``Load weight end ... mem usage``), where it comes from, and whether the calibration uses it."""

    model: str
    expert_format: str
    tp: int
    gib: float
    source: str
    calibrates: bool = True


# Measured per-rank target weights (GiB). SGLang's log "GB" divides by 2**30 (reference §1.4).
# InferenceX#2128 = https://github.com/SemiAnalysisAI/InferenceX/issues/2128 (its "FP8" Pro is the
# published checkpoint: SGLang logs "quant=fp8" from its quantization_config, the experts are MXFP4);
# gddezero/b200-perf-opt is the third-party table of the capacity reference §3.3.
MEASURED = (
    Measured("deepseek-v4-pro", "fp4", 8, 103.5,
             "InferenceX#2128 closing comment: 8xH200 TP8, pinned deepseek-v4-hopper image, '~103-104 GB/GPU'"),
    Measured("deepseek-v4-pro", "fp4", 8, 105.57,
             "gddezero/b200-perf-opt 09_deepseek_v4_b200.md: B200 TP8 (GB or GiB not stated)"),
    Measured("deepseek-v4-flash", "fp4", 8, 21.83,
             "gddezero/b200-perf-opt 09_deepseek_v4_b200.md: B200 TP8 (GB or GiB not stated)"),
    Measured("deepseek-v4-pro", "fp4", 8, 125.65,
             "InferenceX#2128: 8xH200 TP8, older deepseek-v4-hopper image, 'Load weight end. quant=fp8 ... "
             "mem usage=125.65 GB' (the image update dropped it to ~103-104)", calibrates=False),
)
# Measured per-rank MTP draft weights (GiB), compared, not calibrated on: the only log is the older
# image's (whose target "mem usage" the table is 16.8 % under). The draft's "mem usage" holds its own
# embedding and head until EAGLE shares the target's (sglang 0.5.23 speculative/eagle_worker_v2.py
# init_lm_head -> set_embed_and_head frees them after the draft pool): counted since issue 44.3,
# Pro TP8 1.73 (MTP layer) + 2 x 1.73 / 8 = 0.43 GiB = 2.16 GiB, -29.6 % against 3.07 (was -43.6 %).
MEASURED_DRAFT = (
    Measured("deepseek-v4-pro", "fp4", 8, 3.07,
             "InferenceX#2128: older deepseek-v4-hopper image, 'DeepseekV4ForCausalLMNextN draft adds mem usage=3.07 GB'",
             calibrates=False),
)
# Per-rank bytes SGLang holds at "Load weight end" beyond the checkpoint's share, fitted to the
# calibrating MEASURED rows (mean residual of the inventory's per-rank bytes): freqs_cis RoPE
# tables (2 cached, 2**20 x 32 complex64 = 0.25 GiB each, kernels/ops/attention/dsv4/rope.py),
# kernel workspaces and padding. Recomputed by tests/test_plan_weights.py.
LOAD_OVERHEAD_GIB = 2.6


@dataclass
class Estimate:
    """A weight estimate: per-rank ``target_gib``/``draft_gib``, the sentences the plan prints, and
    ``fixed_gib``: the part of ``target_gib`` that does not shrink when TP grows (replicated
    tensors, the load overhead; a plan fix rescales the rest)."""

    target_gib: float
    draft_gib: float
    note: str
    draft_note: str
    fixed_gib: float = 0.0
    draft_freed_gib: float = 0.0   # of draft_gib: the draft's own embed + head, freed after the draft pool


def _fixed_gib(rw: RankWeights, sharding: Sharding) -> float:
    """GiB of ``rw``'s target bytes on kinds ``sharding`` does not split (divisor 1)."""
    return sum(b for k, b in rw.by_kind.items() if sharding.divisor(k) == 1) / GIB


def _pct(x: float) -> str:
    return f"{x:+.1f} %"


def _shipped_cfg(key: str) -> dict:
    from ..resources import MODELS_DIR
    return json.loads((MODELS_DIR / f"{key}.json").read_text())


@lru_cache(maxsize=8)
def _shipped_classes(key: str, cfg_json: str, expert_format: str) -> tuple[Classes, int, int]:
    """:func:`classes` of the published inventory (stacked experts), cached per process."""
    cfg = json.loads(cfg_json)
    return classes(published_inventory(cfg, expert_format, stacked=True), cfg["num_hidden_layers"])


@lru_cache(maxsize=64)
def _shipped_rank(key: str, cfg_json: str, expert_format: str, sharding: Sharding) -> RankWeights:
    """:func:`per_rank` of the published inventory (stacked experts), cached per process."""
    layers = json.loads(cfg_json)["num_hidden_layers"]
    return spread(*_shipped_classes(key, cfg_json, expert_format), layers, sharding)


@lru_cache(maxsize=1)
def _calibration() -> tuple[tuple[Measured, float, float], ...]:
    out = []
    for m in MEASURED:
        rw = _shipped_rank(m.model, json.dumps(_shipped_cfg(m.model), sort_keys=True), m.expert_format, Sharding(tp=m.tp))
        w = round(rw.target_gib + LOAD_OVERHEAD_GIB, 3)
        out.append((m, w, (w - m.gib) / m.gib * 100))
    return tuple(out)


def calibration() -> list[tuple[Measured, float, float]]:
    """Every :data:`MEASURED` row with the table's per-rank GiB at its topology (TP only) and the
    relative error in percent, ``(table - measured) / measured * 100``."""
    return list(_calibration())


def shipped_estimate(key: str, cfg: dict, expert_format: str, sharding: Sharding) -> Estimate:
    """Per-rank weights of shipped model ``key`` (config ``cfg``): the published checkpoint's
    inventory (:func:`published_inventory`) sharded as SGLang 0.5.23 does (:func:`per_rank`) plus
    :data:`LOAD_OVERHEAD_GIB`. The note names the source and the error against the measured logs
    (:data:`MEASURED`): those at this very topology, else the calibration's error range."""
    rw = _shipped_rank(key, json.dumps(cfg, sort_keys=True), expert_format, sharding)
    w = round(rw.target_gib + LOAD_OVERHEAD_GIB, 3)
    cal = calibration()
    same = sharding.pp == 1 and not sharding.dp_attention and not sharding.shared_replicated
    here = [(m, e) for m, _, e in cal if same and m.model == key and m.expert_format == expert_format
            and m.tp == sharding.tp]
    if here:
        vs = "; vs measured " + ", ".join(f"{m.gib}{'' if m.calibrates else ' (older image)'}: {_pct(e)}"
                                          for m, e in here)
    else:
        errs = [e for m, _, e in cal if m.calibrates]
        vs = f"; calibrated on {len(errs)} TP8 logs, error {_pct(min(errs))} to {_pct(max(errs))}"
    fmt = "FP4 experts" if expert_format == "fp4" else "FP8 experts"
    top = f"tp {sharding.tp}" + (f" attn-dp {sharding.dp}" if sharding.dp_attention else "") + \
        (f" pp {sharding.pp}" if sharding.pp > 1 else "")
    note = (f"weights_gib_per_rank={w} (published {key} checkpoint, {fmt}: {rw.tensors:,} tensors, "
            f"{rw.checkpoint_bytes / GIB:.2f} GiB, sharded as SGLang 0.5.23 at {top} + {LOAD_OVERHEAD_GIB} GiB "
            f"load overhead{vs}; see dsv4ctl.plan.weights.MEASURED)")
    dw, own = round(rw.draft_gib, 3), round(rw.draft_own / GIB, 3)
    dvs = "".join(f"; vs {m.gib} measured (older image): {_pct((dw - m.gib) / m.gib * 100)}" for m in MEASURED_DRAFT
                  if same and m.model == key and m.expert_format == expert_format and m.tp == sharding.tp)
    return Estimate(w, dw, note, f"draft_weights_gib_per_rank={dw} (the MTP layer of the published {key} "
                                    f"checkpoint, {fmt}, + {own} GiB of the draft's own embedding and head, "
                                    f"freed after its pool, sharded as SGLang 0.5.23 at {top}{dvs})",
                    round(_fixed_gib(rw, sharding) + LOAD_OVERHEAD_GIB, 3), own)


def _nextn_layers(cfg_path: Path) -> int:
    """``num_nextn_predict_layers`` of a ``config.json`` (0 when absent or unreadable: the plan's
    model reader reports an unreadable config)."""
    try:
        n = json.loads(cfg_path.read_text()).get("num_nextn_predict_layers", 0)
    except (OSError, ValueError, AttributeError, RecursionError):
        return 0
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else 0


_CLASSES: dict[tuple[int, int], tuple] = {}
_CHECKED: dict[tuple[int, int, int], tuple] = {}      # the tensors check_layers passed, by (id, layers, nextn)


def _classes_of(tensors: tuple[Tensor, ...], num_hidden_layers: int) -> tuple[Classes, int, int]:
    """:func:`classes` of a checkpoint's tensors (the tuple :func:`read_checkpoint` returns, the
    same object for every group of a plan), computed once per process."""
    hit = _CLASSES.get((id(tensors), num_hidden_layers))
    if hit is not None and hit[0] is tensors:
        return hit[1]
    if len(_CLASSES) >= 16:
        _CLASSES.clear()
    got = classes(tensors, num_hidden_layers)
    _CLASSES[(id(tensors), num_hidden_layers)] = (tensors, got)
    return got


def checkpoint_estimate(folder: Path, num_hidden_layers: int, sharding: Sharding,
                        cfg_path: Optional[Path] = None) -> Estimate:
    """Per-rank weights of a local checkpoint folder, from its safetensors headers
    (:func:`read_checkpoint`) sharded as SGLang 0.5.23 does (:func:`per_rank`), plus the same
    :data:`LOAD_OVERHEAD_GIB` as the shipped table (so the published checkpoint gives the same
    figure by name and as a folder). ``cfg_path``: the ``config.json`` read (default the folder's),
    whose ``num_nextn_predict_layers`` says which layers past ``num_hidden_layers`` are MTP layers.
    Raises InputError (exit 2) for a folder without headers, a truncated/malformed shard, a partial
    checkpoint, or layers the config does not name (:func:`check_layers`)."""
    tensors = read_checkpoint(folder)
    where = f"{folder}" if len(str(folder)) <= 120 else f"...{str(folder)[-117:]}"
    nextn = _nextn_layers(Path(cfg_path or folder / "config.json"))
    if _CHECKED.get((id(tensors), num_hidden_layers, nextn)) is not tensors:    # once per plan, not per group
        check_layers(tensors, num_hidden_layers, nextn, where)
        _CHECKED.clear()
        _CHECKED[(id(tensors), num_hidden_layers, nextn)] = tensors
    rw = spread(*_classes_of(tensors, num_hidden_layers), num_hidden_layers, sharding)
    w, dw, own = round(rw.target_gib + LOAD_OVERHEAD_GIB, 3), round(rw.draft_gib, 3), round(rw.draft_own / GIB, 3)
    top = f"tp {sharding.tp}" + (f" attn-dp {sharding.dp}" if sharding.dp_attention else "") + \
        (f" pp {sharding.pp}" if sharding.pp > 1 else "")
    return Estimate(w, dw,
                    f"weights_gib_per_rank={w} (safetensors headers of {where}: {rw.tensors:,} tensors, "
                    f"{rw.checkpoint_bytes / GIB:.2f} GiB, sharded as SGLang 0.5.23 at {top} + {LOAD_OVERHEAD_GIB} "
                    "GiB load overhead, calibrated on measured logs: dsv4ctl.plan.weights.MEASURED)",
                    f"draft_weights_gib_per_rank={dw} (MTP layer in the safetensors headers of {where} + {own} GiB "
                    f"of the draft's own embedding and head, freed after its pool, sharded as SGLang 0.5.23 at {top})",
                    round(_fixed_gib(rw, sharding) + LOAD_OVERHEAD_GIB, 3), own)


def _env_true(v) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "y", "on")


def sharding_from_args(args: dict, tp: int, dp: int, pp: int, dp_attention: bool,
                       pp_partition: Optional[tuple[int, ...]]) -> Sharding:
    """The :class:`Sharding` of a resolved group: its topology, ``moe_a2a_backend`` (any backend
    but ``none`` replicates the shared expert), ``SGLANG_SHARED_EXPERT_TP1`` and
    ``enable_dp_lm_head`` from the serve config / env / overrides."""
    a2a = str(args.get("moe_a2a_backend") or "none").lower()
    return Sharding(tp=tp, dp=dp, dp_attention=bool(dp_attention), pp=pp, pp_partition=pp_partition,
                    shared_replicated=a2a != "none" or _env_true(args.get("SGLANG_SHARED_EXPERT_TP1", "")),
                    dp_lm_head=bool(args.get("enable_dp_lm_head", False)))


def estimate(facts, cfg_path: Optional[Path], expert_format: str, sharding: Sharding,
             num_hidden_layers: int) -> Optional[Estimate]:
    """The weight estimate for a group: from the checkpoint folder's headers when the model is one
    (``facts.checkpoint_dir``), else from the shipped table (``facts.shipped``), else None (a
    bare ``config.json``: the operator must give ``memory.weights_gib_per_rank``)."""
    ckdir = getattr(facts, "checkpoint_dir", None)
    if ckdir is not None:
        return checkpoint_estimate(Path(ckdir), num_hidden_layers, sharding, cfg_path)
    key = getattr(facts, "shipped", None)
    if key:
        cfg = json.loads(Path(cfg_path).read_text()) if cfg_path is not None else _shipped_cfg(key)
        return shipped_estimate(key, cfg, expert_format, sharding)
    return None


__all__ = ["Tensor", "HeaderError", "read_header", "read_checkpoint", "is_checkpoint_dir", "classify",
           "Sharding", "RankWeights", "classes", "per_rank", "spread", "published_inventory", "Measured", "MEASURED", "MEASURED_DRAFT",
           "LOAD_OVERHEAD_GIB", "Estimate", "calibration", "shipped_estimate", "checkpoint_estimate", "check_layers", "sharding_from_args",
           "estimate"]
